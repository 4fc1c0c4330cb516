"""What the CPU and GPU back ends share: LLVM code generation from the loop IR (`codegen`),
workspaces and the O3 pipeline (`module`)."""
