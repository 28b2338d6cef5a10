"""The end of a response: what every method is graded on, and what the forced-answer pass continues."""

from __future__ import annotations

from typing import Sequence


def cut_at_eos(ids: Sequence[int], eos_token_ids: Sequence[int]) -> list[int]:
    """The response up to and including its first EOS (a fixed-horizon MH chain may run past it)."""
    eos = {int(t) for t in eos_token_ids}
    for i, t in enumerate(ids):
        if int(t) in eos:
            return [int(x) for x in ids[: i + 1]]
    return [int(x) for x in ids]
