"""The planning work of one PreSTO round is bounded by the prefetch budget, not by the steps left in the block.

A round's plan reads the cuts of its affordable depths only; drawing the cut of every remaining transition k..K−1
(a keyed generator each) made a chain of K steps cost O(K²) cut draws: `forerun sample --presto --K 100000` on the
tiny model ran about one transition per second.  Streaming PreSTO's per-decision work likewise stays bounded
(rows kept, history and started rows read).  The work is counted here, not timed.
"""

from __future__ import annotations

import pytest

from forerun.programs.sampler_config import PrefetchConfig, SamplerConfig
from forerun.programs.sampler_factory import make_sampler
from forerun.programs.samplers import PrestoSampler
from forerun.testing.chains import assert_same_chain
from forerun.testing.logit_table_model import LogitTableModel

TEMPS = (0.25, 0.5, 1.0)


class CountingKernel:
    """The sampler's kernel, counting the transitions whose cut it draws (`cuts` and `cut`)."""

    def __init__(self, kernel) -> None:
        self._kernel = kernel
        self.drawn = 0

    def __getattr__(self, name):
        return getattr(self._kernel, name)

    def cuts(self, state, transitions, stream):
        transitions = list(transitions)
        self.drawn += len(transitions)
        return self._kernel.cuts(state, transitions, stream)

    def cut(self, state, j, stream):
        self.drawn += 1
        return self._kernel.cut(state, j, stream)


def _presto(kind: str, K: int, npf: int, **prefetch) -> tuple[PrestoSampler, list[int]]:
    """A PreSTO sampler whose kernel counts cut draws; returns it with the per-plan draw counts it records."""
    model = LogitTableModel(4, seed=3, tempered_temperatures=TEMPS if kind == "multitry-mh" else ())
    cfg = SamplerConfig(kind=kind, response_length=6, block_size=6, steps_per_block=K, seed=7, alpha=2.0,
                        mtm_candidates=2)
    sampler = make_sampler(model, cfg, presto=True, prefetch=PrefetchConfig(budget=npf, **prefetch))
    counter = CountingKernel(sampler.kernel)
    sampler.kernel = counter
    per_plan: list[int] = []
    plan = sampler.plan

    def counted_plan(*args, **kwargs):
        before = counter.drawn
        out = plan(*args, **kwargs)
        per_plan.append(counter.drawn - before)
        return out

    sampler.plan = counted_plan
    return sampler, per_plan


@pytest.mark.parametrize("kind", ["power-mh", "entropy-cut", "multitry-mh"])
@pytest.mark.parametrize("traversal", ["bfs", "predictive"])
def test_a_plan_draws_the_cuts_of_its_affordable_depths_only(kind, traversal):
    """Without the suffix cache every depth costs >= 1 request, so a plan pays at most N_pf + 1 depths and its
    first chunk of N_pf + 2 cuts is all it draws, at K = 500 as at K = 20 (it drew the K − k left before)."""
    npf = 6
    extra = {"branch_prob": lambda node: 0.5} if traversal == "predictive" else {}
    for K in (20, 500):
        sampler, per_plan = _presto(kind, K, npf, traversal=traversal, reuse_suffixes=False, **extra)
        assert sampler.run([1, 2, 3], prompt_id="p").transitions == K
        assert max(per_plan) <= npf + 2, (K, per_plan[:5])


@pytest.mark.parametrize("kind", ["power-mh", "entropy-cut", "multitry-mh"])
def test_with_the_suffix_cache_a_plan_still_draws_a_bounded_number_of_cuts(kind):
    """Cached depths cost nothing and the plan reads on past them, but the cache holds at most what earlier rounds
    generated: the draws per plan do not grow with K."""
    npf = 6
    most = {}
    for K in (40, 600):
        sampler, per_plan = _presto(kind, K, npf)
        assert sampler.run([1, 2, 3], prompt_id="p").transitions == K
        most[K] = max(per_plan)
    assert most[600] <= 4 * (npf + 2), most


@pytest.mark.parametrize("kind", ["power-mh", "entropy-cut", "multitry-mh"])
@pytest.mark.parametrize("traversal", ["bfs", "predictive"])
def test_a_long_block_keeps_the_sequential_chain(kind, traversal):
    """Drawing the cuts lazily leaves the chain as it was: the sequential sampler's, over a block of 150 steps."""
    model = LogitTableModel(4, seed=3, tempered_temperatures=TEMPS if kind == "multitry-mh" else ())
    cfg = SamplerConfig(kind=kind, response_length=6, block_size=6, steps_per_block=150, seed=11, alpha=2.0,
                        mtm_candidates=2)
    extra = {"branch_prob": lambda node: 0.5} if traversal == "predictive" else {}
    seq = make_sampler(model, cfg).run([1, 2, 3], prompt_id="p")
    pre = make_sampler(model, cfg, presto=True, prefetch=PrefetchConfig(budget=6, traversal=traversal, **extra)
                       ).run([1, 2, 3], prompt_id="p")
    assert_same_chain(seq, pre, f"{kind} {traversal}")


