"""Non-temporal (streaming) stores for numba kernels that write large outputs once.

A normal store to a line that is not in cache first reads that line from memory ("read for
ownership"), so writing an output of X bytes moves 2X bytes. A non-temporal store writes the whole
64-byte line straight to memory: X bytes. For a 25 MB embedding output (larger than the caches,
read by the next layer from memory anyway) that can separate "gather * scale + pos" from a bare
gather. It is opt-in (``embedding_forward(..., stream=True)``): it measured slower than plain
stores on a Xeon guest with a 300 MB L3 (the output buffer stays cached), and no faster on an EPYC
guest with a 32 MiB one (16 bench runs: 0.78-1.09x the plain stores' speed for fp32, 0.78-1.01x
with dropout, 0.54-0.95x for bf16); see benchmarks/HISTORY.md.

:func:`stream_row` copies a finished row from an L1-resident scratch buffer to its destination:
plain stores up to the first 64-byte boundary, then one 64-byte non-temporal vector store per
line, then plain stores for the tail. ``dst_addr`` is the destination row's address (the caller
computes it from the array's base address), so any alignment of the output works. A kernel that
streams must call :func:`store_fence` before its parallel task ends, so the writes are visible to
the thread that joins it.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

LINE = 64


@intrinsic
def _stream_line(typingctx, dst, i, src, j):  # pragma: no cover - compiled
    """``dst[i : i + 64 // itemsize] = src[j : ...]``: one 64-byte non-temporal store (dst[i] aligned)."""
    sig = types.void(dst, i, src, j)

    def codegen(context, builder, signature, args):
        dty, _, sty, _ = signature.args
        da = context.make_array(dty)(context, builder, args[0])
        sa = context.make_array(sty)(context, builder, args[2])
        dp = cgutils.get_item_pointer(context, builder, dty, da, [args[1]], wraparound=False)
        sp = cgutils.get_item_pointer(context, builder, sty, sa, [args[3]], wraparound=False)
        nbytes = dty.dtype.bitwidth // 8
        vt = ir.VectorType(context.get_value_type(dty.dtype), LINE // nbytes)
        v = builder.load(builder.bitcast(sp, vt.as_pointer()), align=nbytes)
        st = builder.store(v, builder.bitcast(dp, vt.as_pointer()), align=LINE)
        st.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def store_fence(typingctx):  # pragma: no cover - compiled
    """A full fence (``mfence`` on x86): orders this thread's non-temporal stores before what follows."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return sig, codegen


@njit(inline="always", cache=True)
def stream_row(dst, src, dst_addr):  # pragma: no cover - compiled
    """``dst[:] = src[:]`` (1-D, same dtype and length); full 64-byte lines are non-temporal."""
    n = dst.shape[0]
    isz = dst.itemsize
    per = LINE // isz
    head = ((LINE - dst_addr % LINE) % LINE) // isz
    if head > n:
        head = n
    for d in range(head):
        dst[d] = src[d]
    d = head
    while d + per <= n:
        _stream_line(dst, d, src, d)
        d += per
    for t in range(d, n):
        dst[t] = src[t]
