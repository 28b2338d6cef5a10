"""Streaming PreSTO (issue 12): identical chains to the sequential sampler, N_pf rows at most, children that
start inside a running row, unreachable rows aborted, windows that cross acceptances."""

from __future__ import annotations

import pytest

from forerun.programs.sampler_config import PrefetchConfig, SamplerConfig
from forerun.programs.sampler_factory import make_sampler
from forerun.programs.streaming_presto import StreamingPrestoSampler
from forerun.testing.logit_table_model import LogitTableModel
from forerun.testing.stepped_streams import SteppedStreams
from forerun.testing.chains import assert_same_chain

TEMPS = (0.25, 0.5, 1.0)


def toy(kind: str, seed: int = 3, vocab: int = 5) -> LogitTableModel:
    return LogitTableModel(vocab, seed=seed, tempered_temperatures=TEMPS if kind == "multitry-mh" else ())


def hhat(node) -> float:
    """A toy ĥ: later cuts accept more often (the shape the certainty classifier learns)."""
    return 0.2 + 0.6 * node.cut_fraction


def run_streaming(kind, seed, npf, *, n=8, block=4, K=10, vocab=5, alpha=4.0, traversal="bfs", streams_cls=None,
                  mtm_candidates=4):
    model = toy(kind, 3, vocab)
    cfg = SamplerConfig(kind=kind, response_length=n, block_size=block, steps_per_block=K, seed=seed, alpha=alpha,
                        mtm_candidates=mtm_candidates)
    seq = make_sampler(model, cfg).run([1, 2, 3], prompt_id="p")
    pf = PrefetchConfig(budget=npf, streaming=True, traversal=traversal,
                        branch_prob=hhat if traversal == "predictive" else None)
    streams = (streams_cls or SteppedStreams)(model)
    res = StreamingPrestoSampler(model, cfg, pf, streams=streams).run([1, 2, 3], prompt_id="p")
    return seq, res, streams


@pytest.mark.parametrize("traversal", ["bfs", "predictive"])
@pytest.mark.parametrize("kind", ["power-mh", "entropy-cut"])
@pytest.mark.parametrize("npf", [1, 3, 20])
def test_identical_chains_many_seeds(kind, npf, traversal):
    shared = 0
    for seed in range(16):
        seq, res, streams = run_streaming(kind, seed, npf, alpha=2.0 if seed % 2 else 4.0, traversal=traversal)
        assert_same_chain(seq, res, f"seed {seed}")
        assert res.transitions == 2 * 10
        assert streams.max_rows <= npf  # at most N_pf rows decode at once
        assert all(ok for _, _, ok in streams.shares)  # a child's prefix is its parent's tokens so far
        shared += len(streams.shares)
        assert sum(c.transitions for c in res.mh_calls) == res.transitions
        for c in res.mh_calls:
            assert c.max_rows <= npf and c.wasted_tokens <= c.generated_tokens
    if npf > 1 and kind == "power-mh":
        assert shared > 0  # children did start inside running rows


@pytest.mark.parametrize("npf", [1, 7, 20])
def test_identical_chains_multitry(npf):
    for seed in range(8):
        seq, res, streams = run_streaming("multitry-mh", seed, npf, n=4, block=4, K=6, vocab=4)
        assert_same_chain(seq, res, f"seed {seed}")
        assert streams.max_rows <= max(npf, 7)  # the walk's own 2M − 1 rows run even above N_pf


