"""gemforge.hw.flow: the EDA flow from the gateware to files and boards.

Verilog and the generated documents (`generate`, `datasheet`), synthesis, place and route with
the open tools from PyPI (`synth`, its slowest paths: `timing_paths`) and the area model that
sweeps fit from synthesis runs (`area_model`). The hardware's specification — config, ISA,
register map, program files, microarchitecture facts, timing — is `gemforge.hw` itself, which
imports nothing from here (`tests/test_layers.py`).
"""
