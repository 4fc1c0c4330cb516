"""The accelerator's gateware (Amaranth 0.5), one concept per module.

`Accelerator` (in `top`) is the generated top level; the other modules are its
blocks, each usable and tested on its own.
"""
