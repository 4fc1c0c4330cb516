"""The GPU back end (being built in this change)."""

def stages(target):
    raise NotImplementedError("the GPU back end is not built yet")
