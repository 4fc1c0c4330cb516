"""The GEMM core's arithmetic: one micro-op's ``batch × block_out`` dot products.

``dot[b][o] = Σ_k inp[b][k] · wgt[o][k]`` over ``block_in`` signed products,
i.e. ``batch · block_in · block_out`` multiplies per cycle, in three steps of a
cycle each: the operands are registered as they arrive, the products are
registered, and an adder tree sums them in the next cycle. So neither the
multipliers nor the tree share a cycle with a buffer's block-RAM read (on the
ECP5 the path from a DP16KD's read data through a MULT18X18D into the product
register was tiny's critical path at 58 MHz, most of it the block RAM's
clock-to-out and routing). The sums are returned modulo 2^acc_width (the
accumulator adds them with wrap-around, so dropping the high bits here changes
nothing).

Each lane's dot product is a module of its own (`DotLane`, named by `lane_name`),
so that a synthesis flow can choose per lane how its multipliers are built: an
FPGA's DSP blocks, or LUT logic where the DSPs run out (`gemforge.hw.flow.synth`
rewrites the chosen lanes' multipliers with Yosys's ``booth`` pass).

The product registers stay in the fabric. Yosys infers no DSP-block registers on the ECP5,
so putting them in the MULT18X18D (its output register) means instantiating the block; that
was measured (tiny, nextpnr seed 2): the operand → product path shrinks to the block's setup,
but the block's output route to the fabric (2.5–2.9 ns) then lands in the adder tree's cycle
and the ALU's forwarding, and Fmax fell from 89.6 to 78.0 MHz. Registers on both sides of the
block would help, at a cycle more of GEMM latency. The operand registers alone in the block
(``REG_INPUTA/B_CLK``, in place of ``inp_r``/``wgt_r``; the product register in the fabric) were
measured too (tiny, seed 2): the buffers' block-RAM read then runs through the bank select into
the block's input setup, and ``inp_mem → gemm_lane.dsp`` (12.2 ns) became the slowest path.

A register after the adder tree (a third cycle; the compute pipeline an eight-stage one that
reads the accumulator a stage later, commit f0b0cf1, reverted) was measured on tiny, seeds 1–4:
the tree's paths into the ALU's operand left the slowest lists, but the pipeline's one-cycle
forwarding loop (``alu.b → alu.b``, 11.2–11.7 ns: the op's logic and the forward's select)
stayed as the floor, the slowest paths moved to placement-dependent control logic, and
Fmax (with e089621's watchdog registers too) was 86.6 / 69.5 / 75.4 / 84.8 MHz against
90.0 / 84.8 / 88.0 at 0caa6ef, at a cycle more per GEMM and ALU instruction. It pays only once
that loop is shorter than the tree's path.
"""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["DotLane", "GemmCore", "lane_name", "lanes"]


def lanes(value, count, width):
    """Split an entry into ``count`` lanes of ``width`` bits (element 0 = low bits)."""
    return [value[i * width:(i + 1) * width] for i in range(count)]


def lane_name(b: int, o: int) -> str:
    """The module name of the dot product for batch row ``b``, output ``o`` (unique in the design)."""
    return f"gemm_lane_{b}_{o}"


class DotLane(wiring.Component):
    """``Σ_k x[k]·w[k]`` over ``block_in`` signed products, registered once after the multipliers.

    Attributes
    ----------
    x : In(block_in·inp_width)
    w : In(block_in·wgt_width)
    dot : Out(acc_width)
        The sum for the ``x``/``w`` of one cycle before, modulo 2^acc_width.
    """

    def __init__(self, config):
        self._config = config
        c = config
        super().__init__({"x": In(c.block_in * c.inp_width), "w": In(c.block_in * c.wgt_width),
                          "dot": Out(c.acc_width)})

    def elaborate(self, platform):
        m = Module()
        c = self._config
        x = [v.as_signed() for v in lanes(self.x, c.block_in, c.inp_width)]
        w = [v.as_signed() for v in lanes(self.w, c.block_in, c.wgt_width)]
        terms = []
        for k in range(c.block_in):
            product = Signal(signed(c.inp_width + c.wgt_width), name=f"product_{k}")
            m.d.sync += product.eq(x[k] * w[k])
            terms.append(product)
        # Balanced adder tree.
        while len(terms) > 1:
            terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i]
                     for i in range(0, len(terms), 2)]
        m.d.comb += self.dot.eq(terms[0])   # sign-extends or wraps to acc_width
        return m


class GemmCore(wiring.Component):
    """Dot products of one input entry with one weight entry, `LATENCY` cycles after them.

    Attributes
    ----------
    inp : In(batch·block_in·inp_width)
    wgt : In(block_out·block_in·wgt_width)
    dot : Out(batch·block_out·acc_width)
        Row-major ``[b][o]`` lanes, like an accumulator entry: the dot products of
        the ``inp`` and ``wgt`` of `LATENCY` cycles before (operand and product registers).
    """

    #: Cycles from ``inp``/``wgt`` to ``dot``.
    LATENCY = 2

    def __init__(self, config):
        self._config = config
        c = config
        super().__init__({
            "inp": In(c.batch * c.block_in * c.inp_width),
            "wgt": In(c.block_out * c.block_in * c.wgt_width),
            "dot": Out(c.batch * c.block_out * c.acc_width),
        })

    def elaborate(self, platform):
        m = Module()
        c = self._config
        inp, wgt = Signal.like(self.inp, name="inp_r"), Signal.like(self.wgt, name="wgt_r")
        m.d.sync += [inp.eq(self.inp), wgt.eq(self.wgt)]
        rows = lanes(inp, c.batch, c.block_in * c.inp_width)
        columns = lanes(wgt, c.block_out, c.block_in * c.wgt_width)
        out = []
        for b in range(c.batch):
            for o in range(c.block_out):
                m.submodules[lane_name(b, o)] = lane = DotLane(c)
                m.d.comb += [lane.x.eq(rows[b]), lane.w.eq(columns[o])]
                out.append(lane.dot)
        m.d.comb += self.dot.eq(Cat(*out))
        return m
