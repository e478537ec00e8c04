"""Run a worker on several threads at once and surface what any of them raised."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_threads(worker: Callable[[int], None], n: int = 4) -> None:
    """``worker(k)`` for k in range(n), each on its own thread; re-raises the first exception."""
    errors: list[BaseException] = []

    def guarded(k: int) -> None:
        try:
            worker(k)
        except BaseException as exc:                                        # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
