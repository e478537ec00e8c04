"""How a kernel launches its parallel loop: thread count and dynamic chunking.

Two facts of a small shared machine shape this:

- A parallel region with a statically split loop finishes when its slowest thread does. When the
  other core is busy (another process, or torch's OpenMP threads still spinning after their own
  region), that thread may wait a whole scheduler tick (~4-8 ms) before it runs its half. Dynamic
  chunks let the running thread take over the work.
- Below ~a few hundred KB of work, starting a second thread costs more than it saves, and under
  load it risks the same tick. Small calls run on the calling thread alone.

Neither changes results: every kernel computes each output element independently of the split.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numba

SERIAL_BYTES = 1 << 18          # below 256 KiB of traffic, run on one thread


@contextmanager
def launch(n_items: int, nbytes: int, *, max_chunk: int = 64) -> Iterator[None]:
    """Run the enclosed numba parallel call with dynamic chunks of at most ``max_chunk`` items."""
    old = numba.get_num_threads()
    threads = 1 if nbytes < SERIAL_BYTES else old
    chunk = max(1, min(max_chunk, n_items // (8 * threads)))
    if threads != old:
        numba.set_num_threads(threads)
    try:
        with numba.parallel_chunksize(chunk):
            yield
    finally:
        if threads != old:
            numba.set_num_threads(old)
