"""tokenpos._config: ``use_kernels`` is a per-thread override of the process-wide ``set_kernels`` switch."""

from __future__ import annotations

import threading

import pytest

import tokenpos


def test_overlapping_blocks_in_two_threads_see_their_own_setting_and_leave_the_switch_as_it_was() -> None:
    """A process-wide save and restore let thread B's ``use_kernels(False)`` read True inside its block and left
    the kernels off for good once both blocks were done (the interleaving is forced with events)."""
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, bool] = {}

    def first() -> None:
        with tokenpos.use_kernels(False):
            a_in.set()
            b_in.wait(5)
            seen["a"] = tokenpos.kernels_enabled()
        a_out.set()

    def second() -> None:
        a_in.wait(5)
        with tokenpos.use_kernels(False):
            b_in.set()
            a_out.wait(5)
            seen["b"] = tokenpos.kernels_enabled()
        seen["b after"] = tokenpos.kernels_enabled()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == {"a": False, "b": False, "b after": True}
    assert tokenpos.kernels_enabled()


def test_blocks_nest_and_the_process_wide_switch_still_applies_outside_them() -> None:
    assert tokenpos.kernels_enabled()
    with tokenpos.use_kernels(False):
        with tokenpos.use_kernels(True):
            assert tokenpos.kernels_enabled()
        assert not tokenpos.kernels_enabled()
    tokenpos.set_kernels(False)
    try:
        assert not tokenpos.kernels_enabled()
        with tokenpos.use_kernels(True):
            assert tokenpos.kernels_enabled()
        assert not tokenpos.kernels_enabled()
    finally:
        tokenpos.set_kernels(True)
    with pytest.raises(TypeError, match="use_kernels expects a bool, got 0"):
        with tokenpos.use_kernels(0):  # type: ignore[arg-type]
            pass
