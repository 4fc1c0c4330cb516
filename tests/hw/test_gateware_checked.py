"""A component refused for its arguments raises one clear error and nothing else: Amaranth's
"created but never used" warning must not also point at the caller's line."""

import gc
import warnings

import pytest
from amaranth.hdl import Fragment, Module, UnusedElaboratable

from gemforge.hw.board.bridge import Bridge
from gemforge.hw.board.memory import AxiMemory
from gemforge.hw.board.top import BoardTop
from gemforge.hw.board.uart import UartRx, UartTx
from gemforge.hw.config import PRESETS
from gemforge.hw.gateware.arbiter import ReadArbiter
from gemforge.hw.gateware.banked import BankedMemory
from gemforge.hw.gateware.dma import BurstGenerator
from gemforge.hw.gateware.dma_read import DmaReader
from gemforge.hw.gateware.dma_write import DmaWriter
from gemforge.hw.gateware.regfile import RegisterFile
from gemforge.hw.gateware.tile_load import TileLoader
from gemforge.hw.gateware.tokens import TokenQueue
from gemforge.hw.gateware.top import Accelerator
from gemforge.hw.regmap import REGISTERS

TINY = PRESETS["tiny"]

@pytest.fixture
def warnings_armed():
    """Amaranth reports unused elaboratables only once something has been elaborated in the
    process (before that, an unused one most likely means the program crashed)."""
    Fragment.get(Module(), None)
    gc.collect()


REFUSALS = [
    (lambda: TokenQueue(0), TypeError, "capacity must be a positive integer"),
    (lambda: RegisterFile([("ID", 0)]), TypeError, "must be gemforge.hw.regmap.Register"),
    (lambda: RegisterFile(iter(REGISTERS)), TypeError, "list or tuple"),
    (lambda: BankedMemory(width=8, depth=12, banks=2), TypeError, "Depth must be a positive power of two"),
    (lambda: ReadArbiter(64, 0), TypeError, "Client count must be a positive integer"),
    (lambda: BurstGenerator(3, 8), TypeError, "positive power of two"),
    (lambda: DmaReader(1, 8, lanes=3), TypeError, "lanes must be a power of two"),
    (lambda: DmaReader(1, 8, depth=0), TypeError, "Command depth must be a positive integer"),
    (lambda: DmaWriter(1, 8, responses=-1), TypeError, "Outstanding responses must be a positive integer"),
    (lambda: TileLoader(TINY, "out"), ValueError, "LOAD targets inp, wgt, acc or uop"),
    (lambda: TileLoader(TINY, "inp", depth=0), TypeError, "Command depth must be a positive integer"),
    (lambda: Accelerator("tiny"), TypeError, "config must be an AccelConfig"),
    (lambda: UartRx(3), ValueError, "Cycles per bit must be an integer of at least 4"),
    (lambda: UartTx(2.5), ValueError, "Cycles per bit must be an integer of at least 4"),
    (lambda: AxiMemory(64, 12, 2), ValueError, "Memory size must be a power of two"),
    (lambda: Bridge(4096, 8, 0), ValueError, "Timeout must be a positive number of cycles"),
    (lambda: BoardTop(TINY, 1000, 12_000_000, 115200), ValueError, "at least 4096 bytes"),
]


@pytest.mark.parametrize("make, error, message", REFUSALS,
                         ids=[f"{i}-{m.split()[0]}" for i, (_, _, m) in enumerate(REFUSALS)])
def test_refused_component_raises_without_unused_warning(warnings_armed, make, error, message):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(error, match=message):
            make()
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, UnusedElaboratable)]


def test_accepted_component_that_goes_unused_still_warns(warnings_armed):
    """The checks do not silence Amaranth's warning for a component that was built and dropped
    (and the warning names the caller's line, not the base class)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        TokenQueue(2)
        gc.collect()
    unused = [w for w in caught if issubclass(w.category, UnusedElaboratable)]
    assert len(unused) == 1 and unused[0].filename == __file__
