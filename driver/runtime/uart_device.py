"""The board backend: the Device API over a UART to the board top (`gemforge.hw.board`).

``open_device("uart:PORT[@BAUD]", config)`` (or ``open_device("uart", config,
port=..., baud=...)``; the CLI's ``--device uart:PORT[@BAUD]``) opens the serial
port with pyserial (``PORT`` may be any pyserial URL), PINGs the bridge, learns
the board memory size and checks the accelerator's ID register.

The board memory is the device's DRAM, at the same addresses, so ``dram_bytes``
defaults to (and may not exceed) the board's memory. Writes go through to the
board as they are made; reads fetch what a run may have changed. Before a run,
live bytes the host never wrote (whose board contents are unknown) are zeroed
on the board with ZERO_MEM, as they are in the host's image (a byte the host
never wrote nor read back is zero there), so a run sees what it would see on fsim.

A run writes INSN_ADDR, INSN_COUNT and CTRL.START, then polls STATUS:
DONE → the counters are read; ERROR → `BoardFaultError` naming the `Fault`;
no end within ``run_timeout_s`` → CTRL.ABORT and a `DeviceError`.
"""

from __future__ import annotations

import time

import numpy as np

from gemforge.hw.config import AccelConfig
from gemforge.hw.regmap import COUNTERS, CTRL_BITS, FAULT_DOCS, ID_MAGIC, STATUS_BITS, Fault, by_name

from .device import DEFAULT_BAUD, AcceleratorFaultError, Device, DeviceError, RunResult
from .uart_link import BridgeLink, LinkError

__all__ = ["UartDevice", "BoardFaultError"]

class BoardFaultError(AcceleratorFaultError):
    """The accelerator on the board ended the program with ERROR (``fault``, ``info`` as
    for any `AcceleratorFaultError`)."""


