"""The board top level: the accelerator with block RAM for its DRAM and a UART bridge
to the host (`top.BoardTop`), its blocks (`uart`, `bridge`, `memory`), the bridge's
wire protocol (`protocol`) and wrappers for boards from amaranth-boards (`platforms`)."""
