"""Gate math, eligibility rules and invalidation of the ready-distribution cache."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import log_softmax

from forerun.runtime_ext.preposition.ready_cache import ContextOverflow, StateChanged, ReadyDistribution, SessionClosed, SessionState, gap_from_top_logprobs, match_entry, ready_from_logits, ready_from_top_logprobs, top_two
from forerun.runtime_ext.preposition.gate import GateConfig, gate_decision, gate_fires, logit_gap


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
    return ready_from_logits(version, state, entry, logits, role="header" if relaxable else "entry")


def test_match_entry_rules():
    r = _ready([1, 2], [5, 6])
    assert r.decision_point == 4 and r.entry_len == 2 and r.logit_gap == 4.0 and r.top_token == 3
    assert match_entry(r, [5, 6], allow_relaxed=False) == "exact"
    assert match_entry(r, [5, 6, 7], allow_relaxed=False) == "prefix"
    assert match_entry(r, [5], allow_relaxed=False) == "none"
    assert match_entry(r, [9, 5, 6], allow_relaxed=True) == "none"  # a query entry never matches relaxed
    rr = _ready([1, 2], [5, 6], relaxable=True)
    assert match_entry(rr, [9, 5, 6], allow_relaxed=True) == "relaxed"
    assert match_entry(rr, [9, 5, 6], allow_relaxed=False) == "none"
    assert match_entry(rr, [9, 6, 6], allow_relaxed=True) == "none"
    with pytest.raises(ValueError, match="role"):
        ready_from_logits(0, [1], [5], np.arange(4.0), role="query")


def test_lookup_serves_each_query_its_own_distribution_and_adhoc_the_header():
    """§3.4: exact match -> its own distribution; any other query ending with the header -> the header's."""
    s = SessionState([1, 2])
    v, state = s.snapshot()
    standing = ready_from_logits(v, state, [7, 8, 5, 6], np.arange(16.0))  # query 7 8 + header 5 6
    header = ready_from_logits(v, state, [5, 6], -np.arange(16.0), role="header")
    for r in (standing, header):
        s.begin_preposition()
        assert s.install(r)
    look = s.lookup([7, 8, 5, 6], allow_relaxed=True)
    assert look.match == "exact" and look.ready is standing
    look = s.lookup([9, 9, 5, 6], allow_relaxed=True)  # ad-hoc (or another standing query)
    assert look.match == "relaxed" and look.ready is header and look.ready.top_token != standing.top_token
    assert s.counters.consumed == 1  # the relaxed match is no hit until its token is served
    s.consume(look.ready)
    assert s.counters.consumed == 2
    assert s.lookup([9, 9, 5, 6], allow_relaxed=False).match == "none"
    look = s.lookup([7, 8, 5, 6, 1], allow_relaxed=True)
    assert look.match == "prefix" and look.ready is standing
    s.check_counters()


def test_ready_from_top_logprobs_record():
    r = ready_from_top_logprobs(3, [1], [2], [[-2.0, 4, "b"], [-0.5, 9, "a"]])
    assert r.top_token == 9 and r.logit_gap == pytest.approx(1.5) and r.top_ids == (9, 4) and r.version == 3
    certain = ready_from_top_logprobs(0, [1], [2], [[0.0, 7, "x"], [float("-inf"), 3, "y"]])
    assert certain.top_token == 7 and certain.logit_gap == float("inf")  # γ = +inf: every other token impossible
    assert gate_fires(certain.logit_gap, 7, GateConfig()) and not gate_fires(certain.logit_gap, 7,
                                                                            GateConfig(threshold=float("inf")))
    masked = ready_from_logits(0, [1], [2], np.array([-np.inf, 3.0, -np.inf]))
    assert masked.top_token == 1 and masked.logit_gap == float("inf")
    with pytest.raises(ValueError, match="logit_gap"):
        ReadyDistribution(version=0, state_len=0, entry_ids=(5,), computed_from=(5,), top_token=0, logit_gap=np.nan)


def _installed(session: SessionState, entry=(5, 6), relaxable=False, pin=None):
    version, state = session.snapshot()
    session.begin_preposition()
    assert session.install(_ready(state, entry, relaxable=relaxable, version=version), pin=pin)
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
    s = _installed(_installed(SessionState([1, 2, 3, 4], frozen_len=1), pin="pin-a"), entry=(8,), pin="pin-b")
    assert s.ready_for([5, 6]) is not None and s.ready_for([8]) is not None
    mutate(s)
    # cleared by the mutation itself, before any serve-time check; the pre-paid entries are released
    assert s.held() == [] and s.ready_for([5, 6]) is None
    assert sorted(s.take_released_pins()) == ["pin-a", "pin-b"] and s.take_released_pins() == []
    assert s.invalidation_log[reason] == 2
    assert s.counters.invalidated == 2 and s.counters.consumed == 0
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
    s = _installed(SessionState([1]), pin="old")
    _installed(s, pin="new")  # the same entry again at the same version
    assert s.counters.invalidated == 1 and s.invalidation_log["superseded"] == 1
    assert s.take_released_pins() == ["old"]
    _installed(s, entry=(8,))  # another entry is held beside it
    assert s.lookup([8]).match == "exact" and s.lookup([5, 6]).match == "exact"
    s.check_counters()


def test_refused_install_releases_its_pin():
    s = SessionState([1, 2])
    version, state = s.snapshot()
    s.begin_preposition()
    s.append([3])
    assert not s.install(_ready(state, (5,), version=version), pin="p")
    assert s.take_released_pins() == ["p"]


