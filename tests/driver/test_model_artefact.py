"""The .gfm artefact as it is loaded: a file whose programs were changed after compiling, one
that would unpack beyond what its manifest describes, or one whose manifest is inconsistent is
refused with one sentence before anything runs; an intact one runs on fsim as on the CPU."""

from __future__ import annotations

import dataclasses
import io
import json
import struct
import tracemalloc
import zipfile

import numpy as np
import pytest

from gemforge.driver.tools.cli import main
from gemforge.driver.runtime.model import Model, ModelError, compile_model
from gemforge.hw.isa import Load, MemType, Store
from gemforge.hw.program import Program, TensorRegion, arena_alignment
from onnx_models import small_cnn

CHANGED = "the file was changed after compiling"


@pytest.fixture(scope="module")
def tiny_model() -> tuple[bytes, np.ndarray]:
    """A small int8 CNN for the tiny config (four convolutions — the classifier's dense layer one
    over its 1×1 image —, a residual add, a max pool and two average pools on the accelerator,
    tensors handed over in device DRAM), as .gfm bytes, and an input."""
    rng = np.random.default_rng(48)
    samples = rng.normal(size=(3, 1, 3, 4, 4)).astype(np.float32)
    model = compile_model(small_cnn(rng, channels=4, image=4), quantize="int8", calibrate=samples, config="tiny")
    assert [n.op for n in model.graph.nodes if n.device == "accel"] == ["conv2d", "conv2d", "add", "max_pool",
                                                                          "conv2d", "avg_pool", "avg_pool", "conv2d"]
    assert model.net.plan.handovers >= 1
    return model.to_bytes(), rng.normal(size=(1, 3, 4, 4)).astype(np.float32)


def _members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {name: z.read(name) for name in z.namelist()}


