"""gemforge.hw: the accelerator — its parameter set (`config`), instruction set (`isa`),
relocatable programs (`program`), assembler (`asm`), register map (`regmap`), the
Amaranth gateware (`gateware`) and the generation of Verilog and documentation
(`generate`). It depends on nothing else of gemforge: everything else depends on it."""

# The folder is installed as gemforge.hw; imported as `hw` (from the repository root) its
# modules would form a second tree whose classes differ from gemforge's own.
if __name__ != "gemforge.hw":
    raise ImportError(f"this folder is the package gemforge.hw: import gemforge.hw, not {__name__} "
                      "(`pip install -e .` or `make install` installs it)")
