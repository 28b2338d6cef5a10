"""N_pf without a value (`default_budget`) and the budgets that cannot prefetch anything (`prefetch_shortfall`),
the latter checked against what the PreSTO samplers actually do, with chains identical to the sequential ones."""

from __future__ import annotations

import pytest

from forerun.programs.sampler_config import (
    PrefetchConfig,
    SamplerConfig,
    default_budget,
    prefetch_shortfall,
    requests_per_transition,
)
from forerun.programs.sampler_factory import make_sampler
from forerun.programs.streaming_presto import StreamingPrestoSampler
from forerun.testing.chains import assert_same_chain
from forerun.testing.logit_table_model import LogitTableModel
from forerun.testing.stepped_streams import SteppedStreams

TEMPS = (0.25, 0.5, 1.0)
PROMPT = [1, 2, 3]


def _cfg(kind: str, seed: int = 0, m: int = 4, K: int = 6) -> SamplerConfig:
    return SamplerConfig(kind=kind, response_length=4, block_size=4, steps_per_block=K, seed=seed, mtm_candidates=m)


def _toy(kind: str) -> LogitTableModel:
    return LogitTableModel(4, seed=3, tempered_temperatures=TEMPS if kind == "multitry-mh" else ())


def test_default_budget_per_sampler():
    assert PrefetchConfig().budget is None
    assert default_budget(SamplerConfig()) == default_budget(SamplerConfig(kind="entropy-cut")) == 20
    assert requests_per_transition(_cfg("multitry-mh")) == 7
    assert default_budget(_cfg("multitry-mh")) == 21  # three levels of 2M − 1 = 7 requests
    assert default_budget(_cfg("multitry-mh", m=8)) == 45
    assert default_budget(_cfg("multitry-mh", m=2)) == 20  # 20 already pays for 6 levels of 3
    assert default_budget(_cfg("multitry-mh"), "node") == 20
    model = _toy("multitry-mh")
    assert make_sampler(model, _cfg("multitry-mh"), presto=True).prefetch.budget == 21
    assert make_sampler(model, _cfg("multitry-mh"), presto=True,
                        prefetch=PrefetchConfig(streaming=True)).prefetch.budget == 21
    assert make_sampler(model, _cfg("multitry-mh"), presto=True, prefetch=PrefetchConfig(budget=8)).prefetch.budget == 8
    assert PrefetchConfig(budget=5).resolved(_cfg("multitry-mh")).budget == 5
    with pytest.raises(ValueError, match="budget"):
        PrefetchConfig(budget=0)


@pytest.mark.parametrize("kind,m,unit,below,at", [
    ("power-mh", 4, "request", 1, 2),
    ("entropy-cut", 4, "request", 1, 2),
    ("multitry-mh", 2, "request", 5, 6),
    ("multitry-mh", 4, "request", 13, 14),
    ("multitry-mh", 4, "node", 1, 2),
])
def test_shortfall_says_exactly_when_rounds_prefetch_nothing(kind, m, unit, below, at):
    """Below the threshold every round scores its root's node only and realizes one transition; at it, some round
    of some seed scores more (the next level) - and the chains stay the sequential ones."""
    for budget in (below, at):
        pf = PrefetchConfig(budget=budget, budget_unit=unit)
        note = prefetch_shortfall(_cfg(kind, m=m), pf)
        prefetched = False
        for seed in range(4):
            model = _toy(kind)
            seq = make_sampler(model, _cfg(kind, seed, m)).run(PROMPT)
            pre = make_sampler(model, _cfg(kind, seed, m), presto=True, prefetch=pf).run(PROMPT)
            assert_same_chain(seq, pre, (kind, budget, seed))
            prefetched |= any(c.nodes_scored > 1 for c in pre.rounds)
            if note is not None:
                assert all(c.transitions == 1 for c in pre.rounds)
        assert (note is None) == prefetched == (budget == at), (budget, note)
    assert f"N_pf = {below} cannot prefetch anything for {kind}" in prefetch_shortfall(
        _cfg(kind, m=m), PrefetchConfig(budget=below, budget_unit=unit))


@pytest.mark.parametrize("kind,m,below", [("power-mh", 4, 1), ("multitry-mh", 2, 5)])
def test_shortfall_of_streaming_rows(kind, m, below):
    """Streaming: a prefetched node's rows start all together, beside the walk's own: from N_pf = 2 × one
    transition's requests; below that no row beyond the walk's ever runs."""
    for budget in (below, below + 1):
        pf = PrefetchConfig(budget=budget, streaming=True)
        note = prefetch_shortfall(_cfg(kind, m=m), pf)
        most = 0
        for seed in range(3):
            model = _toy(kind)
            seq = make_sampler(model, _cfg(kind, seed, m)).run(PROMPT)
            streams = SteppedStreams(model)
            res = StreamingPrestoSampler(model, _cfg(kind, seed, m), pf, streams=streams).run(PROMPT)
            assert_same_chain(seq, res, (kind, budget, seed))
            most = max(most, streams.max_rows)
        assert (note is None) == (most > requests_per_transition(_cfg(kind, m=m))) == (budget > below)


def test_no_shortfall_with_one_transition_per_block_or_at_the_defaults():
    assert prefetch_shortfall(_cfg("multitry-mh", K=1), PrefetchConfig(budget=1)) is None
    for kind in ("power-mh", "entropy-cut", "multitry-mh"):
        for streaming in (False, True):
            assert prefetch_shortfall(_cfg(kind), PrefetchConfig(streaming=streaming)) is None


def test_multitry_default_budget_realizes_two_transitions_per_call():
    """At its default budget (three levels) PreSTO MultiTryMH realizes >= 2 transitions per model call on the toy,
    with the sequential chain."""
    calls = transitions = 0
    for seed in range(4):
        model = _toy("multitry-mh")
        cfg = SamplerConfig(kind="multitry-mh", response_length=8, block_size=8, steps_per_block=10, seed=seed)
        seq = make_sampler(model, cfg).run(PROMPT)
        pre = make_sampler(model, cfg, presto=True).run(PROMPT)
        assert_same_chain(seq, pre, seed)
        calls, transitions = calls + pre.num_calls, transitions + pre.transitions
    assert transitions / calls >= 2.0
