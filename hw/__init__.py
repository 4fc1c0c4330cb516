"""gemforge.hw: the accelerator — its parameter set (`config`), instruction set (`isa`),
relocatable programs (`program`), assembler (`asm`), register map (`regmap`), the
Amaranth gateware (`gateware`) and the generation of Verilog and documentation
(`generate`). It depends on nothing else of gemforge: everything else depends on it."""