def _zip(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, content in files.items():
            z.writestr(name, content)
    return out.getvalue()


def _edit_manifest(data: bytes, edit) -> bytes:
    files = _members(data)
    manifest = json.loads(files["manifest.json"])
    edit(manifest)
    files["manifest.json"] = json.dumps(manifest).encode()
    return _zip(files)


def _edit_program(data: bytes, edit, node: str = "conv1") -> bytes:
    """The model with ``node``'s program file rewritten by ``edit(bytes) -> bytes``."""
    files = _members(data)
    member = json.loads(files["manifest.json"])["layers"][node]["program"]
    files[member] = edit(files[member])
    return _zip(files)


def _edit_program_of(node: str, edit):
    """An edit of a model's bytes: ``node``'s program rewritten by ``edit``."""
    return lambda data: _edit_program(data, edit, node)


def _header(edit):
    """An edit of a .gfp file's JSON header (``edit(header)``), its other bytes kept."""
    def rewrite(raw: bytes) -> bytes:
        version, length = struct.unpack_from("<II", raw, 8)
        header = json.loads(raw[16:16 + length])
        edit(header)
        head = json.dumps(header, sort_keys=True).encode()
        return raw[:8] + struct.pack("<II", version, len(head)) + head + raw[16 + length:]
    return rewrite


def _program(edit):
    """An edit of the decoded program (``edit(program)``, in place), written back."""
    def rewrite(raw: bytes) -> bytes:
        program = Program.from_bytes(raw)
        edit(program)
        return program.to_bytes()
    return rewrite


def _regions(header) -> dict[str, dict]:
    return {r["name"]: r for r in header["tensors"]}


def _shift_region(name: str, by: int):
    def edit(header):
        _regions(header)[name]["offset"] += by
    return edit


def _move_to_arena_end(name: str):
    """``name``'s region moved to a block of its own added at the arena's end (aligned)."""
    def edit(header):
        header["arena_bytes"] += 4096             # the tiny config's arena alignment
        _regions(header)[name]["offset"] = header["arena_bytes"] - 4096
    return edit


def _swap_regions(a: str, b: str):
    def edit(header):
        ra, rb = _regions(header)[a], _regions(header)[b]
        ra["offset"], rb["offset"] = rb["offset"], ra["offset"]
    return edit


def _nudge(kind, mem: MemType | None = None):
    """The first LOAD (of ``mem``) or STORE moved one entry on in DRAM."""
    def edit(program):
        index = next(i for i, insn in enumerate(program.instructions)
                     if isinstance(insn, kind) and (mem is None or insn.mem == mem))
        insn = program.instructions[index]
        program.instructions[index] = dataclasses.replace(insn, dram_base=insn.dram_base + 1)
    return edit


def _add_region(name: str, fill: int | None):
    """A region ``name`` of 16 bytes in a block added at the arena's end, with a constant of
    ``fill`` (or none)."""
    def edit(program):
        region = TensorRegion(name, program.arena_bytes, (1, 16), "int8")
        program.arena_bytes += arena_alignment(program.config)
        program.tensors[name] = region
        if fill is not None:
            program.constants[name] = np.full(region.shape, fill, np.int8)
    return edit


def _out_shape(header):
    _regions(header)["out"]["shape"][2] -= 1


@pytest.mark.parametrize("edit, message", [
    (_header(_shift_region("x", 16)), "its program's tensor x starts at byte 16, not at a multiple of the 4096 bytes"),
    (_header(_shift_region("out", 16)), "its program's tensor out starts at byte 12304"),
    (_header(_move_to_arena_end("x")), r"its instruction \d+ \(load.inp\) moves bytes 0..64 of its arena, which lie "
                                       "outside x or zeros.inp"),
    (_header(_move_to_arena_end("w")), r"\(load.wgt\) moves bytes 4096..4240 of its arena, which lie outside w or "
                                       "zeros.wgt"),
    (_header(_swap_regions("x", "out")), r"\(load.inp\) moves bytes 0..64 of its arena, which lie outside x"),
    (_header(_swap_regions("w", "bias")), r"\(load.wgt\) moves bytes 4096..4240 .* outside w or zeros.wgt"),
    (_header(_out_shape), r"its program's tensor out is int8\[1, 1, 3, 4, 1, 4\], but the node's tensors pack to "
                          r"int8\[1, 1, 4, 4, 1, 4\]"),
    (_program(_nudge(Load, MemType.INP)), r"\(load.inp\) moves bytes 4..68 of its arena, which lie outside x"),
    (_program(_nudge(Load, MemType.WGT)), r"\(load.wgt\) moves bytes 4112..4256 .* outside w"),
    (_program(_nudge(Load, MemType.ACC)), r"\(load.acc\) moves bytes 8208..8224 .* outside bias"),
    (_program(_nudge(Load, MemType.UOP)), r"\(load.uop\) moves bytes \d+..\d+ .* outside the micro-op table"),
    (_program(_nudge(Store)), r"\(store.acc\) moves bytes 12292..12356 .* outside out"),
    (_program(_add_region("y", 0)), "its program has tensor 'y', which the compiler never makes"),
    (_program(_add_region("zeros.inp", 1)), "its program's zeros.inp block is not all zeros"),
    (_program(_add_region("zeros.inp", None)), r"its program carries the constants \['bias', 'w'\]"),
])
def test_a_layer_program_changed_after_compiling_is_refused(tiny_model, edit, message):
    """A tampered program used to run with exit status 0 and a wrong answer on fsim (its LOADs
    read the program's empty arena where the data was to be bound): the loader now checks each
    region's layout and each transfer's place against the node and the memory plan."""
    data, _ = tiny_model
    refusal = rf"not a valid gemforge model \(accelerator node 'conv1': (its instruction \d+ )?{message}.*{CHANGED}"
    with pytest.raises(ModelError, match=rf"{refusal} \(compile the model again\)\)$"):
        Model.from_bytes(_edit_program(data, edit), source="m.gfm")


def _scale_weights(program):
    program.constants["w"] = program.constants["w"] * 2


def _residual_attrs(**attrs):
    def edit(manifest):
        _accel(manifest, "residual")["attrs"].update(attrs)
    return edit


@pytest.mark.parametrize("edit, message", [
    (_edit_program_of("residual", _program(_scale_weights)),
     "the weights packed in its program differ from its attribute lshift"),
    (_edit_program_of("residual", _header(_shift_region("y", 16))),
     "its program's tensor y does not follow x, as its stacked operands do"),
    (_edit_program_of("residual", _header(_move_to_arena_end("y"))),
     "its program's tensor y does not follow x"),
    (_edit_program_of("residual", _program(_nudge(Load, MemType.INP))),
     r"\(load.inp\) moves bytes \d+..\d+ of its arena, which lie outside x or y or zeros.inp"),
    (lambda data: _edit_manifest(data, _residual_attrs(lshift=[7, 0])), "its lshift \\(7, 0\\) or shift"),
    (lambda data: _edit_manifest(data, _residual_attrs(relu=False)), "its program's relu is True but the manifest's node makes it False"),
])
def test_a_changed_residual_add_layer_is_refused(tiny_model, edit, message):
    """The add's weights and bias are not the manifest's constants but follow from its
    attributes (its operands' scaled identities, its shift's rounding), and its two operands
    are one stacked tensor: each is checked as the compiler makes it."""
    data, _ = tiny_model
    with pytest.raises(ModelError, match=rf"accelerator node 'residual': .*{message}"):
        Model.from_bytes(edit(data), source="m.gfm")


def test_a_tampered_program_is_one_line_on_the_command_line(tiny_model, tmp_path, capsys):
    data, x = tiny_model
    (tmp_path / "m.gfm").write_bytes(_edit_program(data, _header(_shift_region("x", 16))))
    np.save(tmp_path / "x.npy", x)
    code = main(["run", str(tmp_path / "m.gfm"), "--input", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy"),
                 "--device", "fsim"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("gemforge: error: ") and err.count("\n") == 1 and CHANGED in err, err
    assert not (tmp_path / "y.npy").exists()


def test_an_intact_model_and_a_consistently_relaid_program_run_as_compiled(tiny_model):
    """The checks ask for consistency, not for the compiler's exact bytes: the data region moved
    to a block of its own, with every LOAD of it moved alike, runs as before (on fsim as on the
    CPU)."""
    data, x = tiny_model
    model = Model.from_bytes(data)
    expected = model.run(x, "cpu")
    np.testing.assert_array_equal(model.run(x, "fsim"), expected)

    def relay(program):
        old = program.tensors["x"]
        new = dataclasses.replace(old, offset=program.arena_bytes)
        program.arena_bytes += arena_alignment(program.config)
        program.tensors["x"] = new
        moved = (new.offset - old.offset) // program.config.entry_bytes("inp")
        program.instructions = [dataclasses.replace(i, dram_base=i.dram_base + moved)
                                if isinstance(i, Load) and i.mem == MemType.INP else i for i in program.instructions]
    relaid = Model.from_bytes(_edit_program(data, _program(relay)))
    assert relaid.net.layers["conv1"].program.tensors["x"].offset == 20480
    np.testing.assert_array_equal(relaid.run(x, "fsim"), expected)
    assert np.abs(expected).max() > 0


# ---------------------------------------------------------------- members that unpack beyond their manifest

def _constant_name(data: bytes) -> str:
    manifest = json.loads(_members(data)["manifest.json"])
    return next(n for n in manifest["graph"]["nodes"] if n["name"] == "conv1")["inputs"][1]


def _replace_constant(data: bytes, array: np.ndarray) -> bytes:
    """The model with conv1's weight member of constants.npz replaced by ``array`` (deflated)."""
    files = _members(data)
    with zipfile.ZipFile(io.BytesIO(files["constants.npz"])) as npz:
        inner = {info.filename: npz.read(info) for info in npz.infolist()}
    member = io.BytesIO()
    np.lib.format.write_array(member, array)
    inner[f"{_constant_name(data)}.npy"] = member.getvalue()
    files["constants.npz"] = _zip(inner)
    return _zip(files)


def _refused_within(data: bytes, match: str, limit: int) -> None:
    """Loading ``data`` is refused (``match``) having allocated less than ``limit`` bytes."""
    tracemalloc.start()
    try:
        with pytest.raises(ModelError, match=match):
            Model.from_bytes(data, source="bomb.gfm")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit, f"{peak:,} bytes allocated"


def test_a_constant_that_unpacks_beyond_its_shape_is_refused_unread(tiny_model):
    """A constant of a few bytes in the manifest, 32 MiB of zeros in the file (a few KB packed):
    it was read whole, then refused as 'ValueError: not enough values to unpack'."""
    data, _ = tiny_model
    bomb = _replace_constant(data, np.zeros(32 << 20, np.int8))
    assert len(bomb) < 1 << 20
    _refused_within(bomb, r"bomb.gfm is not a valid gemforge model \(constant '.*' unpacks to 33,554,560 bytes, "
                          r"more than the 108 of the manifest's int8\[4, 3, 3, 3\] and a header\)$", 4 << 20)


@pytest.mark.parametrize("array, found", [(np.zeros(108, np.int8), r"int8\[108\]"),
                                          (np.zeros((1, 3, 3, 3), np.int32), r"int32\[1, 3, 3, 3\]")])
def test_a_constant_of_another_shape_or_type_is_refused_by_its_header(tiny_model, array, found):
    data, _ = tiny_model
    with pytest.raises(ModelError, match=rf"constant '.*' holds {found}, but the manifest describes "
                                         r"int8\[4, 3, 3, 3\]\)$"):
        Model.from_bytes(_replace_constant(data, array))


def test_members_that_unpack_beyond_what_the_manifest_holds_are_refused_unread(tiny_model):
    """The archive of constants and a program, each with 32 MiB of zeros before or after its
    content (a few KB packed), are refused before either is read."""
    data, _ = tiny_model
    files = _members(data)
    files["constants.npz"] = bytes(32 << 20) + files["constants.npz"]
    _refused_within(_zip(files), r"constants.npz unpacks to 33,\d{3},\d{3} bytes, more than the [\d,]+ that the "
                                 r"manifest's \d+ constants take", 4 << 20)
    bomb = _edit_program(data, lambda raw: raw + bytes(32 << 20))
    _refused_within(bomb, r"accelerator node 'conv1': its program programs/0.gfp unpacks to 33,\d{3},\d{3} bytes, "
                          r"more than the [\d,]+ that a conv2d of its shapes needs", 4 << 20)


# ---------------------------------------------------------------- the manifest's every field

def _accel(manifest, name: str = "conv1") -> dict:
    return next(n for n in manifest["graph"]["nodes"] if n["name"] == name)


def _slots(manifest) -> dict[str, dict]:
    return {t["tensor"]: t for t in manifest["plan"]["tensors"]}


def _overlap(manifest):
    """The two slots of the hand-over from conv1 to conv2 (conv1's output, conv2's input) put
    on the same bytes while both are in use."""
    a, b = (_slots(manifest)[_accel(manifest, name)["output"]] for name in ("conv1", "conv2"))
    b["offset"] = a["offset"]


def _extra_slot(manifest):
    slot = dict(manifest["plan"]["tensors"][0], tensor=manifest["graph"]["outputs"][0])
    manifest["plan"]["tensors"].append(slot)


def _set(path: str, value):
    """An edit that sets the manifest's field at ``path`` (keys and indices, '/'-separated)."""
    *parents, last = path.split("/")

    def edit(manifest):
        node = manifest
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[int(last) if isinstance(node, list) else last] = value
    return edit


def _value(name: str, **fields):
    """An edit of tensor ``name``'s description (names hold slashes: no path for `_set`)."""
    def edit(manifest):
        manifest["graph"]["values"].setdefault(name, {}).update(fields)
    return edit


@pytest.mark.parametrize("edit, message", [
    (_value("input/q", exponent=10 ** 6), r"tensor 'input/q' has scale exponent 1000000; an exponent is "
                                                     r"a whole number from -126 to 127"),
    (_value("input/q", dtype="float64"), r"tensor 'input/q' has type 'float64'; a tensor is float32, "
                                                    "int8, int32"),
    (_value("input/q", shape=[1, 3, 4, 4.5]), r"tensor 'input/q' has shape \[1, 3, 4, 4.5\]"),
    (_value("ghost", shape=[1], dtype="float32", exponent=None),
     "tensor 'ghost' is no input, no constant and no node's output"),
    (_value("input", dtype="int8"), "input 'input' is int8; a network's inputs are float32"),
    (_value("r1/q", dtype="int32"), r"'r1/q' is stored as int32\[1, 4, 4, 4\], its operator makes "
                                               r"int8\[1, 4, 4, 4\]"),
    (_set("graph/notes/batched_inputs", ["nope"]), "note batched_inputs must name inputs"),
    (_set("graph/notes/memory", "small"), "note memory must be an object of whole numbers"),
    (_set("graph/notes/model_sha256", 42), "note model_sha256 must be 64 hexadecimal digits or null"),
    (_set("graph/notes/batch_mixing", ["x"]), "note batch_mixing must be a sentence or null"),
    (_set("graph/nodes/1/attrs/lo", 0.0),
     r"GraphError: node conv1 \(conv2d\): a fused clip takes bounds lo ≤ hi, both, on a float32 convolution"),
    (_set("compile_seconds", "soon"), "compile_seconds is soon; it is a number of seconds"),
    (_set("model_sha256", "abc"), "model_sha256 is 'abc'; it is 64 hexadecimal digits or null"),
    (_set("dtype", "float32"), "a float32 network has no accelerator config"),
    (_set("layers/conv1/plan", []), "layer 'conv1': its data, data_shape, out_shape, plan or program is malformed"),
    (lambda m: m["layers"].update(pool=m["layers"]["conv1"]), "layer 'pool' belongs to no accelerator node"),
    (_set("plan/alignment", 8), "the memory plan aligns its tensors to 8 bytes; config 'tiny' needs 16"),
    (_set("plan/naive_bytes", "many"), "the memory plan's peak_bytes, naive_bytes, alignment or tensors are "
                                       "malformed"),
    (_set("plan/tensors/0/produced", "yes"), "the memory plan has a malformed entry"),
    (_set("plan/tensors/0/dtype", "object"), "the memory plan has a malformed entry"),
    (_set("plan/tensors/1/last", 1), r"the memory plan keeps 'r1/q' from node 1 to 1, but the accelerator uses "
                                     "it from 1 to 3"),
    (_set("plan/tensors/1/size", 4096), r"the memory plan's slot for 'r1/q' \(64 bytes in 4096 at offset 64\) is "
                                        r"not the 16-byte-aligned block of its 64 bytes"),
    (_set("plan/tensors/1/offset", 56), r"the memory plan's slot for 'r1/q' \(64 bytes in 64 at offset 56\)"),
    (_extra_slot, "the memory plan has a slot for 'logits', which no accelerator node reads or writes"),
    (_overlap, r"the memory plan gives '.*' and '.*' the same bytes \(\d+..\d+\) while both are in use"),
    (lambda m: m["graph"]["nodes"][0]["inputs"].append(m["graph"]["inputs"][0]),
     r"node .* \(quantize\): it has 2 inputs; quantize takes 1"),
    (lambda m: m["plan"].update(peak_bytes=1 << 31), r"the memory plan's arena of 2,147,483,648 bytes is not what "
                                                     "its slots take"),
])
def test_an_inconsistent_manifest_is_refused_by_name(tiny_model, edit, message):
    """Fields a run reads and fields it does not (an exponent of 10⁶, overlapping offsets in the
    memory plan) are checked alike: each is what the compiler writes, or the file is refused."""
    data, _ = tiny_model

    def with_edit(manifest):
        assert manifest["graph"]["nodes"][1]["name"] == "conv1"     # the layout the paths above assume
        edit(manifest)
    lead = "(the stored tensor shapes .*: |the graph's )?"
    with pytest.raises(ModelError, match=f"not a valid gemforge model \\({lead}{message}"):
        Model.from_bytes(_edit_manifest(data, with_edit))


def test_notes_are_typed_and_earlier_files_notes_still_load(tiny_model):
    """The notes a compile records load back as the same `GraphNotes`; the keys earlier files
    carry and now follow from other facts (``partitioned``, ``handovers``) and keys of no field
    are ignored, and a file from before ``batched_inputs`` takes every input as batched."""
    data, x = tiny_model
    model = Model.from_bytes(data)
    notes = model.graph.notes
    assert notes.quantized == "int8" and notes.partitioned and notes.memory == model.net.plan.summary()
    assert Model.from_bytes(model.to_bytes()).graph.notes == notes

    def as_before(manifest):
        old = manifest["graph"]["notes"]
        old.update(partitioned=True, handovers=notes.memory["handovers"], newer_fact={"x": 1}, symbolic_batch=True)
        del old["batched_inputs"]
    before = Model.from_bytes(_edit_manifest(data, as_before))
    assert before.graph.notes.batched_inputs == list(model.inputs) and before.graph.notes.partition == notes.partition
    np.testing.assert_array_equal(before.run(np.concatenate([x, x]), "fsim")[1], model.run(x, "fsim")[0])


def test_loading_and_running_a_model_never_imports_the_onnx_front_end(tmp_path):
    """A run starts fast: onnx (most of a second to import) is for compiling only."""
    import subprocess
    import sys
    from onnx import helper
    from onnx_models import model
    m = model([helper.make_node("Relu", ["x"], ["y"])], [("x", [2, 3])], [("y", [2, 3])])
    compile_model(m).save(tmp_path / "m.gfm")
    np.save(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    check = ("import sys, numpy as np\n"
             "from gemforge.driver.runtime.model import Model\n"
             f"Model.load({str(tmp_path / 'm.gfm')!r}).run(np.load({str(tmp_path / 'x.npy')!r}), 'cpu')\n"
             "print(sorted(m for m in sys.modules if m == 'onnx' or m.startswith('onnx.')))\n")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


# ---------------------------------------------------------------------------- host kernels in the file

@pytest.fixture(scope="module")
def float_model_with_kernels():
    """A float32 CNN whose host kernels were compiled into it (`compile_host_kernels`), as .gfm
    bytes, an input and its output."""
    rng = np.random.default_rng(5)
    model = compile_model(small_cnn(rng, channels=8, image=8, batch=1))
    assert model.compile_host_kernels() >= 4 and model.net.host_kernels
    x = rng.normal(size=(1, 3, 8, 8)).astype(np.float32)
    return model.to_bytes(), x, model.run(x, "cpu")


def _no_lowering(monkeypatch):
    import gemforge.compiler.pipeline as pipeline
    lowered = []

    def lower(*args, **kwargs):
        lowered.append(kwargs.get("name"))
        return original(*args, **kwargs)
    original = pipeline.lower
    monkeypatch.setattr(pipeline, "lower", lower)
    return lowered


def test_a_model_file_carries_its_host_kernels(float_model_with_kernels, monkeypatch):
    """On a machine of the same CPU with nothing in its kernel cache, a run loads the file's
    kernels: nothing is lowered or compiled, and the outputs are the compiling machine's."""
    data, x, expected = float_model_with_kernels
    monkeypatch.setenv("GEMFORGE_CACHE", "off")
    lowered = _no_lowering(monkeypatch)
    model = Model.from_bytes(data)
    assert model.summary()["host_kernels"] == len(model.net.host_kernels)
    np.testing.assert_array_equal(model.run(x, "cpu"), expected)
    assert lowered == []


def test_host_kernels_for_another_cpu_are_compiled_here(float_model_with_kernels, monkeypatch):
    """Kernels whose keys are not this machine's (another CPU, another back end) are not run:
    the layers are compiled here, with the same results."""
    data, x, expected = float_model_with_kernels
    model = Model.from_bytes(data)
    model.net.host_kernels = {key[::-1]: kernel for key, kernel in model.net.host_kernels.items()}
    elsewhere = Model.from_bytes(model.to_bytes())
    monkeypatch.setenv("GEMFORGE_CACHE", "off")
    lowered = _no_lowering(monkeypatch)
    np.testing.assert_array_equal(elsewhere.run(x, "cpu"), expected)
    assert len(lowered) >= len(model.net.host_kernels)


@pytest.mark.parametrize("tamper, message", [
    ("object", "is not the code its index names"),
    ("drop", "has no object code or IR in the file"),
    ("stray", "is no host kernel the manifest lists"),
    ("index", "host_kernels must be an object"),
])
def test_a_changed_host_kernel_is_refused(float_model_with_kernels, tamper, message):
    """Native code a run would execute: a kernel changed, missing or unlisted refuses the file."""
    data, _, _ = float_model_with_kernels
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        objects = [n for n in src.namelist() if n.endswith(".o")]
        for name in src.namelist():
            body = src.read(name)
            if name == objects[0] and tamper == "object":
                body = bytes(b ^ 0xFF if i == len(body) // 2 else b for i, b in enumerate(body))
            if name == objects[0] and tamper == "drop":
                continue
            if name == "manifest.json" and tamper == "index":
                manifest = json.loads(body)
                manifest["host_kernels"] = ["nope"]
                body = json.dumps(manifest).encode()
            dst.writestr(name, body)
        if tamper == "stray":
            dst.writestr("host/extra.o", b"\x7fELF")
    with pytest.raises(ModelError, match=message):
        Model.from_bytes(out.getvalue())


def test_a_run_may_compile_instead_of_running_the_file_kernels(float_model_with_kernels, monkeypatch):
    data, x, expected = float_model_with_kernels
    monkeypatch.setenv("GEMFORGE_CACHE", "off")
    lowered = _no_lowering(monkeypatch)
    model = Model.from_bytes(data, file_kernels=False)
    assert not model.net.host_kernels
    np.testing.assert_array_equal(model.run(x, "cpu"), expected)
    assert lowered
