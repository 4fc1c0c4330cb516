"""gemforge.sim: running accelerator programs without hardware — `fsim`, the bit-exact
functional simulator that is the ISA's executable specification, and `cosim`, the
cocotb co-simulation of the generated Verilog (Verilator, Icarus) checked against it."""

# The folder is installed as gemforge.sim; imported as `sim` (from the repository root) its
# modules would form a second tree whose classes differ from gemforge's own.
if __name__ != "gemforge.sim":
    raise ImportError(f"this folder is the package gemforge.sim: import gemforge.sim, not {__name__} "
                      "(`pip install -e .` or `make install` installs it)")
