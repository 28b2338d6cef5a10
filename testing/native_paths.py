"""Running a native-kernel call on both code paths: the vector code (AVX2 / AVX-512) and the portable scalar
definition it must match bit for bit."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

T = TypeVar("T")


def both_paths(kernels: Any, fn: Callable[[], T]) -> tuple[T, T]:
    """fn() with the vectorized code, then with the portable definition (the vector code is on again after)."""
    kernels.set_portable(False)
    try:
        fast = fn()
        kernels.set_portable(True)
        slow = fn()
    finally:
        kernels.set_portable(False)
    return fast, slow
