"""Transparent huge pages for large tables, as NumPy asks for its own large arrays.

A random-row gather over a GPT-2-sized table (50257 x 768 float32, 154 MB) touches a different
4 KiB page on almost every row, so nearly every row read also misses the TLB and walks the page
tables. Backed by 2 MiB pages the whole table needs ~77 TLB entries. NumPy already calls
``madvise(MADV_HUGEPAGE)`` on every new array of 4 MiB or more; torch's CPU allocator does not.
:func:`advise_huge_pages` makes the same request for memory that is not yet touched (a fresh
``torch.empty``), before the first write decides its page size (measured: benchmarks/HISTORY.md).

It is advice: where the kernel ignores it (``transparent_hugepage`` set to ``never``), on other
platforms, or when the call fails, nothing changes but the page size.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

MADV_HUGEPAGE = 14           # <sys/mman.h>, Linux
HUGE_PAGE = 2 << 20
MIN_BYTES = 4 << 20          # NumPy's threshold

_MADVISE: list[Any] = []     # [libc madvise or None], looked up on first use


def _madvise() -> Any:
    if not _MADVISE:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                fn = ctypes.CDLL(None, use_errno=True).madvise
                fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
                fn.restype = ctypes.c_int
            except (OSError, AttributeError):
                fn = None
        _MADVISE.append(fn)
    return _MADVISE[0]


def advise_huge_pages(address: int, nbytes: int) -> bool:
    """Ask for huge pages on the whole 2 MiB pages inside ``[address, address + nbytes)``; True
    when the request was made and accepted. Regions under :data:`MIN_BYTES` are left alone."""
    if nbytes < MIN_BYTES:
        return False
    fn = _madvise()
    start = -(-address // HUGE_PAGE) * HUGE_PAGE
    end = (address + nbytes) // HUGE_PAGE * HUGE_PAGE
    if fn is None or end <= start:
        return False
    return bool(fn(start, end - start, MADV_HUGEPAGE) == 0)
