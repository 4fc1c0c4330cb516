"""gemforge.driver: the host side — the Device API and its backends (`device`: fsim, RTL
simulators, and the CPU/GPU where the LLVM back ends run), the `gemforge` command
line (`cli`), the demo and the benchmarks."""
