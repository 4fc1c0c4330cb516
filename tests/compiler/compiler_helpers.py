"""Shared helpers of the compiler tests: extra configs, cached fsim devices, random operands."""

from __future__ import annotations

import numpy as np

from gemforge.driver.runtime.device import open_device
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


__all__ = ["CRAMPED", "BATCHED", "CONFIGS", "device_for", "int8", "with_nan_and_inf", "max_pool_ignoring_nan"]


def int8(rng, shape):
    return rng.integers(-128, 128, shape, dtype=np.int8)


def with_nan_and_inf(rng, shape) -> np.ndarray:
    """Normal float32 values, about a quarter NaN and some ±inf, the first window row all NaN."""
    x = rng.standard_normal(shape).astype(np.float32)
    r = rng.random(shape)
    x[r < 0.25] = np.nan
    x[(r >= 0.25) & (r < 0.3)] = np.inf
    x[(r >= 0.3) & (r < 0.35)] = -np.inf
    x[..., :3, :3] = np.nan
    return x


def max_pool_ignoring_nan(x, kernel, stride, padding) -> np.ndarray:
    """Float max pooling window by window (an oracle independent of `max_pool2d_reference`):
    the maximum of the window's values inside the input that are not NaN, NaN when all are."""
    (kh, kw), (sh, sw), (ph, pw) = (tuple(v) if isinstance(v, tuple) else (v, v) for v in (kernel, stride, padding))
    n, c, h, w = x.shape
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    out = np.empty((n, c, oh, ow), x.dtype)
    for i in range(oh):
        for j in range(ow):
            y0, x0 = i * sh - ph, j * sw - pw
            window = x[:, :, max(y0, 0):y0 + kh, max(x0, 0):x0 + kw].reshape(n, c, -1)
            for b in range(n):
                for ch in range(c):
                    values = window[b, ch][~np.isnan(window[b, ch])]
                    out[b, ch, i, j] = values.max() if values.size else np.nan
    return out
