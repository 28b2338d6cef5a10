"""DrawnSequence: the gate tasks' windows, drawn when first reached, replayed when read again."""

from __future__ import annotations

import itertools

import pytest

from forerun.eval.preposition import status_task, trend_task
from forerun.eval.preposition.drawn import DrawnSequence


def test_items_are_drawn_when_first_reached_and_kept():
    calls = []

    def draw():
        calls.append(1)
        for i in itertools.count():
            calls.append(i)
            yield i * i

    seq = DrawnSequence(10**14, draw)
    assert len(seq) == 10**14 and calls == []  # nothing drawn yet
    assert list(itertools.islice(seq, 4)) == [0, 1, 4, 9] and calls == [1, 0, 1, 2, 3]
    assert seq[2] == 4 and seq[-(10**14)] == 0 and seq[1:3] == [1, 4] and calls == [1, 0, 1, 2, 3]  # replayed
    assert seq[5] == 25 and list(itertools.islice(seq, 6)) == [0, 1, 4, 9, 16, 25]
    with pytest.raises(IndexError):
        seq[10**14]
    short = DrawnSequence(3, lambda: iter("abcdef"))
    assert list(short) == list(short) == ["a", "b", "c"] and short[::-1] == ["c", "b", "a"]


def test_the_tasks_drawn_windows_are_their_made_windows():
    """The same windows as the lists `make_windows` returns (its tests check what they are), and a huge count costs
    nothing until windows are read."""
    assert list(trend_task.drawn_windows(5, 8, seed=2)) == trend_task.make_windows(5, 8, seed=2)
    assert list(status_task.drawn_windows(5, seed=2)) == status_task.make_windows(5, seed=2)
    assert trend_task.drawn_windows(10**14, seed=0)[:3] == trend_task.make_windows(3, seed=0)
    calib = status_task.make_windows(64, seed=0)
    held = status_task.drawn_windows(64, seed=1, exclude=status_task.drawn_windows(64, seed=0))
    assert list(held) == status_task.make_windows(64, seed=1, exclude=calib) and not set(held) & set(calib)
    with pytest.raises(ValueError, match="length >= 2"):
        trend_task.drawn_windows(3, 1)
