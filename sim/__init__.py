"""gemforge.sim: running accelerator programs without hardware — `fsim`, the bit-exact
functional simulator that is the ISA's executable specification, and `cosim`, the
cocotb co-simulation of the generated Verilog (Verilator, Icarus) checked against it."""
