"""Dynamic chunking for the backward and optimiser kernels' parallel loops.

A statically split loop finishes when its slowest thread does; on a small shared machine one
thread may wait a whole scheduler tick before it runs its share. Small dynamic chunks let the
running thread take over the work. ``numba.parallel_chunksize`` is per calling thread, so this is
safe to use from several threads at once.

tokenpos never changes numba's thread count (``numba.set_num_threads`` is the user's setting);
the threading layer is chosen once in :mod:`._threading`. The forward kernels need neither: their
tasks are already small and TBB balances them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numba

from tokenpos.kernels._threading import parallel_guard


@contextmanager
def launch(n_items: int, nbytes: int = 0, *, max_chunk: int = 64) -> Iterator[None]:
    """Run the enclosed numba parallel call with dynamic chunks of at most ``max_chunk`` items
    (inside :func:`._threading.parallel_guard`, which serialises launches on the workqueue layer).

    ``nbytes`` (the call's memory traffic) is accepted for the callers' sake and not used.
    """
    del nbytes
    chunk = max(1, min(max_chunk, n_items // (8 * numba.get_num_threads())))
    with parallel_guard(), numba.parallel_chunksize(chunk):
        yield
