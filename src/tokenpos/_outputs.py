"""Reused memory for the kernels' large CPU outputs: a fresh output without page faults.

A fresh large output can be memory new to the process: its first write page-faults on every page
and the OS zeroes each one, which costs about as much as the embedding kernel itself (measured in
benchmarks/HISTORY.md: ``torch.empty`` faults on every call, 6144 faults for 25 MB). From
:data:`MIN_BYTES` (1 MiB) up, :class:`OutputCache` hands out blocks that earlier outputs have
released instead; smaller outputs take ``np.empty``.

``malloc`` alone is not enough. glibc keeps a freed block of up to 32 MiB in its heap, so an output
released and asked for again in a quiet process comes back without faults; but when other code in
the process (torch's own ops, between the layers of any model) frees blocks of a similar size,
glibc trims the top of its heap and the next output faults again: measured, a bf16 embedding
output of 12.5 MB took 485 faults per call beside torch eager ops, and 0 from this cache
(benchmarks/HISTORY.md, 2026-11-23). The cache's bookkeeping costs more than a ``malloc`` with cold caches
(about 80 us against 30 us), which the faults it saves outweigh.

When a block is free again is never guessed (no reference counts are read). Each output array is
made through a small owner object (:class:`_Owner`, via ``__array_interface__``): the array, every
NumPy view of it, a ``torch.from_numpy`` tensor, its views, ``.numpy()`` and DLPack capsules all
keep that owner alive. Only when the owner itself is garbage-collected does its weak reference's
callback return the block to the cache; until then no one else can be handed its memory.

- thread-safe: one re-entrant lock around the free lists (a garbage collection that runs inside
  the lock may release an owner on the same thread);
- fork-safe: a forked child starts with a fresh lock and empty free lists;
- bounded: at most ``max_bytes`` of free blocks are kept (0 turns the cache off); to make room, the
  blocks of the size released longest ago go first, so a workload whose shapes change does not
  fill the cache with sizes it no longer asks for; blocks under ``min_bytes`` (default
  :data:`MIN_BYTES`) are not cached: they are a few hundred pages at most.

The one instance lives in :mod:`tokenpos._config` (``set_output_cache``), with the other
process-wide state.
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from collections import OrderedDict
from typing import Any

import numpy as np

_Block = tuple[np.ndarray, int]   # (uint8 memory, its address)

MIN_BYTES = 1 << 20               # smaller outputs: np.empty
ALIGN = 64                        # every block starts on a cache line


class _Owner:
    """Exposes ``nbytes`` of a block as an array; the arrays made from it keep it alive."""

    __slots__ = ("__array_interface__", "__weakref__")

    def __init__(self, address: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.__array_interface__ = {"data": (address, False), "shape": shape, "typestr": dtype.str,
                                    "version": 3}


def _reset_in_child(ref: weakref.ref) -> None:
    cache = ref()
    if cache is not None:
        cache._reset_after_fork()


class OutputCache:
    """Free blocks by size; :meth:`empty` returns an uninitialised C-contiguous array.

    ``max_bytes`` bounds the free blocks kept (0: off); outputs under ``min_bytes`` bypass the
    cache (``np.empty``).
    """

    def __init__(self, max_bytes: int, min_bytes: int = MIN_BYTES) -> None:
        self._lock = threading.RLock()
        self._free: OrderedDict[int, list[_Block]] = OrderedDict()   # size -> blocks, LRU order
        self._free_bytes = 0
        self._lent: dict[weakref.ref, _Block] = {}            # owner (weakly) -> its block
        self.max_bytes = max_bytes
        self.min_bytes = min_bytes
        me = weakref.ref(self)                                  # the handler does not keep the cache alive
        os.register_at_fork(after_in_child=lambda: _reset_in_child(me))

    def _reset_after_fork(self) -> None:
        self._lock = threading.RLock()
        self._free, self._free_bytes = OrderedDict(), 0
        self._lent = {ref: block for ref, block in self._lent.items() if ref() is not None}

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised array of ``shape`` and ``dtype``: a reused block when one of its size is
        free, else new memory (returned to the cache when the array and all its views are gone)."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if not self.caches(nbytes):
            return np.empty(shape, dtype)
        with self._lock:                                        # one lock section: take a block, lend it
            blocks = self._free.get(nbytes)
            if blocks:
                block = blocks.pop()
                self._free_bytes -= nbytes
                if not blocks:
                    del self._free[nbytes]
            else:
                raw = np.empty(nbytes + ALIGN, np.uint8)
                start = (-raw.__array_interface__["data"][0]) % ALIGN
                mem = raw[start:start + nbytes]
                block = (mem, mem.__array_interface__["data"][0])   # the address, read once (~40 us cold)
            owner = _Owner(block[1], tuple(shape), dtype)
            self._lent[weakref.ref(owner, self._give)] = block
        return np.asarray(owner)

    def caches(self, nbytes: int) -> bool:
        """Whether an output of ``nbytes`` goes through the cache (large enough, and the cache on)."""
        return nbytes >= self.min_bytes and self.max_bytes > 0

    def _give(self, ref: weakref.ref) -> None:
        """Called when an owner dies: keep its block if it fits under ``max_bytes``."""
        with self._lock:
            block = self._lent.pop(ref, None)
            if block is None or block[0].nbytes > self.max_bytes:
                return                                             # dropped: freed with ``block``
            nbytes = block[0].nbytes
            while self._free_bytes + nbytes > self.max_bytes:   # evict the size released longest ago
                size, blocks = next(iter(self._free.items()))
                blocks.pop()
                self._free_bytes -= size
                if not blocks:
                    del self._free[size]
            self._free.setdefault(nbytes, []).append(block)
            self._free.move_to_end(nbytes)
            self._free_bytes += nbytes

    def clear(self) -> None:
        """Free every cached block (outputs still alive are unaffected)."""
        with self._lock:
            self._free, self._free_bytes = OrderedDict(), 0

    def free_bytes(self) -> int:
        """Bytes held in free blocks now."""
        return self._free_bytes
