"""Targets: what the compiler compiles for, and the facts about it that lowering needs.

A `Target` names a back end (``kind``), the storage scopes a schedule may
use on it, and the type each scope stores a tensor in. Its stage list — the
ordered steps from the lowered `PrimFunc` to a runnable artefact — is
`gemforge.compiler.backends.stages(target)`.

- `AccelTarget`: the accelerator of an `AccelConfig` (scopes ``inp``,
  ``wgt``, ``acc``); artefact: a `Program`;
- `CpuTarget`: this machine's CPU through LLVM (scope ``local``: a
  function-local array, registers after optimization); artefact: JIT-compiled
  native code;
- `GpuTarget`: an NVIDIA GPU through LLVM's NVPTX back end (scopes
  ``shared``, ``local``); artefact: PTX, run through the CUDA driver.

`target_of` turns what users write (``"cpu"``, ``"gpu:sm_90"``, a preset
name, a config) into a target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gemforge.hw.config import AccelConfig, load_config

from .errors import CompileError

__all__ = ["Target", "AccelTarget", "CpuTarget", "GpuTarget", "target_of", "named_cpu", "CPU_LEVELS", "ACCEL_ON_CHIP_SCOPES",
           "GPU_ARCHS", "TargetError"]

#: The accelerator's on-chip buffers that schedules place stages in (the output
#: buffer mirrors the accumulator and is chosen by the back end).
ACCEL_ON_CHIP_SCOPES = ("inp", "wgt", "acc")
#: NVIDIA architectures the GPU back end generates PTX for.
GPU_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90")

#: The x86-64 micro-architecture levels of the System V psABI, as LLVM's CPU names and the
#: features each guarantees (`named_cpu`): the targets a model's host kernels may be compiled for
#: ahead of time to run on any machine of that level (`gemforge compile --cpu`).
_X86_64 = ("64bit", "cmov", "cx8", "fxsr", "mmx", "sse", "sse2")
_V2 = _X86_64 + ("cx16", "sahf", "popcnt", "sse3", "sse4.1", "sse4.2", "ssse3")
_V3 = _V2 + ("avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave")
_V4 = _V3 + ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
CPU_LEVELS = {"x86-64": _X86_64, "x86-64-v2": _V2, "x86-64-v3": _V3, "x86-64-v4": _V4}


class TargetError(CompileError):
    """An unknown or malformed target."""


class Target:
    """Base of the compilation targets."""

    kind: ClassVar[str] = "abstract"
    scopes: ClassVar[tuple[str, ...]] = ("global",)

    def storage_dtype(self, scope: str, dtype: str) -> str:
        """The type a tensor of ``dtype`` is stored as in ``scope`` (default: itself)."""
        return dtype


@dataclass(frozen=True)
class AccelTarget(Target):
    """The accelerator described by ``config``; ``uop_budget`` caps the micro-ops one
    instruction's kernel unrolls (default: from the config)."""

    config: AccelConfig
    uop_budget: int | None = None

    kind: ClassVar[str] = "accel"
    scopes: ClassVar[tuple[str, ...]] = ("global",) + ACCEL_ON_CHIP_SCOPES

    def storage_dtype(self, scope: str, dtype: str) -> str:
        # The accumulator holds every value at its own width; the output buffer
        # mirrors the low bits for narrower results.
        return f"int{self.config.acc_width}" if scope == "acc" else dtype


@dataclass(frozen=True)
class CpuTarget(Target):
    """This machine's CPU: LLVM's name for it and its features (``host``: detected),
    and the threads parallel loops run on (0: one per core)."""

    cpu: str = "host"
    features: str = "host"
    threads: int = 0

    kind: ClassVar[str] = "cpu"
    scopes: ClassVar[tuple[str, ...]] = ("global", "local")

    def __post_init__(self) -> None:
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 0:
            raise TargetError(f"cpu threads must be a non-negative integer (0: all cores), not {self.threads!r}")


@dataclass(frozen=True)
class GpuTarget(Target):
    """An NVIDIA GPU of architecture ``arch`` (PTX through LLVM's NVPTX back end)."""

    arch: str = "sm_80"

    kind: ClassVar[str] = "gpu"
    scopes: ClassVar[tuple[str, ...]] = ("global", "shared", "local")

    def __post_init__(self) -> None:
        if self.arch not in GPU_ARCHS:
            raise TargetError(f"GPU architecture {self.arch!r} is not supported; choose one of {', '.join(GPU_ARCHS)}")


def named_cpu(name: str, threads: int = 0) -> CpuTarget:
    """The CPU target ``name`` names: ``host`` (this machine's CPU and features) or an x86-64 level
    (`CPU_LEVELS`: its LLVM CPU name and exactly the features the level guarantees)."""
    if name == "host":
        return CpuTarget(threads=threads)
    if name not in CPU_LEVELS:
        raise TargetError(f"--cpu takes host or an x86-64 level ({', '.join(CPU_LEVELS)}), not {name!r}")
    return CpuTarget(name, ",".join(f"+{f}" for f in CPU_LEVELS[name]), threads)


def target_of(spec: Target | AccelConfig | str | None) -> Target:
    """A target from a `Target`, an `AccelConfig`, ``"cpu"``, ``"gpu"`` / ``"gpu:sm_90"``,
    or an accelerator preset name or config file (None: the default accelerator)."""
    if isinstance(spec, Target):
        return spec
    if isinstance(spec, AccelConfig) or spec is None:
        return AccelTarget(load_config(spec))
    if isinstance(spec, str):
        if spec == "cpu":
            return CpuTarget()
        if spec == "gpu" or spec.startswith("gpu:"):
            return GpuTarget(spec.split(":", 1)[1]) if ":" in spec else GpuTarget()
        return AccelTarget(load_config(spec))
    raise TargetError(f"cannot make a target of {spec!r}: give 'cpu', 'gpu[:sm_XX]', a preset or a config")
