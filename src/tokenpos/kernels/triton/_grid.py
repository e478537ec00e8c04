"""Launch-size arithmetic for the Triton wrappers, in plain Python.

``triton.cdiv`` and ``triton.next_power_of_2`` are Triton ``ConstexprFunction`` objects: called from
Python on every launch they go through Triton's call machinery, several microseconds each, three
per embedding launch (measured with cProfile: a third of the wrapper's own host time). These give
the same integers for the arguments the wrappers pass (n >= 1).
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints a >= 0, b > 0."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
