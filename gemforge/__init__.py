"""gemforge: a hardware-software co-design kit for deep-learning accelerators."""

__version__ = "0.1.0"
