"""The compiler's error base class: every refusal the compiler makes derives from it,
so front ends (the CLI) can report any of them as one clear line."""

__all__ = ["CompileError"]


class CompileError(ValueError):
    """A tensor expression, schedule or operator cannot be compiled for this config."""
