"""A software prefetch for numba kernels (``llvm.prefetch``), for gathers of scattered rows.

A gather of random table rows is latency-bound: each row starts a new memory stream that the
hardware prefetcher has not seen. Asking for row ``n + k`` while copying row ``n`` hides that.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic


def _make_prefetch(locality: int):
    return intrinsic(lambda typingctx, arr, i: _prefetch_sig(arr, i, locality))


def _prefetch_sig(arr, i, locality):  # pragma: no cover - compiled
    """Prefetch for reading the cache line holding ``arr[i]`` of a 1-D array (0..3: far..L1)."""
    sig = types.void(arr, i)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, locality),
                          ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


_prefetch_element = _make_prefetch(3)     # prefetcht0: into L1 (and L2, L3)
_prefetch_element_l2 = _make_prefetch(2)  # prefetcht1: into L2 (and L3)


@njit(inline="always", cache=True)
def prefetch_row(row):  # pragma: no cover - compiled
    """Prefetch every 64-byte line of a contiguous 1-D row into L1."""
    step = max(1, 64 // row.itemsize)
    for j in range(0, row.shape[0], step):
        _prefetch_element(row, j)


@njit(inline="always", cache=True)
def prefetch_row_l2(row):  # pragma: no cover - compiled
    """Prefetch every 64-byte line of a contiguous 1-D row into L2 (for rows needed later)."""
    step = max(1, 64 // row.itemsize)
    for j in range(0, row.shape[0], step):
        _prefetch_element_l2(row, j)


@njit(inline="always", cache=True)
def prefetch_line(row, i):  # pragma: no cover - compiled
    """Prefetch the 64-byte line holding ``row[i]`` (a contiguous 1-D row) into L1."""
    _prefetch_element(row, i)


@njit(inline="always", cache=True)
def prefetch_line_l2(row, i):  # pragma: no cover - compiled
    """Prefetch the 64-byte line holding ``row[i]`` (a contiguous 1-D row) into L2."""
    _prefetch_element_l2(row, i)
