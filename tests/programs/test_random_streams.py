from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from forerun.programs.random_streams import DecisionStream, SEED_RANGE, prompt_key, uniform_cut


def test_inputs_are_pure_functions_of_the_key():
    a = DecisionStream(10086, prompt_key([1, 2, 3]), 1)
    b = DecisionStream(10086, prompt_key([1, 2, 3]), 1)
    for j in (0, 5, 99):
        assert a.cut_uniform(j) == b.cut_uniform(j)
        assert a.suffix_seed(j) == b.suffix_seed(j)
        assert a.accept_log_uniform(j) == b.accept_log_uniform(j)
        assert a.suffix_seed(j, 2) == b.suffix_seed(j, 2)
    # order of evaluation does not matter (no hidden generator state)
    assert [a.cut_uniform(j) for j in (3, 1, 2)] == [b.cut_uniform(j) for j in (3, 1, 2)]


def test_keys_separate_prompts_blocks_transitions_and_purposes():
    base = DecisionStream(1, prompt_key([5]), 1)
    others = [DecisionStream(2, prompt_key([5]), 1), DecisionStream(1, prompt_key([6]), 1), DecisionStream(1, prompt_key([5]), 2)]
    for o in others:
        assert o.cut_uniform(0) != base.cut_uniform(0)
    assert base.cut_uniform(0) != base.cut_uniform(1)
    assert base.suffix_seed(0, 0) != base.suffix_seed(0, 1) != base.reference_seed(0, 1)
    assert base.cut_uniform(0) != base.select_uniform(0)


def test_laws():
    s = DecisionStream(7, 11, 1)
    u = np.array([s.cut_uniform(j) for j in range(3000)])
    assert stats.kstest(u, "uniform").pvalue > 1e-3
    logu = np.array([s.accept_log_uniform(j) for j in range(3000)])
    assert np.all(logu <= 0) and np.all(np.isfinite(logu))
    assert stats.kstest(np.exp(logu), "uniform").pvalue > 1e-3
    cuts = [uniform_cut(x, 8) for x in u]
    assert stats.chisquare(np.bincount(cuts, minlength=8)).pvalue > 1e-3
    assert all(0 <= s.suffix_seed(j) < SEED_RANGE for j in range(50))
    assert sorted(set(s.slot_choice(j, 0, 3) for j in range(100))) == [0, 1, 2]


def test_bad_input():
    with pytest.raises(ValueError, match="block"):
        DecisionStream(1, 1, 0)
    with pytest.raises(ValueError, match="seed"):
        DecisionStream(-1, 1, 1)
    with pytest.raises(ValueError, match="transition"):
        DecisionStream(1, 1, 1).cut_uniform(-1)
    with pytest.raises(ValueError, match="prompt_ids"):
        prompt_key([])
    with pytest.raises(ValueError, match="horizon"):
        uniform_cut(0.5, 0)
    assert prompt_key([1, 2]) == prompt_key((1, 2)) != prompt_key([2, 1])
