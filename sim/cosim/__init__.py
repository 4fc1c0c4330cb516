"""Co-simulation of the generated Verilog: the cocotb testbench (`tb`), a plain-Verilog AXI DRAM
model, the simulator build cache and runner (`harness`), and random programs (`random_program`)."""
