"""Target-neutral passes on the loop IR, used by the LLVM back ends' stage lists.

- `partition_tiles`: full tiles of a partially tiled axis get constant loop
  extents (so they unroll and vectorize), the last tile keeps the general code.
"""

from .tile_partition import partition_tiles

__all__ = ["partition_tiles"]
