"""Exactness (Proposition 1): sequential and PreSTO samplers with the same seed give the identical chain."""

from __future__ import annotations

import math

import numpy as np
import pytest

from forerun.programs.prefetch_tree import node_depth
from forerun.testing.logit_table_model import LogitTableModel
from forerun.programs.transitions import ChainState
from forerun.programs.samplers import PrestoSampler, SequentialSampler
from forerun.programs.sampler_config import PrefetchConfig, SamplerConfig
from forerun.programs.power_smc import PowerSMCConfig
from forerun.runtime_ext.protocol import SamplingParams
from forerun.programs.sampler_factory import make_sampler
from forerun.testing.chains import assert_same_chain

TEMPS = (0.25, 0.5, 1.0)


def toy(kind: str, seed: int = 3, vocab: int = 5) -> LogitTableModel:
    return LogitTableModel(vocab, seed=seed, tempered_temperatures=TEMPS if kind == "multitry-mh" else ())


def run_pair(kind, seed, npf, *, n=8, block=4, K=10, vocab=5, model_seed=3, alpha=4.0, unit="request", **prefetch):
    model = toy(kind, model_seed, vocab)
    cfg = SamplerConfig(kind=kind, response_length=n, block_size=block, steps_per_block=K, seed=seed, alpha=alpha,
                        mtm_candidates=prefetch.pop("mtm_candidates", 4))
    seq = make_sampler(model, cfg).run([1, 2, 3], prompt_id="p")
    pf = PrefetchConfig(budget=npf, budget_unit=unit, **prefetch)
    pre = make_sampler(model, cfg, presto=True, prefetch=pf).run([1, 2, 3], prompt_id="p")
    return seq, pre


@pytest.mark.parametrize("unit", ["request", "node"])
@pytest.mark.parametrize("kind", ["power-mh", "entropy-cut"])
@pytest.mark.parametrize("npf", [1, 4, 20])
def test_identical_chains_many_seeds(kind, npf, unit):
    deferred_rounds = 0
    for seed in range(20):
        seq, pre = run_pair(kind, seed, npf, alpha=2.0 if seed % 2 else 4.0, unit=unit)
        assert_same_chain(seq, pre, f"seed {seed}")
        assert seq.transitions == 2 * 10
        for c in pre.rounds:
            if unit == "node":
                assert c.transitions <= c.nodes_scored + c.speculation_misses <= npf
            else:  # a round generates at most N_pf distinct requests; nodes of a paid depth are free
                assert c.generated_requests <= npf and c.transitions <= c.distinct_requests
        # a round that stopped before the cap at a node whose proposal was deferred
        deferred_rounds += sum(1 for c in pre.rounds if c.transitions < min(npf, 10) and c.nodes_scored > c.transitions)
    if npf > 1:
        assert deferred_rounds > 0


@pytest.mark.parametrize("unit", ["request", "node"])
@pytest.mark.parametrize("npf", [1, 4, 20])
def test_identical_chains_multitry(npf, unit):
    for seed in range(12):
        seq, pre = run_pair("multitry-mh", seed, npf, n=4, block=4, K=6, vocab=4, unit=unit)
        assert_same_chain(seq, pre, f"seed {seed}")
        if unit == "request":  # 2M - 1 = 7 requests per transition; the root's is made even above N_pf
            assert all(c.generated_requests <= max(npf, 7) for c in pre.rounds)


