"""The numba threading layer of tokenpos's kernels: chosen once, when ``tokenpos.kernels`` is imported.

numba runs every ``parallel=True`` kernel on one process-wide threading layer, picked at the first
parallel launch and fixed from then on. The three layers differ in the two ways that matter here:

============  =====================================  ==========================================
layer         fork after a parallel call             parallel calls from several threads
============  =====================================  ==========================================
``tbb``       safe (children start a fresh pool)     safe
``omp``       the child aborts ("fork() called from  safe
              a process already using GNU OpenMP");
              ``multiprocessing.Pool`` (fork) hangs
``workqueue`` safe                                   not safe: concurrent launches abort
============  =====================================  ==========================================

So tokenpos asks for ``tbb`` (the ``tbb`` package, a dependency). Its wheel puts ``libtbb.so.12``
in ``<prefix>/lib``, which the dynamic loader does not search in a virtual environment, so
:func:`configure` loads it by path first; then numba's ``tbbpool`` finds it. If TBB cannot be
loaded, tokenpos falls back to ``workqueue`` (fork-safe) and serialises its own parallel launches
with one lock (:func:`parallel_guard`), so threads still cannot abort it; they only take turns.

Nothing is changed when the user chose a layer (``NUMBA_THREADING_LAYER`` or
``numba.config.THREADING_LAYER`` set to anything but ``"default"``), or when numba's threads were
already launched before tokenpos was imported (the layer can no longer change): then
:func:`layer` reports what numba uses, and the lock is taken only when that is ``workqueue``.
The number of threads is numba's (``NUMBA_NUM_THREADS`` / ``numba.set_num_threads``, per thread);
tokenpos never changes it.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import sys
import threading

import numba
from numba.core import config as _numba_config
from numba.np.ufunc import parallel as _numba_parallel  # (imported by numba itself)

_lock = threading.Lock()
_chosen: str | None = None        # what configure() asked numba for (None: left to the user/numba)


def _tbb_candidates() -> list[str]:
    """Where a pip/conda ``tbb`` puts ``libtbb.so.12`` (or the macOS/Windows equivalent)."""
    names = ("libtbb.so.12", "libtbb.12.dylib", "tbb12.dll")
    dirs = {os.path.join(p, sub) for p in {sys.prefix, sys.exec_prefix, sys.base_prefix}
            for sub in ("lib", "Library/bin", "Lib")}
    return [f for d in sorted(dirs) for n in names for f in glob.glob(os.path.join(d, n))]


def _load_tbb() -> bool:
    """Make ``libtbb`` loadable for numba's ``tbbpool``; True if numba's TBB layer imports."""
    for path in _tbb_candidates():
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            break
        except OSError:
            continue
    try:
        from numba.np.ufunc import tbbpool  # type: ignore[attr-defined]  # noqa: F401 - the import is the test
    except ImportError:
        return False
    return True


def _launched() -> bool:
    return bool(getattr(_numba_parallel, "_is_initialized", False))


def configure() -> str | None:
    """Choose tbb (else workqueue) unless the user chose or numba already launched; returns the choice."""
    global _chosen
    user_set = str(_numba_config.THREADING_LAYER).lower() != "default"  # type: ignore[attr-defined]
    if user_set or _launched():
        _chosen = None
        return None
    _chosen = "tbb" if _load_tbb() else "workqueue"
    _numba_config.THREADING_LAYER = _chosen  # type: ignore[attr-defined]  # set by numba at import
    return _chosen


def layer() -> str:
    """The layer numba uses (or will use at its first parallel launch)."""
    if _launched():
        return str(numba.threading_layer())
    return _chosen or str(_numba_config.THREADING_LAYER)  # type: ignore[attr-defined]


_lock_needed: bool | None = None   # cached once numba has launched (the layer is fixed from then on)


def _needs_lock() -> bool:
    global _lock_needed
    if _lock_needed is not None:
        return _lock_needed
    need = layer() == "workqueue"
    if _launched():
        _lock_needed = need
    return need


_NO_LOCK = contextlib.nullcontext()


def parallel_guard() -> contextlib.AbstractContextManager[None]:
    """``with parallel_guard():`` around a parallel kernel launch: the launch lock on the
    (thread-unsafe) workqueue layer, else a no-op context (reentrant, shared)."""
    return _lock if _needs_lock() else _NO_LOCK  # type: ignore[return-value]
