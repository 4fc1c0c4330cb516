"""gemforge.driver: the host side — the Device API and its backends (`device`: fsim, RTL
simulators, and the CPU/GPU where the LLVM back ends run), the `gemforge` command
line (`cli`), the demo and the benchmarks."""

# The folder is installed as gemforge.driver; imported as `driver` (from the repository root) its
# modules would form a second tree whose classes differ from gemforge's own.
if __name__ != "gemforge.driver":
    raise ImportError(f"this folder is the package gemforge.driver: import gemforge.driver, not {__name__} "
                      "(`pip install -e .` or `make install` installs it)")