class CountingList(list):
    """A list that counts the items its iterations hand out (sum(), comprehensions, for loops)."""

    read = 0

    def __iter__(self):
        for item in super().__iter__():
            CountingList.read += 1
            yield item


def _streaming_block_work(monkeypatch, K: int) -> tuple[int, int, int]:
    """A streaming chain of one block of K steps: (history items and started rows read by the planner and the
    window records, the most rows it kept after a decision, transitions)."""
    from forerun.programs import streaming_presto
    from forerun.programs.streaming_presto import StreamingPrestoSampler
    from forerun.testing.stepped_streams import SteppedStreams

    init, decided = streaming_presto._BlockRun.__init__, streaming_presto._BlockRun.decided
    kept: list[int] = []

    def counted_init(self, sampler, result, stream, block):
        result.history = CountingList(result.history)
        init(self, sampler, result, stream, block)
        self.started = CountingList(self.started)

    def counted_decided(self, *args):
        decided(self, *args)
        kept.append(len(self.by_rid))

    monkeypatch.setattr(streaming_presto._BlockRun, "__init__", counted_init)
    monkeypatch.setattr(streaming_presto._BlockRun, "decided", counted_decided)
    CountingList.read = 0
    model = LogitTableModel(5, seed=3)
    cfg = SamplerConfig(kind="power-mh", response_length=8, block_size=8, steps_per_block=K, seed=1, alpha=2.0)
    res = StreamingPrestoSampler(model, cfg, PrefetchConfig(budget=6, streaming=True),
                                 streams=SteppedStreams(model)).run([1, 2, 3], prompt_id="p")
    read = CountingList.read
    monkeypatch.undo()
    return read, max(kept), res.transitions


def test_streaming_work_per_decision_does_not_grow_with_the_chain(monkeypatch):
    """Streaming PreSTO kept every completed row of the block in its row tables (each decision's prune and each plan
    scanned them all), summed the whole history for the acceptance rate at every decision and scanned every started
    row for every window: O(K²) per block (K = 6000: 13.8 ms a transition, against 1.1 ms at K = 1000 after)."""
    short, long = _streaming_block_work(monkeypatch, 60), _streaming_block_work(monkeypatch, 600)
    assert short[2] == 60 and long[2] == 600
    # rows kept: the running ones (<= N_pf + the walk's own) and the completed ones of transitions still ahead
    # (measured: 12 at K = 60, 16 at K = 600; every row of the block before, 600+)
    assert long[1] <= 4 * 6, (short[1], long[1])
    # history and started rows are read a bounded number of times per decision (the window records read each
    # started row once)
    assert long[0] <= 10 * 600, long[0]


@pytest.mark.parametrize("kind", ["power-mh", "entropy-cut", "multitry-mh"])
@pytest.mark.parametrize("traversal", ["bfs", "predictive"])
def test_a_round_computes_each_cut_statistic_once(monkeypatch, kind, traversal):
    """The node records carry the root's statistics at their cut (`cut_statistics`), and every node of a depth has
    the depth's cut: each record recomputed them (about 20 % of a round's planning at 256 nodes).  Counted here:
    within one round no statistic of the root is computed twice at the same cut, and the records hold the values
    computed directly from the root."""
    from forerun.programs import cut_statistics

    computed: list[tuple[int, int]] = []
    original = cut_statistics.cut_statistics

    def counted(values, cut):
        computed.append((id(values), int(cut)))
        return original(values, cut)

    monkeypatch.setattr(cut_statistics, "cut_statistics", counted)
    per_round: list[list[tuple[int, int]]] = []
    roots = []

    def on_call(call):
        if call.kind in ("mh", "reuse"):  # (a block's extension computes none)
            per_round.append(list(computed))
            computed.clear()

    model = LogitTableModel(4, seed=3, tempered_temperatures=TEMPS if kind == "multitry-mh" else ())
    cfg = SamplerConfig(kind=kind, response_length=8, block_size=8, steps_per_block=30, seed=5, alpha=2.0,
                        mtm_candidates=2)
    extra = {"branch_prob": lambda node: 0.6} if traversal == "predictive" else {}
    sampler = make_sampler(model, cfg, presto=True, prefetch=PrefetchConfig(budget=6, traversal=traversal, **extra))
    round_ = sampler._round

    def recorded_round(result, *args):
        roots.append(result.state)
        return round_(result, *args)

    sampler._round = recorded_round
    res = sampler.run([1, 2, 3], prompt_id="p", on_call=on_call)
    rounds = res.rounds
    assert len(per_round) == len(rounds) == len(roots)
    assert max(len(c.nodes) for c in rounds) > 6  # rounds with several nodes at a depth
    for calls, c, root in zip(per_round, rounds, roots):
        assert len(calls) == len(set(calls)), (c.call_index, sorted(calls))
        for node in c.nodes:
            assert node.extra == original_features(root, node.cut, cfg.alpha)
    monkeypatch.undo()


