"""gemforge.driver: the host side, in two layers — the runtime (`runtime`: devices, the compiled
model's executor and artefact, profiles) and the tools on top of it (`tools`: the `gemforge`
command line, benchmarks, sweeps, the demo, regression runs)."""

# The folder is installed as gemforge.driver; imported as `driver` (from the repository root) its
# modules would form a second tree whose classes differ from gemforge's own.
if __name__ != "gemforge.driver":
    raise ImportError(f"this folder is the package gemforge.driver: import gemforge.driver, not {__name__} "
                      "(`pip install -e .` or `make install` installs it)")
