"""A sequence whose items are drawn when they are first reached: the windows of the gate's calibration tasks.

`forerun calibrate gate --windows 100000000000000` drew every window before the model loaded, with no progress
bar (hours, memory without bound); a `DrawnSequence` of the same windows has its length at once, draws each window
as the run reaches it (the run's progress counts the drawing) and keeps it, so iterating it again replays the same
windows in the same order.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence, TypeVar, overload

T = TypeVar("T")

__all__ = ["DrawnSequence"]


class DrawnSequence(Sequence[T]):
    """The first `n` items of the iterator `draw()` returns, drawn as they are first reached and kept."""

    def __init__(self, n: int, draw: Callable[[], Iterator[T]]) -> None:
        self._n = n
        self._draw = draw
        self._source: Iterator[T] | None = None
        self._items: list[T] = []

    def __len__(self) -> int:
        return self._n

    def _reach(self, count: int) -> None:
        if self._source is None:
            self._source = self._draw()
        while len(self._items) < count:
            self._items.append(next(self._source))

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._n))]
        i = index + self._n if index < 0 else index
        if not 0 <= i < self._n:
            raise IndexError(f"index {index} out of range for {self._n} items")
        self._reach(i + 1)
        return self._items[i]

    def __iter__(self) -> Iterator[T]:
        for i in range(self._n):
            self._reach(i + 1)
            yield self._items[i]
