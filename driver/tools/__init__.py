"""gemforge.driver.tools: the `gemforge` command line (`cli`) and what it drives on top of the
runtime — benchmarks (`bench*`), design sweeps (`sweep`, `workloads`), the demo (`demo*`),
regression runs (`regression`), single-operator runs (`operators`) and RTL performance
counters (`rtl_perf`)."""
