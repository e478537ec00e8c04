"""A small cache of large output buffers, so repeated same-shape calls do not page-fault.

A fresh 25 MB ``np.empty`` is backed by pages the kernel must fault in and zero on first touch
(and, with transparent huge pages in ``madvise`` mode, sometimes compact memory first). In a
forward that is otherwise one pass at memory bandwidth, that costs 30-50 % more. Training and
inference loops call the same shapes again and again, and the previous output is usually dead by
then, so its memory can simply be reused, as torch's caching allocators do.

A pooled buffer is handed out as a *view*; every view (and every view of it, and a torch tensor
made by ``torch.from_numpy``) keeps a reference to the buffer, so the buffer is free again exactly
when its reference count is back to the pool's own. Semantics are those of ``np.empty``.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict

import numpy as np

MIN_BYTES = 1 << 22          # smaller arrays come from np.empty (malloc reuses them cheaply)
MAX_PER_SIZE = 4             # live + free buffers kept per byte size
MAX_SIZES = 8                # byte sizes remembered (least recently used dropped first)

_lock = threading.Lock()
_pool: OrderedDict[int, list[np.ndarray]] = OrderedDict()
_enabled = True


def set_pooling(enabled: bool) -> None:
    """Turn output-buffer reuse on or off (off also drops every cached buffer)."""
    global _enabled
    with _lock:
        _enabled = bool(enabled)
        if not _enabled:
            _pool.clear()


def _refs(bufs: list[np.ndarray], i: int) -> int:
    return sys.getrefcount(bufs[i])


_FREE_REFS = _refs([np.empty(1)], 0)   # the count of a buffer only the pool holds (calibrated)


def empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Like ``np.empty(shape, dtype)`` (C order), reusing a dead buffer of the same byte size."""
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if not _enabled or nbytes < MIN_BYTES:
        return np.empty(shape, dt)
    with _lock:
        bufs = _pool.get(nbytes)
        if bufs is not None:
            _pool.move_to_end(nbytes)
            for i in range(len(bufs)):
                if _refs(bufs, i) == _FREE_REFS:
                    return bufs[i].view(dt).reshape(shape)
            if len(bufs) >= MAX_PER_SIZE:
                return np.empty(shape, dt)
        else:
            bufs = _pool[nbytes] = []
            while len(_pool) > MAX_SIZES:
                _pool.popitem(last=False)
        buf = np.empty(nbytes, np.uint8)
        bufs.append(buf)
        return buf.view(dt).reshape(shape)
