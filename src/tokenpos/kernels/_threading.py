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

So tokenpos asks for ``omp`` when torch is already loaded (``import tokenpos.torch`` imports torch
first), else ``tbb`` (the ``tbb`` package, a dependency), else ``workqueue``:

- **omp, one pool with torch** (Linux). torch's CPU wheels carry their own ``libgomp.so.1``; :func:`configure`
  makes it global (``RTLD_GLOBAL``) before numba's ``omppool`` loads, so numba's ``GOMP_parallel``
  binds to torch's runtime and the kernels run on torch's own intra-op threads. With two pools
  (tbb), a kernel called right after a torch op shared the cores with torch's still-spinning OpenMP
  threads: measured in model conditions (``benchmarks/experiments/exp_pool.py``, benchmarks/HISTORY.md,
  2026-11-27) the RoPE kernel's median took 47.6 ms on tbb and 24.4 ms on torch's pool, the forward
  14.0 against 10.4 ms (tbb with ``OMP_WAIT_POLICY=PASSIVE``: 24.9 and 9.3 ms; the quietest of three
  runs, the two others on a loaded machine measured mostly the load).
  numba's omp pool kills a forked child that launches a parallel kernel (``SIGTERM``: "fork()
  called from a process already using GNU OpenMP"), so after a fork the child runs every kernel
  on its calling thread (:func:`parallel`); torch's own ops hang in such a child, tokenpos's do not.
- **tbb** (no torch loaded): fork-safe and thread-safe. Its wheel puts ``libtbb.so.12`` in
  ``<prefix>/lib``, which the dynamic loader does not search in a virtual environment, so
  :func:`configure` loads it by path first; then numba's ``tbbpool`` finds it.
- **workqueue** (neither loads): fork-safe; tokenpos serialises its own parallel launches with
  one lock (:func:`parallel_guard`), so threads still cannot abort it; they only take turns.

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
from typing import Any

import numba
from numba.core import config as _numba_config
from numba.np.ufunc import parallel as _numba_parallel  # (imported by numba itself)

_lock = threading.Lock()
_chosen: str | None = None        # what configure() asked numba for (None: left to the user/numba)
_serial_only = False              # True in a forked child of a process that launched numba's omp pool


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


def torch_gomp() -> str | None:
    """The path of the OpenMP runtime bundled with the torch already imported (None: torch not
    imported, or a build without one, which uses the system's ``libgomp``)."""
    init = getattr(sys.modules.get("torch"), "__file__", None)
    if init is None:
        return None
    found = sorted(glob.glob(os.path.join(os.path.dirname(init), "lib", "libgomp*.so*")))
    return found[0] if found else None


def _load_omp() -> bool:
    """Make torch's OpenMP runtime global, then load numba's omp pool; True if it loads (torch imported,
    Linux: elsewhere torch ships another OpenMP runtime than the GNU one numba's pool is built for)."""
    if "torch" not in sys.modules or not sys.platform.startswith("linux"):
        return False
    path = torch_gomp()
    try:
        if path:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)        # numba's GOMP_* calls now bind to it
        from numba.np.ufunc import omppool  # type: ignore[attr-defined]  # noqa: F401 - the import is the test
    except (OSError, ImportError):
        return False
    return True


def _launched() -> bool:
    return bool(getattr(_numba_parallel, "_is_initialized", False))


def configure() -> str | None:
    """Choose omp on torch's runtime (torch imported), else tbb, else workqueue, unless the user chose
    or numba already launched; returns the choice."""
    global _chosen
    user_set = str(_numba_config.THREADING_LAYER).lower() != "default"  # type: ignore[attr-defined]
    if user_set or _launched():
        _chosen = None
        return None
    _chosen = "omp" if _load_omp() else "tbb" if _load_tbb() else "workqueue"
    _numba_config.THREADING_LAYER = _chosen  # type: ignore[attr-defined]  # set by numba at import
    return _chosen


def _after_fork_in_child() -> None:
    global _serial_only, _twin_lock
    _twin_lock = threading.Lock()
    _serial_only = _serial_only or (_launched() and layer() == "omp")


os.register_at_fork(after_in_child=_after_fork_in_child)


def serial_only() -> bool:
    """True in a forked child of a process whose numba omp pool was launched: a parallel launch
    would kill this process, so every kernel runs on the calling thread (:func:`parallel`)."""
    return _serial_only


_twins: dict[object, object] = {}
_twin_lock = threading.Lock()


def parallel(core: Any, serial: Any = None) -> Any:
    """The compiled function to call for the ``parallel=True`` kernel ``core``: ``core`` itself, or,
    where :func:`serial_only`, ``serial`` (a hand-written serial core) or else ``core``'s own code
    compiled without ``parallel`` (``prange`` runs as ``range``: the same bits; compiled on first
    use in the child, not cached on disk, where it would share ``core``'s cache entry)."""
    if not _serial_only:
        if not _pool_started:
            _start_pool()
        return core
    if serial is not None:
        return serial
    with _twin_lock:
        if core not in _twins:
            _twins[core] = numba.njit(core.py_func)
        return _twins[core]


_pool_started = False


def _start_pool() -> None:
    """Launch numba's threads before the first parallel kernel, keeping torch's thread count: on torch's
    OpenMP runtime (omp), numba's launch sets the calling thread's OpenMP thread count to numba's own (the CPU
    count), so a ``torch.set_num_threads(1)`` was undone by the first large tokenpos call, every later torch op
    ran on more threads and every compiled graph recompiled ("GLOBAL_STATE changed: num_threads")."""
    global _pool_started
    if _chosen == "omp" and not _launched():
        import torch

        threads = torch.get_num_threads()
        _numba_parallel._launch_threads()  # type: ignore[attr-defined]
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
    _pool_started = True


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
