"""Gate math, eligibility rules and invalidation of the ready-distribution cache."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import log_softmax

from forerun.runtime_ext.preposition.ready_cache import (
    GateConfig,
    ReadyDistribution,
    SessionClosed,
    SessionState,
    gap_from_top_logprobs,
    gate_fires,
    logit_gap,
    match_entry,
    ready_from_logits,
    ready_from_top_logprobs,
    top_two,
)


def test_top_two_matches_sort_oracle():
    rng = np.random.default_rng(0)
    for _ in range(200):
        v = rng.normal(size=int(rng.integers(2, 50))) * 3
        a, l1, b, l2 = top_two(v)
        order = np.argsort(-v, kind="stable")
        assert (a, b) == (order[0], order[1])
        assert l1 == v[order[0]] and l2 == v[order[1]]


def test_top_two_ties_take_lowest_id_like_argmax():
    v = np.array([0.0, 5.0, 5.0, 1.0])
    a, l1, b, l2 = top_two(v)
    assert (a, b) == (1, 2) and l1 - l2 == 0.0
    assert logit_gap(v) == 0.0


def test_gap_from_top2_logprobs_equals_logit_gap():
    """log-softmax shifts every logit by one constant, which cancels in ℓ(1) − ℓ(2)."""
    rng = np.random.default_rng(1)
    for _ in range(100):
        logits = rng.normal(size=64) * rng.uniform(0.1, 10)
        lp = log_softmax(logits)
        order = np.argsort(-lp)[:2]
        entries = [[float(lp[i]), int(i), "?"] for i in order[::-1]]  # unsorted on purpose
        token, gap = gap_from_top_logprobs(entries)
        assert token == int(np.argmax(logits))
        assert gap == pytest.approx(logit_gap(logits), abs=1e-9)


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="top-2"):
        gap_from_top_logprobs([[-0.1, 3, "a"]])
    with pytest.raises(ValueError, match="NaN"):
        top_two(np.array([0.0, np.nan]))
    with pytest.raises(ValueError, match="at least 2"):
        top_two(np.array([1.0]))
    with pytest.raises(ValueError, match="threshold"):
        GateConfig(threshold=float("nan"))
    with pytest.raises(ValueError, match="fast_answer_set"):
        GateConfig(fast_answer_set=frozenset({-1}))
    with pytest.raises(ValueError, match="computed_from"):
        ReadyDistribution(version=0, state_len=2, entry_ids=(5,), computed_from=(1, 5), top_token=0, logit_gap=1.0)
    with pytest.raises(ValueError, match="logit_gap"):
        ReadyDistribution(version=0, state_len=0, entry_ids=(5,), computed_from=(5,), top_token=0, logit_gap=-1.0)


def test_gate_is_eq12():
    gate = GateConfig(threshold=2.0, fast_answer_set=frozenset({7, 9}))
    assert gate_fires(2.5, 7, gate)
    assert not gate_fires(2.0, 7, gate)  # strict: γ > τ
    assert not gate_fires(9.0, 8, gate)  # argmax ∉ A
    assert gate_fires(0.1, 123, GateConfig(threshold=0.0))  # A = V
    for gap in np.linspace(0, 5, 21):
        for tok in range(12):
            assert gate_fires(gap, tok, gate) == (gap > 2.0 and tok in {7, 9})


def _ready(state, entry, relaxable=False, version=0):
    logits = np.zeros(16)
    logits[3] = 4.0
    return ready_from_logits(version, state, entry, logits, header_len=len(entry) if relaxable else 0)


def test_match_entry_rules():
    r = _ready([1, 2], [5, 6])
    assert r.decision_point == 4 and r.entry_len == 2 and r.logit_gap == 4.0 and r.top_token == 3
    assert match_entry(r, [5, 6], allow_relaxed=False) == "exact"
    assert match_entry(r, [5, 6, 7], allow_relaxed=False) == "prefix"
    assert match_entry(r, [5], allow_relaxed=False) == "none"
    assert match_entry(r, [9, 5, 6], allow_relaxed=True) == "none"  # not relaxable
    rr = _ready([1, 2], [5, 6], relaxable=True)
    assert match_entry(rr, [9, 5, 6], allow_relaxed=True) == "relaxed"
    assert match_entry(rr, [9, 5, 6], allow_relaxed=False) == "none"
    assert match_entry(rr, [9, 6, 6], allow_relaxed=True) == "none"
    standing = ready_from_logits(0, [1], [7, 8, 5, 6], np.arange(4.0), header_len=2)  # query 7 8 + header 5 6
    assert match_entry(standing, [7, 8, 5, 6], allow_relaxed=True) == "exact"
    assert match_entry(standing, [9, 5, 6], allow_relaxed=True) == "relaxed"  # ad-hoc query shares it
    with pytest.raises(ValueError, match="header_len"):
        ready_from_logits(0, [1], [5], np.arange(4.0), header_len=2)


def test_ready_from_top_logprobs_record():
    r = ready_from_top_logprobs(3, [1], [2], [[-2.0, 4, "b"], [-0.5, 9, "a"]])
    assert r.top_token == 9 and r.logit_gap == pytest.approx(1.5) and r.top_ids == (9, 4) and r.version == 3


def _installed(session: SessionState, entry=(5, 6), relaxable=False):
    version, state = session.snapshot()
    session.begin_preposition()
    assert session.install(_ready(state, entry, relaxable=relaxable, version=version))
    return session


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda s: s.append([9]), "append"),
        (lambda s: s.shift_window(1), "shift"),
        (lambda s: s.rollback(1), "rollback"),
        (lambda s: s.close(), "close"),
    ],
)
def test_every_mutation_invalidates_in_the_same_step(mutate, reason):
    s = _installed(SessionState([1, 2, 3, 4], frozen_len=1))
    assert s.slot.valid and s.slot.decoded
    mutate(s)
    # cleared by the mutation itself, before any serve-time check
    assert not s.slot.valid and not s.slot.decoded and s.slot.ready is None
    assert s.invalidation_log[reason] == 1
    assert s.counters.invalidated == 1 and s.counters.consumed == 0
    s.check_counters()
    if reason != "close":
        assert s.lookup([5, 6]).match == "none"
    else:
        with pytest.raises(SessionClosed):
            s.lookup([5, 6])


def test_consumed_then_invalidated_is_a_hit_not_waste():
    s = _installed(SessionState([1, 2]))
    assert s.lookup([5, 6]).match == "exact"
    assert s.lookup([5, 6]).match == "exact"  # a standing query and an ad-hoc one share it: one hit
    s.append([3])
    c = s.counters
    assert (c.installed, c.consumed, c.invalidated) == (1, 1, 0)
    assert c.hit_rate == 1.0 and c.wasted_fraction == 0.0
    s.check_counters()


def test_stale_install_is_discarded():
    s = SessionState([1, 2])
    version, state = s.snapshot()
    s.begin_preposition()
    s.append([7])  # update lands while the forward pass runs
    assert not s.install(_ready(state, (5,), version=version))
    assert s.counters.discarded == 1 and s.counters.installed == 0
    assert s.lookup([5]).match == "none"
    s.check_counters()


def test_superseded_install_counts_as_waste():
    s = _installed(SessionState([1]))
    _installed(s, entry=(8,))
    assert s.counters.invalidated == 1 and s.invalidation_log["superseded"] == 1
    assert s.lookup([8]).match == "exact" and s.lookup([5, 6]).match == "none"
    s.check_counters()


def test_mutation_bounds_are_checked():
    s = SessionState([1, 2, 3], frozen_len=2)
    with pytest.raises(ValueError, match="n_drop"):
        s.shift_window(2)
    with pytest.raises(ValueError, match="rollback"):
        s.rollback(2)
    with pytest.raises(ValueError, match="non-negative"):
        s.append([-1])
    with pytest.raises(ValueError, match="frozen_len"):
        SessionState([1], frozen_len=3)
    s.shift_window(1)
    assert s.tokens == (1, 2) and s.version == 1