@pytest.mark.parametrize("kind", ["power-mh", "entropy-cut", "multitry-mh"])
@pytest.mark.parametrize("n,block,K,npf", [(9, 3, 5, 1), (9, 3, 7, 3), (15, 5, 3, 20), (7, 7, 11, 5), (6, 2, 9, 2)])
def test_identical_chains_odd_sizes_and_several_blocks(kind, n, block, K, npf):
    for seed in range(4):
        for unit in ("request", "node"):
            seq, pre = run_pair(kind, seed, npf, n=n, block=block, K=K, vocab=4, unit=unit,
                                mtm_candidates=2 if kind == "multitry-mh" else 4)
            assert_same_chain(seq, pre, f"{unit} seed {seed}")
            assert seq.transitions == (n // block) * K


@pytest.mark.parametrize("kind", ["power-mh", "entropy-cut", "multitry-mh"])
def test_identical_chains_without_reuse_and_with_a_small_node_cap(kind):
    for seed in range(5):
        for extra in ({"reuse_suffixes": False}, {"max_nodes": 2}, {"max_nodes": 1}):
            seq, pre = run_pair(kind, seed, 20, n=8, block=8, K=12, vocab=4, **extra,
                                mtm_candidates=2 if kind == "multitry-mh" else 4)
            assert_same_chain(seq, pre, f"seed {seed} {extra}")
            if "max_nodes" in extra:
                assert all(c.nodes_scored <= extra["max_nodes"] for c in pre.rounds)


def test_presto_uses_fewer_calls_and_records_nodes():
    seq, pre = run_pair("power-mh", 5, 20, n=12, block=12, K=30)
    assert seq.num_calls == 30 and pre.num_calls < 30
    assert pre.transitions_per_call > 1
    for call in pre.rounds:
        realized = [n for n in call.nodes if n.realized]
        assert len(realized) == call.transitions
        for node in call.nodes:
            assert node.cut <= node.parent_cut
            assert 0 <= node.accept_prob <= 1
            assert node.certainty_class in ("reject", "accept", "uncertain")
            assert node.cut_fraction == pytest.approx(node.cut / 12)
            assert node.depth == node_depth((node.node_id - 1) // 2)
            if node.realized:
                assert node.accepted is not None
    # the realized decisions, in order, are the chain's history
    realized = [n.accepted for c in pre.rounds for n in sorted(c.nodes, key=lambda n: n.depth) if n.realized]
    assert realized == pre.history


def test_entropy_cut_prefetches_below_acceptances_and_validates_the_cut():
    """EntropyCut requests below an acceptance at the root's cut and keeps a proposal only where the node's
    own cut (from its generated state) is the same: nodes below acceptances are scored, misses are counted,
    and every scored node's cut is the one its own state draws."""
    below, misses = 0, 0
    for seed in range(8):
        seq, pre = run_pair("entropy-cut", seed, 20, n=8, block=8, K=20, vocab=5)
        assert_same_chain(seq, pre, f"seed {seed}")
        below += sum(1 for c in pre.rounds for n in c.nodes if n.accepts_on_path > 0)
        misses += sum(c.speculation_misses for c in pre.rounds)
        for c in pre.rounds:
            assert all(n.cut <= n.parent_cut for n in c.nodes)
    assert below > 0 and misses > 0


def test_block_structure_and_extension_calls():
    model = toy("power-mh")
    cfg = SamplerConfig(kind="power-mh", response_length=9, block_size=3, steps_per_block=2, seed=1)
    res = SequentialSampler(model, cfg).run([1], prompt_id="x")
    assert len(res.response_ids) == 9
    assert [c.kind for c in res.calls] == ["extend", "mh", "mh"] * 3
    assert [c.block for c in res.calls] == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    # cuts range over the whole response so far (T = ℓB), never the prompt
    mh = [c for c in res.calls if c.kind == "mh"]
    assert all(0 <= n.cut < 3 * c.block for c in mh for n in c.nodes)
    # every requested prefix starts with the prompt
    assert all(r.prefix_ids[0] == 1 for call in model.calls for r in call)


def test_states_are_consistent_with_the_model():
    model = toy("power-mh")
    cfg = SamplerConfig(kind="power-mh", response_length=6, block_size=6, steps_per_block=8, seed=2)
    res = PrestoSampler(model, cfg, PrefetchConfig(budget=6)).run([1, 2])
    ids = [1, 2]
    for t, tok in enumerate(res.response_ids):
        assert res.state.logp0[t] == pytest.approx(model.log_p0(ids[-1], len(ids))[tok])
        assert res.state.logq[t] == pytest.approx(model.log_q(ids[-1], len(ids), 0.25)[tok])
        ids.append(tok)


def test_clock_is_used_for_call_times():
    ticks = iter(range(1000))
    model = toy("power-mh")
    cfg = SamplerConfig(kind="power-mh", response_length=4, block_size=4, steps_per_block=3, seed=2)
    res = SequentialSampler(model, cfg, clock=lambda: float(next(ticks))).run([1])
    assert all(c.wall_time == 1.0 for c in res.calls)
    assert res.call_time == 3.0 and res.time_per_call == 1.0 and res.transitions_per_call == 1.0


def test_predictive_traversal_keeps_the_chain():
    pytest.importorskip("forerun.programs.allocation")
    for kind in ("power-mh", "entropy-cut"):
        for seed in range(6):
            model = toy(kind)
            cfg = SamplerConfig(kind=kind, response_length=8, block_size=8, steps_per_block=12, seed=seed)
            seq = make_sampler(model, cfg).run([1, 2])
            pre = make_sampler(model, cfg, presto=True,
                               prefetch=PrefetchConfig(budget=5, traversal="predictive",
                                                       branch_prob=lambda node: 0.2 + 0.6 * node.cut_fraction)).run([1, 2])
            assert_same_chain(seq, pre, (kind, seed))


def test_config_validation():
    with pytest.raises(ValueError, match="kind"):
        SamplerConfig(kind="nope")
    with pytest.raises(ValueError, match="block_size"):
        SamplerConfig(response_length=10, block_size=3)
    with pytest.raises(ValueError, match="steps_per_block"):
        SamplerConfig(steps_per_block=0)
    with pytest.raises(ValueError, match="alpha"):
        SamplerConfig(alpha=0)
    with pytest.raises(ValueError, match="budget"):
        PrefetchConfig(budget=0)
    with pytest.raises(ValueError, match="branch_prob"):
        PrefetchConfig(traversal="predictive")
    assert SamplerConfig(alpha=4.0).tau == 0.25
    assert ChainState.empty().length == 0


@pytest.mark.parametrize("bad, match", [
    (dict(response_length=4.0, block_size=2.0), "response_length must be an integer"),
    (dict(steps_per_block=2.5), "steps_per_block must be an integer"), (dict(mtm_candidates=2.5), "mtm_candidates"),
    (dict(mtm_temperatures=(float("inf"),)), "mtm_temperatures must be finite"), (dict(alpha=float("inf")), "alpha"),
    (dict(temperature=float("nan")), "temperature"), (dict(seed=1.5), "seed"), (dict(stop_at_eos=(2.0,)), "stop_at_eos"),
])
def test_ill_typed_configs_are_refused_at_construction(bad, match):
    """They used to pass and fail deep inside a run (a TypeError in the block loop, a malformed token marker)."""
    with pytest.raises(ValueError, match=match):
        SamplerConfig(**bad)
    assert SamplerConfig(response_length=np.int64(8), block_size=np.int64(4)).num_blocks == 2


@pytest.mark.parametrize("bad", [dict(budget=2.5), dict(budget=True), dict(budget=float("nan")), dict(budget="20"),
                                 dict(max_nodes=2.5), dict(max_nodes=float("nan"))])
def test_ill_typed_prefetch_configs_are_refused_at_construction(bad):
    """N_pf = 2.5 or True ran (as 2.5 / 1), NaN failed at the first round, max_nodes = NaN ended in 'prefetch round
    collected no request': each is refused by name when the config is built."""
    with pytest.raises(ValueError, match=f"{next(iter(bad))}.* must be an integer"):
        PrefetchConfig(**bad)
    assert PrefetchConfig(budget=np.int64(7), max_nodes=np.int64(50)).budget == 7


def test_multitry_needs_tempered_logprobs():
    model = LogitTableModel(4, seed=1)  # no tempered temperatures
    cfg = SamplerConfig(kind="multitry-mh", response_length=4, block_size=4, steps_per_block=2)
    with pytest.raises(ValueError, match="temperature"):
        SequentialSampler(model, cfg).run([1])


@pytest.mark.parametrize("make", [
    lambda: SamplerConfig(alpha=2e6),  # τ = 1/α = 5e-7
    lambda: SamplerConfig(kind="entropy-cut", temperature=9e-7),
    lambda: SamplerConfig(kind="multitry-mh", mtm_temperatures=(0.25, 5e-7)),
    lambda: PowerSMCConfig(alpha=4e6),
])
def test_a_proposal_temperature_that_sglang_runs_greedy_is_refused(make):
    """Below 1e-6 SGLang (and SamplingParams, as it does) runs a request greedy and reports log p0: an MH ratio or an
    SMC weight built from the reported 'log q_τ' would use p0 instead, silently.  Such a τ is refused; 1e-6 is not."""
    with pytest.raises(ValueError, match="below 1e-06"):
        make()
    assert SamplerConfig(temperature=1e-6).tau == 1e-6 and PowerSMCConfig(alpha=1e6).tau == 1e-6
    assert SamplingParams(temperature=9.9e-7).temperature == 0.0  # the reason: such a request is greedy