def original_features(root, cut, alpha):
    """Features 3/4 and the ratio statistics written out from their definitions (`cut_statistics` docstring)."""
    import math

    import numpy as np

    out = {}
    for prefix, a in (("logq", np.asarray(root.logq, float)), ("entropy", np.asarray(root.entropy, float))):
        if prefix == "entropy" and not all(math.isfinite(h) for h in a):
            continue
        out[f"{prefix}_at_cut"] = float(a[cut])
        out[f"{prefix}_jump_in"] = float(a[cut] - (a[cut - 1] if cut else 0.0))
        out[f"{prefix}_jump_out"] = float(a[cut + 1] - a[cut]) if cut + 1 < len(a) else 0.0
        out[f"{prefix}_suffix_mean"] = float(np.mean(a[cut:]))
    log_z = alpha * np.asarray(root.logp0, float) - np.asarray(root.logq, float)
    out["logz_suffix_sum"] = float(np.sum(log_z[cut:]))
    out["logz_suffix_expected"] = float((len(log_z) - cut) * np.mean(log_z))
    return out


def _streaming_kept(monkeypatch, kind: str, K: int) -> tuple[int, int, list[int], int]:
    """A streaming chain of one block of K steps: (the most parked partial rows and memoized draws held after a
    decision, the transitions of what was held there from decided transitions, transitions realized)."""
    from forerun.programs import streaming_presto
    from forerun.programs.streaming_presto import StreamingPrestoSampler
    from forerun.testing.stepped_streams import SteppedStreams

    decided = streaming_presto._BlockRun.decided
    parked, memo, stale = [0], [0], []

    def counted_decided(self, *args):
        decided(self, *args)
        parked[0] = max(parked[0], len(self.parked))
        # the memo's draw keys are (name, args, kwargs), args[0] the transition; they may be grouped (by transition)
        keys = [key for k, v in self.stream._memo.items() for key in (v if isinstance(v, dict) else [k])]
        held = [key[1][0] for key in keys if key[1]]
        memo[0] = max(memo[0], len(held))
        stale.extend(j for j in held if j < self.k)
        stale.extend(row.transition for _, row in self.parked.values() if row.transition < self.k)

    monkeypatch.setattr(streaming_presto._BlockRun, "decided", counted_decided)
    model = LogitTableModel(5, seed=3)
    cfg = SamplerConfig(kind=kind, response_length=8, block_size=8, steps_per_block=K, seed=1, alpha=2.0)
    res = StreamingPrestoSampler(model, cfg, PrefetchConfig(budget=6, streaming=True),
                                 streams=SteppedStreams(model)).run([1, 2, 3], prompt_id="p")
    monkeypatch.undo()
    return parked[0], memo[0], stale, res.transitions


@pytest.mark.parametrize("kind", ["power-mh", "entropy-cut"])
def test_streaming_keeps_nothing_of_decided_transitions(monkeypatch, kind):
    """Streaming PreSTO kept the partial rows of aborted requests (`parked`) and its memoized decision draws (for
    EntropyCut a Gumbel array of the response's length per transition) for every transition of the block: memory
    that grew with K (power-mh at K = 400: 68 parked rows, 1200 draws).  No later decision reads a decided
    transition's draw or request: after every decision none is held, and what is held does not grow with K."""
    short, long = _streaming_kept(monkeypatch, kind, 60), _streaming_kept(monkeypatch, kind, 600)
    assert short[3] == 60 and long[3] == 600
    assert not short[2] and not long[2], sorted(set(long[2]))[:10]
    assert long[0] <= 6 and long[1] <= 3 * 60, (short[:2], long[:2])


@pytest.mark.parametrize("kind", ["power-mh", "entropy-cut"])
def test_a_bfs_round_computes_statistics_only_where_it_scores(monkeypatch, kind):
    """BFS reads no per-depth feature, yet every plan computed the root's statistics at the cut of every depth it
    might pay: under the node unit min(K − k, N_pf) depths (64 here) for a tree that reaches about log2(64).  The
    statistics a BFS round computes are those of the cuts its node records carry."""
    from forerun.programs import cut_statistics

    computed: set[int] = set()
    original = cut_statistics.cut_statistics

    def counted(values, cut):
        computed.add(int(cut))
        return original(values, cut)

    monkeypatch.setattr(cut_statistics, "cut_statistics", counted)
    extra: list[set[int]] = []

    def on_call(call):
        if call.kind in ("mh", "reuse"):
            extra.append(computed - {node.cut for node in call.nodes})
            computed.clear()

    model = LogitTableModel(4, seed=3)
    cfg = SamplerConfig(kind=kind, response_length=64, block_size=64, steps_per_block=80, seed=5, alpha=2.0)
    sampler = make_sampler(model, cfg, presto=True, prefetch=PrefetchConfig(budget=64, budget_unit="node"))
    res = sampler.run([1, 2, 3], prompt_id="p", on_call=on_call)
    assert res.transitions == 80 and len(extra) == len(res.rounds)
    assert not any(extra), [sorted(e) for e in extra if e][:3]
    monkeypatch.undo()
