"""Shared helpers of the compiler tests: extra configs, cached fsim devices, random operands."""

from __future__ import annotations

import numpy as np

from gemforge.driver.device import open_device
from gemforge.hw.config import PRESETS, AccelConfig

#: Buffers so small that every dimension needs many tiles, and micro-ops must be
#: reloaded (2 token slots and command-queue entries stress the protocol).
CRAMPED = AccelConfig(
    name="cramped", batch=1, block_in=4, block_out=4, inp_buffer_bytes=256, wgt_buffer_bytes=1024,
    acc_buffer_bytes=1024, out_buffer_bytes=256, uop_buffer_bytes=16, cmd_queue_depth=2,
    token_queue_depth=2)
#: A batched core shape (B = 2, BI != BO).
BATCHED = AccelConfig(
    name="batched", batch=2, block_in=4, block_out=8, inp_buffer_bytes=2048, wgt_buffer_bytes=8192,
    acc_buffer_bytes=8192, out_buffer_bytes=2048, uop_buffer_bytes=1024)

CONFIGS = {**PRESETS, "cramped": CRAMPED, "batched": BATCHED}

_DEVICES: dict[str, object] = {}


def device_for(config: AccelConfig):
    """A cached fsim device per config (its on-chip state persists between runs, like hardware's)."""
    if config.name not in _DEVICES:
        _DEVICES[config.name] = open_device("fsim", config, dram_bytes=1 << 23)
    return _DEVICES[config.name]


__all__ = ["CRAMPED", "BATCHED", "CONFIGS", "device_for", "int8"]


def int8(rng, shape):
    return rng.integers(-128, 128, shape, dtype=np.int8)
