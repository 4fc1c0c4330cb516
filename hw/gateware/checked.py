"""Components that refuse bad constructor arguments before they exist.

Amaranth warns (``UnusedElaboratable``) about every elaboratable that is created
and never elaborated — including one whose constructor raised, so a user who
passes a bad argument would see the error *and* a "created but never used"
warning pointing at their own line. The warning is armed in
``Elaboratable.__new__``; a `CheckedComponent` runs its argument checks there
first, so a refused component is never created and only the error remains.
"""

from amaranth.lib import wiring

__all__ = ["CheckedComponent"]


class CheckedComponent(wiring.Component):
    """A `wiring.Component` whose `check_arguments` runs before the object is created.

    Subclasses override `check_arguments` with the parameters of their ``__init__``
    and raise there (``TypeError``/``ValueError``, one sentence naming the argument
    and what is allowed). Checks that need only the arguments belong there; the
    constructor keeps the work of building the signature.
    """

    def __new__(cls, *args, **kwargs):
        cls.check_arguments(*args, **kwargs)
        # src_loc_at=1: the source location Amaranth records (for its warnings and for the
        # "# amaranth: UnusedElaboratable=no" file directive) is the caller's, not this line.
        return super().__new__(cls, *args, src_loc_at=1, **kwargs)

    @classmethod
    def check_arguments(cls, *args, **kwargs):
        """Raise if the constructor's arguments are not acceptable; the default accepts all."""