class UartDevice(Device):
    """A device on a board, through the board top's UART bridge.

    Parameters
    ----------
    config : AccelConfig
        Must be the config the board's bitstream was built for (only the ID register
        is checked).
    port : str
        Serial port or pyserial URL.
    baud : int
    dram_bytes : int, optional
        At most the board memory (the default).
    timeout_s : float
        Per-answer timeout beyond the wire time (see `BridgeLink`).
    run_timeout_s : float
        A run not ended by then is aborted.
    poll_interval_s : float
        Pause between STATUS polls.
    serial : object, optional
        An already open pyserial-like port (tests); ``port`` is then only a name.
    """

    kind = "uart"

    def __init__(self, config: AccelConfig, port: str | None = None, baud: int = DEFAULT_BAUD, *,
                 dram_bytes: int | None = None, timeout_s: float = 2.0, run_timeout_s: float = 60.0,
                 poll_interval_s: float = 0.0, serial=None) -> None:
        if serial is None:
            if not port:
                raise DeviceError("the uart device needs a port: open_device('uart:PORT[@BAUD]', config)")
            try:
                import serial as pyserial
            except ImportError:
                raise DeviceError("the uart device needs pyserial (pip install pyserial==3.5)") from None
            try:
                serial = pyserial.serial_for_url(port, baudrate=baud, timeout=0.1)
            except (pyserial.SerialException, ValueError) as exc:
                raise DeviceError(f"cannot open serial port {port!r}: {exc}") from None
        self.port_name = port
        self._serial = serial
        self.link = BridgeLink(serial, baud, timeout_s)
        self.run_timeout_s = run_timeout_s
        self.poll_interval_s = poll_interval_s
        try:
            self.board_mem_bytes = self.link.ping()
        except LinkError:
            try:
                self.board_mem_bytes = self.link.resync()
            except LinkError as exc:
                self._serial.close()
                raise DeviceError(f"no gemforge board bridge on {port}: {exc}") from None
        dram_bytes = self.board_mem_bytes if dram_bytes is None else dram_bytes
        if dram_bytes > self.board_mem_bytes:
            self._serial.close()
            raise DeviceError(f"dram_bytes={dram_bytes} is more than the board's {self.board_mem_bytes}-byte memory")
        super().__init__(config, dram_bytes)
        try:
            ident = self._reg("ID")
        except DeviceError:
            self._serial.close()
            raise
        if ident != ID_MAGIC:
            self._serial.close()
            raise DeviceError(f"the board's ID register reads {ident:#010x}, not {ID_MAGIC:#010x}: no gemforge "
                              "accelerator behind the bridge")
        self._set_reg("IRQ_ENABLE", 1)       # the board's LED 0 lights when a program ends
        # Which bytes the board holds as the host has them, and which host bytes are current.
        self._board_valid = np.zeros(dram_bytes, dtype=bool)
        self._host_valid = np.ones(dram_bytes, dtype=bool)

    # ------------------------------------------------------------------ link helpers

    def _reg(self, name: str) -> int:
        try:
            return self.link.read_reg(by_name(name).offset)
        except LinkError as exc:
            raise DeviceError(f"uart {self.port_name}: reading {name}: {exc}") from None

    def _set_reg(self, name: str, value: int) -> None:
        try:
            self.link.write_reg(by_name(name).offset, value)
        except LinkError as exc:
            raise DeviceError(f"uart {self.port_name}: writing {name}: {exc}") from None

    def _counter(self, name: str) -> int:
        return self._reg(f"{name.upper()}_LO") | self._reg(f"{name.upper()}_HI") << 32

    @staticmethod
    def _runs(mask: np.ndarray):
        """(start, end) of the runs of True in ``mask``."""
        edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.view(np.int8), [0]))))
        return zip(edges[::2].tolist(), edges[1::2].tolist())

    # ------------------------------------------------------------------ memory

    def _write_bytes(self, address: int, raw: np.ndarray) -> None:
        super()._write_bytes(address, raw)
        try:
            self.link.write_mem(address, raw.tobytes())
        except LinkError as exc:
            raise DeviceError(f"uart {self.port_name}: writing {raw.size} bytes at {address:#x}: {exc}") from None
        self._board_valid[address:address + raw.size] = True
        self._host_valid[address:address + raw.size] = True

    def _read_bytes(self, address: int, nbytes: int) -> np.ndarray:
        stale = ~self._host_valid[address:address + nbytes]
        for start, end in self._runs(stale):
            try:
                data = self.link.read_mem(address + start, end - start)
            except LinkError as exc:
                raise DeviceError(f"uart {self.port_name}: reading {end - start} bytes at "
                                  f"{address + start:#x}: {exc}") from None
            self.dram[address + start:address + end] = np.frombuffer(data, dtype=np.uint8)
        self._host_valid[address:address + nbytes] = True
        return super()._read_bytes(address, nbytes)

    def _live(self) -> np.ndarray:
        live = np.zeros(self.dram_bytes, dtype=bool)
        for address, nbytes in self._allocated.items():
            live[address:address + nbytes] = True
        return live

    def alloc(self, nbytes: int, align: int = 64):
        try:
            return super().alloc(nbytes, align)
        except DeviceError as exc:
            raise DeviceError(f"{exc}: the board memory ({self.board_mem_bytes} bytes) is the uart device's "
                              "DRAM; build the board top with a larger mem_bytes, or run smaller "
                              "operators") from None

    # ------------------------------------------------------------------ runs

    def _execute(self, insn_address: int, insn_count: int, links=()) -> RunResult:
        # A board reads its counters at the end only: a chain's run reports no marks.
        live = self._live()
        for start, end in self._runs(live & ~self._board_valid):
            # Bytes the board may not hold as the host does were never written by the host
            # (writes go through), so they are zero in its image.
            assert not self.dram[start:end].any()
            try:
                self.link.zero_mem(start, end - start)
            except LinkError as exc:
                raise DeviceError(f"uart {self.port_name}: zeroing {end - start} bytes at {start:#x}: {exc}") from None
            self._board_valid[start:end] = True
        # START is ignored while BUSY (a run still aborting, or left by another session):
        # wait until the accelerator is idle, or the poll below would report that run.
        idle_by = time.monotonic() + self.run_timeout_s
        while self._reg("STATUS") >> STATUS_BITS["BUSY"] & 1:
            if time.monotonic() > idle_by:
                raise DeviceError(f"uart {self.port_name}: the accelerator stayed busy for {self.run_timeout_s} s "
                                  "before this run (a program still running or aborting); reset the board")
            time.sleep(self.poll_interval_s or 0.01)
        self._set_reg("INSN_ADDR", insn_address)
        self._set_reg("INSN_COUNT", insn_count)
        self._set_reg("CTRL", 1 << CTRL_BITS["START"])
        # The accelerator may write any live byte from now on.
        self._host_valid &= ~live
        deadline = time.monotonic() + self.run_timeout_s
        while True:
            status = self._reg("STATUS")
            if status >> STATUS_BITS["ERROR"] & 1:
                code, info = by_name("ERROR").unpack(self._reg("ERROR"))["CODE"], self._reg("ERROR_INFO")
                fault = Fault(code) if code in Fault._value2member_map_ else None
                name = fault.name if fault is not None else f"unknown code {code}"
                why = FAULT_DOCS[fault] if fault is not None else "not in this driver's fault table"
                raise BoardFaultError(f"uart {self.port_name}: the accelerator ended the program with fault "
                                      f"{name} ({why}; ERROR_INFO = {info:#x})", fault, info)
            if status >> STATUS_BITS["DONE"] & 1:
                break
            if time.monotonic() > deadline:
                state = {n: self._reg(n) for n in ("STATUS", "DEBUG_STATE", "DEBUG_CMDQ", "DEBUG_TOKENS_A",
                                                   "DEBUG_TOKENS_B", "DEBUG_FETCHED")}
                self._set_reg("CTRL", 1 << CTRL_BITS["ABORT"])
                raise DeviceError(f"uart {self.port_name}: the program did not end within {self.run_timeout_s} s; "
                                  "it was aborted (CTRL.ABORT); registers before the abort took effect: "
                                  + ", ".join(f"{k}={v:#x}" for k, v in state.items()))
            if self.poll_interval_s:
                time.sleep(self.poll_interval_s)
        counters = {name: self._counter(name) for name, _ in COUNTERS}
        return RunResult(counters={"insns": counters["insns_retired"], "gemm_uops": counters["gemm_active"],
                                   "gemm_reset_uops": counters["gemm_reset"], "alu_uops": counters["alu_active"],
                                   "dma_bytes_read": counters["dma_bytes_read"],
                                   "dma_bytes_written": counters["dma_bytes_written"]},
                         cycles=counters["cycles"], hw_counters=counters)

    def close(self) -> None:
        if self._serial is not None and getattr(self._serial, "is_open", True):
            self._serial.close()
