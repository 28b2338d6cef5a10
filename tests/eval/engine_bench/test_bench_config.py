"""EngineBenchConfig: a root too short for its suffixes' distinct cuts is refused with the length that would do."""

from __future__ import annotations

import re

import pytest

from forerun.testing.time_bound import stdout_within


def _fewest_root_tokens(cuts: int) -> int:
    """By the definition: a root of r tokens keeps its first max(1, r // 4) as prompt and one more out; every other
    position is a cut; the first r with `cuts` of them."""
    r = 1
    while r - max(1, r // 4) - 1 < cuts:
        r += 1
    return r


@pytest.mark.parametrize("suffixes", [1, 2, 3, 20, 47, 191, 1000])
def test_the_root_length_the_error_asks_for_is_the_fewest_that_has_the_cuts(suffixes):
    from forerun.eval.engine_bench.bench import EngineBenchConfig

    need = _fewest_root_tokens(suffixes + 1)
    with pytest.raises(ValueError, match=re.escape(f"use at least {need}")):
        EngineBenchConfig(root_tokens=need - 1, num_suffixes=suffixes)
    EngineBenchConfig(root_tokens=need, num_suffixes=suffixes)  # enough


def test_a_huge_suffix_count_is_refused_at_once():
    """`forerun bench engine --suffixes 100000000000000` scanned every root length up to 4e14 for the one to ask
    for: hours before the model loaded, no progress bar."""
    code = ("from forerun.eval.engine_bench.bench import EngineBenchConfig\n"
            "try:\n    EngineBenchConfig(num_suffixes=10**14)\n"
            "except ValueError as e:\n    print(e)\n")
    out = stdout_within(code, 60, "EngineBenchConfig(num_suffixes=10**14)")
    need = int(re.search(r"use at least (\d+)", out).group(1))
    room = lambda r: r - max(1, r // 4) - 1  # noqa: E731 - the definition, as above
    assert room(need) >= 10**14 + 1 > room(need - 1)
