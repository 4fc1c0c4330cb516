"""The CPU back end (being built in this change)."""

def stages(target):
    raise NotImplementedError("the CPU back end is not built yet")
