"""The native core, or its pure-Python twin when PYSCHED_PURE=1.

Everything else in pysched imports the hot paths from here, so a run with
PYSCHED_PURE=1 exercises the whole scheduler on the reference implementations.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

# Type checkers see the native signatures; the twins match them.
if os.environ.get("PYSCHED_PURE") == "1" and not TYPE_CHECKING:
    from pysched._reference.codec import decode, encode_batch
    from pysched._reference.jitter import jitter_offset, jitter_offsets, plan_buckets, shard_for
    from pysched._reference.loader import load_page
    from pysched._reference.wheel import TimingWheel

    IMPLEMENTATION = "reference"
else:
    from pysched._codec import decode, encode_batch
    from pysched._loader import load_page
    from pysched._native import TimingWheel, jitter_offset, jitter_offsets, plan_buckets, shard_for

    IMPLEMENTATION = "native"

__all__ = [
    "IMPLEMENTATION",
    "TimingWheel",
    "decode",
    "encode_batch",
    "jitter_offset",
    "jitter_offsets",
    "load_page",
    "plan_buckets",
    "shard_for",
]