@pytest.mark.parametrize("kind", ["power-mh", "entropy-cut", "multitry-mh"])
@pytest.mark.parametrize("n,block,K,npf", [(9, 3, 5, 1), (9, 3, 7, 3), (15, 5, 3, 20), (7, 7, 11, 5), (6, 2, 9, 2)])
def test_identical_chains_odd_sizes_and_several_blocks(kind, n, block, K, npf):
    for seed in range(3):
        for traversal in ("bfs", "predictive"):
            seq, res, _ = run_streaming(kind, seed, npf, n=n, block=block, K=K, vocab=4, traversal=traversal,
                                        mtm_candidates=2)
            assert_same_chain(seq, res, f"seed {seed} {traversal}")
            assert [c.block for c in res.calls if c.kind == "extend"] == list(range(1, n // block + 1))


def test_windows_cross_acceptances_and_rows_are_aborted():
    """With a budget, a window realizes several transitions, including across acceptances, and rows whose node
    the walk left behind are aborted (their slots reused)."""
    windows = accepted_inside = aborted = transitions = 0
    for seed in range(12):
        seq, res, streams = run_streaming("power-mh", seed, 12, n=16, block=16, K=12)
        assert_same_chain(seq, res)
        windows += res.num_calls
        transitions += res.transitions
        aborted += len(streams.aborted)
        k = 0
        for c in res.mh_calls:
            accepted_inside += sum(res.history[k : k + c.transitions - 1])
            k += c.transitions
        assert sum(c.rows_aborted for c in res.mh_calls) == len(streams.aborted)
    assert transitions / windows > 2.0
    assert accepted_inside > 0 and aborted > 0


def test_call_records_measure_the_window():
    ticks = iter(range(10_000))
    model = toy("power-mh")
    cfg = SamplerConfig(kind="power-mh", response_length=8, block_size=8, steps_per_block=6, seed=1)
    sampler = StreamingPrestoSampler(model, cfg, PrefetchConfig(budget=4, streaming=True),
                                     streams=SteppedStreams(model), clock=lambda: float(next(ticks)))
    res = sampler.run([1, 2, 3])
    assert res.sampler == "streaming-presto-power-mh"
    assert all(c.wall_time > 0 and c.decode_steps > 0 and c.row_steps >= c.decode_steps for c in res.mh_calls)
    assert sum(c.row_steps for c in res.mh_calls) <= sum(c.generated_tokens for c in res.mh_calls)


class CorruptChildren(SteppedStreams):
    """A broken engine: a row started inside a running row (share_from) draws with the wrong noise."""

    def start(self, rid, request, share_from=None):
        if share_from is not None:
            request = type(request)(request.prefix_ids, request.max_tokens, request.temperature, request.seed + 1)
        super().start(rid, request, None)


def test_the_identity_oracle_notices_a_child_with_the_wrong_seed():
    differ = 0
    for seed in range(12):
        seq, res, _ = run_streaming("power-mh", seed, 20, n=16, block=16, K=12, streams_cls=CorruptChildren)
        differ += seq.response_ids != res.response_ids or seq.history != res.history
    assert differ > 0


def test_make_sampler_builds_the_streaming_variant_and_needs_streams():
    cfg = SamplerConfig(kind="power-mh", response_length=4, block_size=4, steps_per_block=2)
    sampler = make_sampler(toy("power-mh"), cfg, presto=True, prefetch=PrefetchConfig(streaming=True))
    assert isinstance(sampler, StreamingPrestoSampler)
    with pytest.raises(Exception, match="cannot stream"):
        sampler.run([1, 2])


@pytest.mark.parametrize("traversal", ["bfs", "predictive"])
@pytest.mark.parametrize("kind", ["power-mh", "entropy-cut", "multitry-mh"])
def test_no_request_is_generated_twice(kind, traversal):
    """A running row is never displaced and an aborted one was unreachable: across budgets small enough that
    better-ranked requests keep appearing behind the running ones, no chain generates a request twice."""
    aborted = 0
    for seed in range(10):
        for npf in (2, 3, 5, 8):
            small = kind == "multitry-mh"
            seq, res, streams = run_streaming(kind, seed, npf * (3 if small else 1), n=8 if small else 16,
                                              block=8 if small else 16, K=6 if small else 12, vocab=4,
                                              traversal=traversal, mtm_candidates=2)
            assert_same_chain(seq, res, f"seed {seed} npf {npf}")
            assert res.repeated_requests == 0, f"seed {seed} npf {npf}: {res.repeated_requests} requests repeated"
            aborted += len(streams.aborted)
    assert aborted > 0  # rows the walk left behind were aborted


def test_row_cost_admits_rows_by_reach():
    """λ = row_cost: a row starts only for a node worth it, P·(1 + ĥ·D) >= λ.  λ above K (no node's value can
    reach it): only the walk's own requests run (no waste, one row per transition); raising λ never starts more
    rows; the chain never changes."""
    started = {}
    for lam in (0.0, 0.3, 1.0, 100.0):
        rows = wasted = 0
        for seed in range(8):
            model = toy("power-mh", 3, 4)
            cfg = SamplerConfig(kind="power-mh", response_length=16, block_size=16, steps_per_block=12, seed=seed)
            seq = make_sampler(model, cfg).run([1, 2, 3], prompt_id="p")
            pf = PrefetchConfig(budget=20, streaming=True, traversal="predictive", branch_prob=hhat, row_cost=lam)
            streams = SteppedStreams(model)
            res = StreamingPrestoSampler(model, cfg, pf, streams=streams).run([1, 2, 3], prompt_id="p")
            assert_same_chain(seq, res, f"λ {lam} seed {seed}")
            rows += sum(c.rows_started for c in res.mh_calls)
            wasted += sum(c.wasted_tokens for c in res.mh_calls)
            if lam == 100.0:
                assert sum(c.rows_started for c in res.mh_calls) == res.transitions
        started[lam] = rows
        if lam == 100.0:
            assert wasted == 0
    assert started[0.0] >= started[0.3] >= started[1.0] >= started[100.0]
    assert started[0.0] > started[1.0] > started[100.0]


def test_row_cost_is_validated():
    for bad in (-0.1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="row_cost"):
            PrefetchConfig(streaming=True, row_cost=bad)


class DroppingStreams(SteppedStreams):
    """An engine that aborts a running row by itself every third step (as under memory pressure; each request's
    first row at most), reporting what it decoded as the embedded engine reports an abort."""

    def updates(self):
        dropped = self.__dict__.setdefault("dropped", set())
        if self.steps % 3 == 2 and len(self.rows) > 1:
            for rid, row in list(self.rows.items()):
                if 0 < row.shown < len(row.suffix.ids) and row.request not in dropped:
                    dropped.add(row.request)
                    self.abort(rid)
                    break
        return super().updates()


def dropping_without_partial(model):
    return DroppingStreams(model, report_partial=False)  # as a server reports an abort


@pytest.mark.parametrize("kind", ["power-mh", "entropy-cut", "multitry-mh"])
def test_an_aborted_row_resumes_where_it_stopped(kind):
    """A request whose row was aborted part-way starts again after the tokens it decoded (continuation request:
    prefix + those tokens, same seed, the rest of the length): the chain is the sequential one, no token is
    decoded twice, and the ledger counts a resumption, not a repeat.  Without the partial report it starts over."""
    small = kind == "multitry-mh"
    resumed = restarted = 0
    for seed in range(6):
        for cls in (DroppingStreams, dropping_without_partial):
            seq, res, streams = run_streaming(kind, seed, 6 if small else 4, n=8 if small else 16,
                                              block=8 if small else 16, K=6 if small else 12, vocab=4,
                                              streams_cls=cls, mtm_candidates=2)
            assert_same_chain(seq, res, f"seed {seed} {cls.__name__}")
            assert all(ok for _, _, ok in streams.shares)  # a child's prefix is its parent's tokens so far
            if cls is DroppingStreams:
                assert res.repeated_requests == 0, f"seed {seed}: {res.repeated_requests} repeated"
                assert res.requests.resumed_requests == len(streams.resumed)
                resumed += len(streams.resumed)
            else:
                assert not streams.resumed and res.requests.resumed_requests == 0
                restarted += res.repeated_requests
            generated = sum(c.generated_tokens for c in res.mh_calls)
            assert generated == res.requests.generated_tokens
    assert resumed > 0 and restarted > 0


@pytest.mark.parametrize("kind,npf", [("power-mh", 1), ("multitry-mh", 1), ("entropy-cut", 3)])
def test_every_window_realizes_a_transition_when_rows_start_a_step_apart(kind, npf):
    """Rows of one window that join the engine a step apart (admitted at different passes) take more than T
    steps: the window runs on until its transition instead of closing with none (a call with no transition)."""
    for seed in range(10):
        model = toy(kind, 3, 4)
        cfg = SamplerConfig(kind=kind, response_length=4, block_size=4, steps_per_block=6, seed=seed,
                            mtm_candidates=2)
        seq = make_sampler(model, cfg).run([1, 2, 3], prompt_id="p")
        streams = SteppedStreams(model, late_every=2)
        res = StreamingPrestoSampler(model, cfg, PrefetchConfig(budget=npf, streaming=True),
                                     streams=streams).run([1, 2, 3], prompt_id="p")
        assert_same_chain(seq, res, f"seed {seed}")
        assert all(c.transitions >= 1 for c in res.mh_calls), [c.transitions for c in res.mh_calls]
        assert sum(c.decode_steps for c in res.mh_calls) == streams.steps