def test_mutation_bounds_are_checked():
    s = SessionState([1, 2, 3], frozen_len=2)
    with pytest.raises(ValueError, match="n_drop"):
        s.shift_window(2)
    with pytest.raises(ValueError, match="rollback"):
        s.rollback(2)
    with pytest.raises(ValueError, match="non-negative"):
        s.append([-1])
    for bad in (["5"], "123", [1.0], [True]):
        with pytest.raises(ValueError, match="integer token ids"):
            s.append(bad)
    with pytest.raises(ValueError, match="integer token ids"):
        SessionState(["1", "2"])
    with pytest.raises(ValueError, match="frozen_len"):
        SessionState([1], frozen_len=3)
    s.shift_window(1)
    assert s.tokens == (1, 2) and s.version == 1


def test_context_window_is_checked_before_commit():
    """An append that leaves no room for the next entry is rejected with nothing changed (issue 10 item 4)."""
    s = _installed(SessionState([1, 2, 3], max_len=10))
    with pytest.raises(ContextOverflow, match="nothing was committed"):
        s.append([4] * 5, reserve=3)  # 3 + 5 + 3 > 10
    assert s.tokens == (1, 2, 3) and s.version == 0 and s.ready_for([5, 6]) is not None  # untouched
    assert s.append([4] * 4, reserve=3) == 1  # 3 + 4 + 3 = 10 fits
    with pytest.raises(ContextOverflow):
        SessionState(list(range(10)), max_len=10)


def test_expect_version_refuses_a_commit_onto_another_state():
    s = SessionState([1])
    v = s.version
    s.append([2])
    with pytest.raises(StateChanged, match="nothing was committed"):
        s.append([3], expect_version=v)
    assert s.tokens == (1, 2)
    assert s.append([3], expect_version=v + 1) == v + 2


def test_background_error_is_kept_once_on_its_session():
    s = SessionState([1])
    s.record_background_error(RuntimeError("first"))
    s.record_background_error(RuntimeError("second"))  # the first one is what the caller sees
    assert str(s.take_background_error()) == "first" and s.take_background_error() is None


def test_gate_config_rejects_bad_tau_and_answer_sets():
    for tau in (float("nan"), -0.5, -float("inf"), "2", True):
        with pytest.raises(ValueError, match="threshold"):
            GateConfig(threshold=tau)
    assert GateConfig(threshold=float("inf")).threshold == float("inf")
    with pytest.raises(ValueError, match="empty"):
        GateConfig(fast_answer_set=frozenset())
    for bad in ({"5"}, {1.5}, "abc", {True}):
        with pytest.raises(ValueError, match="fast_answer_set"):
            GateConfig(fast_answer_set=bad)
    gate = GateConfig(fast_answer_set={3, 7})
    gate.check_vocab(8)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        gate.check_vocab(7)
    forced = GateConfig.forced_open()
    assert gate_fires(0.0, 5, forced) and gate_decision(0.0, 5, forced).fires


def test_gate_decision_explains_itself():
    gate = GateConfig(threshold=2.0, fast_answer_set=frozenset({7}))
    d = gate_decision(3.0, 7, gate, token_text=" yes")
    assert d.fires and "3.00 > τ=2" in d.reason and "' yes'" in d.reason
    d = gate_decision(1.0, 8, gate)
    assert not d.fires and "1.00 ≤ τ=2" in d.reason and "∉ A" in d.reason


def snapshot(s):
    return s.tokens, s.version, [r.entry_ids for r in s.held()], repr(s.counters), dict(s.invalidation_log)


def test_every_mutation_that_raises_changed_nothing():
    """All-or-nothing at the state level: bad counts, a stale expect_version and a full context window are all
    refused before the first change (tokens, version, slots, counters, invalidation log)."""
    s = SessionState(list(range(1, 9)), frozen_len=2, max_len=12)
    s.begin_preposition()
    s.install(_ready(s.tokens, [9], version=s.version))
    before = snapshot(s)
    for bad in (lambda: s.shift_window(0), lambda: s.shift_window(7), lambda: s.shift_window(True),
                lambda: s.rollback(2.5), lambda: s.rollback(99), lambda: s.append([1, 2, 3, 4, 5]),
                lambda: s.append([1], reserve=4), lambda: s.append([1], expect_version=s.version - 1),
                lambda: s.shift_window(1, expect_version=s.version + 1),
                lambda: s.rollback(1, expect_version=s.version + 1),
                lambda: s.append([1], before_commit=lambda: None, expect_version=-5)):
        with pytest.raises((ValueError, ContextOverflow, StateChanged)):
            bad()
        assert snapshot(s) == before
    assert s.after_shift(2) == (1, 2, 5, 6, 7, 8) and s.after_rollback(3) == (1, 2, 3, 4, 5)
    assert snapshot(s) == before  # the previews change nothing


def test_before_commit_runs_after_the_checks_and_before_the_invalidation():
    s = SessionState([1, 2, 3])
    s.begin_preposition()
    ready = _ready(s.tokens, [4], version=s.version)
    s.install(ready)
    seen = []
    with pytest.raises(StateChanged):
        s.append([5], expect_version=7, before_commit=lambda: seen.append("ran"))
    assert seen == []  # a refused commit does not run it
    s.append([5], before_commit=lambda: (seen.append(len(s.held())), s.consume(ready)))
    assert seen == [1]  # it saw the slot still held: the hit counts as consumed, not invalidated
    assert s.counters.consumed == 1 and s.counters.invalidated == 0
    s.check_counters()


def test_lookup_without_consume_leaves_the_hit_to_the_caller():
    s = SessionState([1, 2])
    s.begin_preposition()
    s.install(_ready(s.tokens, [3]))
    look = s.lookup([3], consume=False)
    assert look.match == "exact" and s.counters.consumed == 0
    s.consume(look.ready)
    assert s.counters.consumed == 1
