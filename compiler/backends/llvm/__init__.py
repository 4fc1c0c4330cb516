"""LLVM code generation shared by the CPU and GPU back ends (`codegen`)."""
