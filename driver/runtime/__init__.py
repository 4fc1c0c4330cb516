"""gemforge.driver.runtime: what runs a compiled network or program on a device.

The Device API and its backends (`device`: fsim, the RTL simulators, a board over UART, and
the CPU/GPU where the LLVM back ends run), the compiled model's executor (`model`), its
``.gfm`` artefact (`artefact`) and per-layer profiles (`profile`). Nothing here imports the
tools (`gemforge.driver.tools`); `tests/test_layers.py` checks it.
"""
