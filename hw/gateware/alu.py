"""The tensor ALU: one element-wise operation on ``batch × block_out`` accumulator lanes.

Semantics (`gemforge.hw.isa.Alu`): MIN/MAX compare signed; ADD and MUL wrap at
acc_width; SHR shifts arithmetically right by the operand, or left by its
negation when negative; an amount of acc_width or more gives the sign fill
(right) or zero (left).

MIN, MAX, ADD and SHR are combinational, but MIN and MAX take their compare
(``lt``: a < b, signed, per lane) and SHR its decoded amount (``shr``:
`shr_decode` of b) from the caller: the compute pipeline computes both a cycle
ahead, since a 32-bit compare, and then the amount's decode, followed by the
operand select were the longest part of its one-cycle forwarding loop on the
ECP5 (`gemforge.hw.gateware.pipeline`). MUL takes two cycles: the low
acc_width bits of a product need three half-width products (``al·bl``, and the
low halves of ``al·bh`` and ``ah·bl``), which are registered before the final
add (`_product`). A one-cycle MUL put the multipliers in the compute pipeline's forwarding
loop (the write-back feeds the operand select), the design's critical path on the ECP5.
"""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..isa import ALU_OP_BITS, AluOp
from .gemm import lanes

__all__ = ["TensorAlu", "shr_decode", "shr_decode_bits"]


def shr_decode_bits(width):
    """Bits of one lane's `shr_decode`."""
    return 2 * (width - 1).bit_length() + 2


def shr_decode(b, width):
    """SHR's shift by ``b`` (one signed lane of ``width`` bits) decoded, for `TensorAlu.shr`:
    ``Cat(right, left, negative, left_ok)``. With ``sh_bits`` = bits of ``width - 1``,
    ``lo`` = b's low sh_bits bits and ``hi`` the rest: b ≥ 0 shifts right by
    ``right`` = min(b, width-1) (width-1 when any bit of hi is set); b < 0 shifts left by
    k = -b when k ≤ width-1 (``left_ok``: hi all ones, i.e. b ≥ -2^sh_bits, and
    lo ≥ 2^sh_bits - (width-1)), and then k = 2^sh_bits - lo, so a << k = (a << 1) << ``left``
    with ``left`` = ~lo; a larger left shift gives zero."""
    sh_bits = (width - 1).bit_length()
    lo, hi = b[:sh_bits], b[sh_bits:]
    return Cat(Mux(hi.any() | (lo >= width - 1), width - 1, lo), ~lo, b[width - 1],
               hi.all() & (lo >= (1 << sh_bits) - (width - 1)))


