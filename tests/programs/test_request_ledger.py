"""What a chain generated and what its walk used (`request_ledger`): wasted tokens and repeated requests, for the
sequential sampler and every PreSTO traversal, against oracles the ledger does not compute.

Used tokens: by Proposition 1 the walk of a PreSTO chain realizes exactly the sequential chain's decisions, so it
reads exactly the requests the sequential sampler generates; the tokens it used are the sequential chain's MH
tokens.  Repeated requests: the requests the model (or the streamed-row double) was actually asked for."""

from __future__ import annotations

import pytest

from forerun.programs.request_ledger import RequestLedger
from forerun.programs.sampler_config import PrefetchConfig, SamplerConfig
from forerun.programs.sampler_factory import make_sampler
from forerun.programs.streaming_presto import StreamingPrestoSampler
from forerun.programs.suffixes import SuffixRequest
from forerun.testing.chains import assert_same_chain
from forerun.testing.logit_table_model import LogitTableModel
from forerun.testing.stepped_streams import SteppedStreams

TEMPS = (0.25, 0.5, 1.0)
PROMPT = [1, 2, 3]


def _toy(kind: str) -> LogitTableModel:
    return LogitTableModel(5, seed=3, tempered_temperatures=TEMPS if kind == "multitry-mh" else ())


def _cfg(kind: str, seed: int) -> SamplerConfig:
    return SamplerConfig(kind=kind, response_length=8, block_size=4, steps_per_block=8, seed=seed,
                         mtm_candidates=2)


def _mh_tokens(res) -> int:
    return sum(c.generated_tokens for c in res.mh_calls)


def _asked(calls) -> list[SuffixRequest]:
    return [r for call in calls for r in call]


def test_ledger_counts():
    ledger = RequestLedger()
    a, b = SuffixRequest((1, 2), 3, 0.5, 7), SuffixRequest((1, 2), 3, 0.5, 8)
    assert ledger.wasted_token_fraction == 0.0  # nothing generated, nothing wasted
    ledger.generated(a, 3)
    ledger.generated(b, 2)  # an aborted row: 2 of its 3 tokens
    ledger.generated(b, 3)  # restarted: a repeat
    ledger.used([b])
    assert (ledger.generated_tokens, ledger.used_tokens, ledger.wasted_tokens, ledger.repeated_requests) == (8, 3, 5, 1)
    assert ledger.wasted_token_fraction == pytest.approx(5 / 8)


@pytest.mark.parametrize("kind", ["power-mh", "entropy-cut", "multitry-mh"])
@pytest.mark.parametrize("traversal", ["bfs", "predictive"])
def test_round_based_waste_and_no_repeats(kind, traversal):
    for seed in range(3):
        model = _toy(kind)
        seq = make_sampler(model, _cfg(kind, seed)).run(PROMPT, prompt_id="p")
        assert seq.wasted_token_fraction == 0.0 and seq.repeated_requests == 0
        assert seq.requests.generated_tokens == _mh_tokens(seq)
        model.calls.clear()
        pf = PrefetchConfig(budget=8, traversal=traversal,
                            branch_prob=(lambda node: 0.2 + 0.6 * node.cut_fraction) if traversal == "predictive" else None)
        pre = make_sampler(model, _cfg(kind, seed), presto=True, prefetch=pf).run(PROMPT, prompt_id="p")
        assert_same_chain(seq, pre, (kind, traversal, seed))
        asked = _asked(model.calls)
        assert pre.repeated_requests == len(asked) - len(set(asked)) == 0
        assert pre.requests.generated_tokens == _mh_tokens(pre)
        assert pre.requests.used_tokens == _mh_tokens(seq)
        assert pre.requests.wasted_tokens == _mh_tokens(pre) - _mh_tokens(seq)
        assert 0.0 <= pre.wasted_token_fraction <= 1.0
        summary = pre.summary()
        assert summary["repeated_requests"] == 0 and summary["wasted_token_fraction"] == pre.wasted_token_fraction


def test_without_the_suffix_cache_requests_repeat_and_are_counted():
    model = _toy("power-mh")
    cfg = _cfg("power-mh", 1)
    pre = make_sampler(model, cfg, presto=True, prefetch=PrefetchConfig(budget=8, reuse_suffixes=False)).run(PROMPT)
    asked = _asked(model.calls)
    assert pre.repeated_requests == len(asked) - len(set(asked)) > 0


@pytest.mark.parametrize("kind", ["power-mh", "entropy-cut", "multitry-mh"])
@pytest.mark.parametrize("traversal", ["bfs", "predictive"])
def test_streaming_waste_and_repeats(kind, traversal):
    """Streaming: the ledger's waste is the windows' own count; a repeat is a row restarted for a request an
    aborted row had (counted as the double saw it, whatever the number)."""
    for seed in range(3):
        model = _toy(kind)
        seq = make_sampler(model, _cfg(kind, seed)).run(PROMPT, prompt_id="p")
        streams = SteppedStreams(model)
        pf = PrefetchConfig(budget=6, streaming=True, traversal=traversal,
                            branch_prob=(lambda node: 0.2 + 0.6 * node.cut_fraction) if traversal == "predictive" else None)
        res = StreamingPrestoSampler(model, _cfg(kind, seed), pf, streams=streams).run(PROMPT, prompt_id="p")
        assert_same_chain(seq, res, (kind, traversal, seed))
        assert res.repeated_requests == len(streams.started) - len(set(streams.started))
        assert res.requests.generated_tokens == _mh_tokens(res)
        # a proposal rejected early (test_early_rejection) was read up to the rejection; the rest never decoded
        early = [n.extra for c in res.mh_calls for n in c.nodes if n.extra.get("log_accept_is_bound")]
        skipped = sum(e["proposal_tokens"] - e["early_rejection_read"] for e in early)
        assert res.requests.used_tokens == _mh_tokens(seq) - skipped
        assert res.requests.wasted_tokens == sum(c.wasted_tokens for c in res.mh_calls)
        assert 0.0 <= res.wasted_token_fraction <= 1.0
