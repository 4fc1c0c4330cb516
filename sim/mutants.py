"""Deliberately broken gateware, to check that the regression catches real bugs.

A mutant replaces one gateware component while the Verilog is generated; its
builds are cached apart from the real ones (`harness.build`'s ``variant``). Run
``gemforge regress --mutant NAME``: the regression must report mismatches,
locate them and shrink them (the test suite asserts it does), which tells a user
that the random programs reach the part of the design the mutation breaks.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from amaranth import Cat, Module, Mux

__all__ = ["MUTANTS", "Mutant", "applied"]


@dataclass(frozen=True)
class Mutant:
    name: str
    description: str
    #: Installs the mutation; returns a function that removes it.
    install: Callable[[], Callable[[], None]]

    @property
    def variant(self) -> str:
        """The build-cache variant of gateware with this mutation."""
        return f"mutant-{self.name}"


def _alu_min_unsigned() -> Callable[[], None]:
    from gemforge.hw.gateware import pipeline
    from gemforge.hw.gateware.alu import TensorAlu
    from gemforge.hw.gateware.gemm import lanes
    from gemforge.hw.isa import AluOp

    class MinComparesUnsigned(TensorAlu):
        def elaborate(self, platform):
            m = Module()
            c = self._config
            m.submodules.correct = correct = TensorAlu(c)
            m.d.comb += [correct.op.eq(self.op), correct.a.eq(self.a), correct.b.eq(self.b), correct.lt.eq(self.lt),
                         correct.mul_a.eq(self.mul_a), correct.mul_b.eq(self.mul_b),
                         self.result.eq(correct.result), self.product.eq(correct.product)]
            n, w = c.batch * c.block_out, c.acc_width
            with m.If(self.op == AluOp.MIN):
                m.d.comb += self.result.eq(Cat(*(Mux(a < b, a, b)
                                                 for a, b in zip(lanes(self.a, n, w), lanes(self.b, n, w)))))
            return m

    original = pipeline.TensorAlu
    pipeline.TensorAlu = MinComparesUnsigned

    def remove() -> None:
        pipeline.TensorAlu = original
    return remove


MUTANTS: dict[str, Mutant] = {m.name: m for m in [
    Mutant("alu-min-unsigned", "the tensor ALU's MIN compares its operands as unsigned numbers",
           _alu_min_unsigned),
]}


@contextmanager
def applied(name: str) -> Iterator[Mutant]:
    """Generate gateware with mutant ``name`` inside the block."""
    try:
        mutant = MUTANTS[name]
    except KeyError:
        raise ValueError(f"unknown mutant {name!r}; known: {', '.join(MUTANTS)}") from None
    remove = mutant.install()
    try:
        yield mutant
    finally:
        remove()