class TensorAlu(wiring.Component):
    """``op(a, b)`` lane by lane.

    Attributes
    ----------
    op : In(ALU_OP_BITS)
        An `AluOp` value, set a cycle before the operands it applies to (its decode is
        registered; the pipeline holds it for a whole instruction).
    a, b : In(batch·block_out·acc_width)
        Accumulator entries (``b`` is the operand: acc[src] or the broadcast immediate).
    lt : In(batch·block_out)
        Lane ``i``'s ``a < b`` (signed), which MIN and MAX select by; the other ops ignore it.
    shr : In(batch·block_out·shr_decode_bits(acc_width))
        Lane ``i``'s `shr_decode` of ``b``, which SHR shifts by; the other ops ignore it.
    result : Out(batch·block_out·acc_width)
        ``op(a, b)`` in the same cycle, for MIN, MAX, ADD and SHR.
    mul_a, mul_b : In(batch·block_out·acc_width)
        A MUL's operands: the same values as ``a`` and ``b`` for a MUL, held in registers of
        their own (the pipeline's) that feed only the multipliers: ``a`` and ``b`` sit in
        the forwarding loop, and with the DSP blocks among their loads the placer put them
        far from the loop's logic (on the ECP5 one such net took 5.9 ns).
    product : Out(batch·block_out·acc_width)
        ``mul_a · mul_b`` (wrapped) of the previous cycle, whatever ``op`` is.
    """

    def __init__(self, config):
        self._config = config
        width = config.batch * config.block_out * config.acc_width
        super().__init__({"op": In(ALU_OP_BITS), "a": In(width), "b": In(width),
                          "lt": In(config.batch * config.block_out),
                          "shr": In(config.batch * config.block_out * shr_decode_bits(config.acc_width)),
                          "result": Out(width),
                          "mul_a": In(width), "mul_b": In(width), "product": Out(width)})

    def elaborate(self, platform):
        m = Module()
        c = self._config
        w = c.acc_width
        sh_bits = (w - 1).bit_length()          # enough for 0..w-1
        n = c.batch * c.block_out
        results, products = [], []
        # The op's one-hot selects are registers: each fans out to every bit of every lane, and
        # a decode in front of that fan-out sat in the pipeline's forwarding loop
        # (`alu.op → alu.b`, 10.2 ns on tiny's ECP5).
        is_max, is_minmax, is_add, is_shr = Signal(), Signal(), Signal(), Signal()
        m.d.sync += [is_max.eq(self.op == AluOp.MAX), is_minmax.eq((self.op == AluOp.MIN) | (self.op == AluOp.MAX)),
                     is_add.eq(self.op == AluOp.ADD), is_shr.eq(self.op == AluOp.SHR)]
        for i, (mul_a, mul_b) in enumerate(zip(lanes(self.mul_a, n, w), lanes(self.mul_b, n, w))):
            products.append(self._product(m, i, mul_a, mul_b))
        for i, (a, b, shr) in enumerate(zip(lanes(self.a, n, w), lanes(self.b, n, w),
                                            lanes(self.shr, n, shr_decode_bits(w)))):
            a, b = a.as_signed(), b.as_signed()
            r = Signal(w, name=f"lane{i}")
            right, left, negative, left_ok = shr[:sh_bits], shr[sh_bits:2 * sh_bits], shr[-2], shr[-1]
            # One comparison serves MIN and MAX (equal operands give the same value either
            # way), and the op's result is an AND-OR of one-hot selects (decoded from the
            # instruction, static during it) rather than a multiplexer tree: fewer logic levels
            # after the carry chains, which end the pipeline's loop.
            take_a = Signal(name=f"take_a{i}")
            shifted = Signal(w, name=f"shifted{i}")
            m.d.comb += take_a.eq(self.lt[i] ^ is_max)
            with m.If(~negative):
                m.d.comb += shifted.eq(a >> right)
            with m.Elif(left_ok):
                m.d.comb += shifted.eq((a << 1) << left)
            m.d.comb += r.eq((Mux(take_a, a, b) & is_minmax.replicate(w)) | ((a + b)[:w] & is_add.replicate(w)) |
                             (shifted & is_shr.replicate(w)))
            results.append(r)
        m.d.comb += [self.result.eq(Cat(*results)), self.product.eq(Cat(*products))]
        return m

    def _product(self, m, i, a, b):
        """The low w bits of a·b, from half-width products registered this cycle (the sign
        of the operands does not change a product's low w bits): ``al·bl`` whole, and the low
        halves of ``al·bh`` and ``ah·bl``, each registered straight from its multiplier (their
        sum before the registers put a carry chain after the DSP block: ``mul_a → mul_cross``,
        11.2 ns, tiny's ECP5 critical path at 89.6 MHz). The sum is made in the next cycle: the
        low half is ``al·bl``'s, the high half ``(al·bl)_hi + al·bh + ah·bl``, three numbers
        added as a carry-save layer (one LUT level) and one carry chain."""
        w = self._config.acc_width
        h = w // 2
        low = Signal(w, name=f"mul_low{i}")           # al·bl
        cross_a = Signal(h, name=f"mul_cross_a{i}")   # al·bh, low h bits
        cross_b = Signal(h, name=f"mul_cross_b{i}")   # ah·bl, low h bits
        m.d.sync += [low.eq(a[:h] * b[:h]), cross_a.eq(a[:h] * b[h:]), cross_b.eq(a[h:] * b[:h])]
        x, y, z = low[h:], cross_a, cross_b
        sums = Signal(h, name=f"mul_sums{i}")
        carries = Signal(h, name=f"mul_carries{i}")
        m.d.comb += [sums.eq(x ^ y ^ z), carries.eq((x & y) | (x & z) | (y & z))]
        return Cat(low[:h], (sums + Cat(C(0, 1), carries[:-1]))[:h])
