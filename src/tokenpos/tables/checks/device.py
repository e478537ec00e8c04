"""The message of a value check made on an accelerator (CUDA) without reading the values on the host.

On a non-CPU device the torch layers do not read ids or positions (that would block the host on
every call); they issue one device-side assert (``torch._assert_async``) whose message is this text.
It names what failed and the range expected, but not the index or the value (the device does not
report them); ``tokenpos.set_device_checks(True)`` reads the values instead and raises the typed
error (TokenIdError / PositionError) with both, at one host sync per call.
"""

from __future__ import annotations


def device_range_message(what: str, high: int | None, device: object) -> str:
    """``token ids on cuda:0 out of range: expected every value in [0, 1003) (device-side check...)``;
    ``high`` None: expected every value >= 0."""
    expected = f"in [0, {int(high)})" if high is not None else ">= 0"
    return (f"{what} on {device} out of range: expected every value {expected} (a device-side check; "
            "call tokenpos.set_device_checks(True) for a typed error with the index and the value, "
            "at one host sync per call)")
