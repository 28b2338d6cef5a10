"""Early rejection of a streamed PowerMH proposal (τ = 1/α): the bound of log r over the tokens so far never
falls below the complete proposal's log r, and the streaming walk rejects at the first token where it decides -
the sequential sampler's decision, sooner.

Oracles: the complete ratio is `log_mh_ratio` of the whole proposal (tested on its own against brute force);
the first deciding token is recomputed here from the sequential chain's own decisions with `math.fsum` over the
per-token terms α log p0 − log q_τ (no slack: the slack only ever delays a rejection by a token or none)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from forerun.programs.acceptance import log_mh_ratio, log_mh_ratio_bound
from forerun.programs.sampler_config import PrefetchConfig, SamplerConfig
from forerun.programs.sampler_factory import make_sampler
from forerun.programs.streaming_presto import StreamingPrestoSampler
from forerun.programs.suffixes import SuffixRequest
from forerun.programs.transitions import ChainState, PowerMHKernel
from forerun.testing.chains import assert_same_chain
from forerun.testing.logit_table_model import LogitTableModel
from forerun.testing.stepped_streams import SteppedStreams

PROMPT = [1, 2, 3]


def _state_and_proposal(model, T, cut, tau, seed):
    first = model.generate([SuffixRequest(tuple(PROMPT), T, tau, seed)])[0]
    state = ChainState.empty().splice(0, first)
    prefix = tuple(PROMPT) + tuple(int(t) for t in state.tokens[:cut])
    suffix = model.generate([SuffixRequest(prefix, T - cut, tau, seed + 1000)])[0]
    return state, suffix


@pytest.mark.parametrize("alpha", [1.0, 2.0, 4.0, 3.0])
def test_the_bound_holds_at_every_token_when_tau_is_one_over_alpha(alpha):
    model = LogitTableModel(6, seed=5, scale=3.0)
    for seed in range(40):
        T, cut = 12, seed % 12
        state, suffix = _state_and_proposal(model, T, cut, 1.0 / alpha, seed)
        proposal = state.splice(cut, suffix)
        full = log_mh_ratio(state.logq, state.logp0, proposal.logq, proposal.logp0, cut, alpha)
        bounds = [log_mh_ratio_bound(state.logq, state.logp0, suffix.logq[:m], suffix.logp0[:m], cut, alpha, T - cut - m)
                  for m in range(T - cut + 1)]
        assert all(b >= full for b in bounds)
        assert all(b1 <= b0 + 1e-9 for b0, b1 in zip(bounds, bounds[1:]))  # each token only lowers it
        assert bounds[-1] == pytest.approx(full, abs=1e-9)


def test_at_another_temperature_a_token_can_raise_log_r_and_the_kernel_has_no_bound():
    """Why `rejects_early` asks for τ = 1/α: with α = 2 and τ = 1/4 some proposal tokens raise log r."""
    model = LogitTableModel(6, seed=5, scale=3.0)
    raised = 0
    for seed in range(40):
        T, cut = 12, seed % 12
        state, suffix = _state_and_proposal(model, T, cut, 0.25, seed)
        terms = 2.0 * suffix.logp0 - suffix.logq
        raised += int(np.any(terms > 0))
    assert raised > 0
    assert PowerMHKernel(alpha=2.0, tau=0.25).log_ratio_bound(state, cut, suffix.logq[:1], suffix.logp0[:1]) is None
    assert PowerMHKernel(alpha=0.5, tau=2.0).rejects_early is False  # τ = 1/α, but α < 1
    assert PowerMHKernel(alpha=4.0, tau=0.25).rejects_early is True


def _sequential_with_decisions(model, cfg, monkeypatch):
    """The sequential chain and, per transition, (cut, the first token count at which its rejection is decided or
    None, the proposal's length)."""
    seen = []
    decide = PowerMHKernel.decide

    def spy(self, state, cut, suffixes, j, stream):
        d = decide(self, state, cut, suffixes, j, stream)
        (s,) = suffixes
        log_u = stream.accept_log_uniform(j)
        x = math.fsum(state.logq[cut:] - self.alpha * state.logp0[cut:])
        first = None
        if not log_u < d.log_accept:
            partial = [x + math.fsum(self.alpha * s.logp0[:m] - s.logq[:m]) for m in range(len(s.ids) + 1)]
            first = next(m for m, v in enumerate(partial) if v <= log_u)
        seen.append((cut, first, len(s.ids)))
        return d

    monkeypatch.setattr(PowerMHKernel, "decide", spy)
    seq = make_sampler(model, cfg).run(PROMPT, prompt_id="p")
    monkeypatch.setattr(PowerMHKernel, "decide", decide)
    return seq, seen


@pytest.mark.parametrize("npf", [1, 4, 12])
def test_streaming_rejects_at_the_first_deciding_token_with_the_sequential_chain(npf, monkeypatch):
    early = 0
    for seed in range(10):
        model = LogitTableModel(6, seed=seed, scale=3.0)
        cfg = SamplerConfig(kind="power-mh", response_length=16, block_size=8, steps_per_block=12, seed=seed,
                            alpha=2.0 if seed % 3 == 0 else 4.0)
        seq, seen = _sequential_with_decisions(model, cfg, monkeypatch)
        streams = SteppedStreams(model)
        res = StreamingPrestoSampler(model, cfg, PrefetchConfig(budget=npf, streaming=True), streams=streams).run(
            PROMPT, prompt_id="p")
        assert_same_chain(seq, res, f"seed {seed}")
        nodes = [n for c in res.mh_calls for n in c.nodes]
        assert len(nodes) == len(seen)
        for node, (cut, first, length) in zip(nodes, seen):
            assert node.cut == cut
            if node.extra.get("log_accept_is_bound"):
                early += 1
                assert not node.accepted and first is not None and node.extra["proposal_tokens"] == length
                read = node.extra["early_rejection_read"]
                # one row at a time: the walk's row starts when the walk arrives and stops at the deciding token;
                # with more, a row started early may have decoded further before the walk arrived
                assert (read == first) if npf == 1 else (first <= read < length)
            elif first is not None and npf == 1:
                assert first == length  # a rejection decided only by the last token
        read = sum(n.extra["early_rejection_read"] for n in nodes if n.extra.get("log_accept_is_bound"))
        skipped = sum(n.extra["proposal_tokens"] for n in nodes if n.extra.get("log_accept_is_bound")) - read
        assert res.requests.used_tokens == sum(c.generated_tokens for c in seq.mh_calls) - skipped
    assert early > 0


@pytest.mark.parametrize("how", ["server stream", "tau", "switched off", "entropy-cut"])
def test_no_early_rejection_without_token_quantities_a_bound_or_the_switch(how):
    kind = "entropy-cut" if how == "entropy-cut" else "power-mh"
    for seed in range(6):
        model = LogitTableModel(6, seed=seed, scale=3.0)
        cfg = SamplerConfig(kind=kind, response_length=16, block_size=8, steps_per_block=12, seed=seed,
                            temperature=1.0 if how == "tau" else None)
        seq = make_sampler(model, cfg).run(PROMPT, prompt_id="p")
        streams = SteppedStreams(model, report_progress=how != "server stream")
        pf = PrefetchConfig(budget=4, streaming=True, early_reject=how != "switched off")
        res = StreamingPrestoSampler(model, cfg, pf, streams=streams).run(PROMPT, prompt_id="p")
        assert_same_chain(seq, res, f"{how}, seed {seed}")
        assert not any(n.extra.get("log_accept_is_bound") for c in res.mh_calls for n in c.nodes)
        assert res.requests.used_tokens == sum(c.generated_tokens for c in seq.mh_calls)


def test_with_eos_ids_the_bound_holds_for_the_ratio_through_the_first_eos():
    """`stop_at_eos`: log r counts the tokens only through a state's first EOS (`transitions` docstring); the bound
    over a head masks the head the same way (its EOS may be in the head or in the kept prefix), so it still never
    falls below the complete proposal's log r and equals it once the proposal is complete."""
    model, eos, alpha = LogitTableModel(4, seed=1, scale=1.0), (0,), 4.0
    kernel = PowerMHKernel(alpha=alpha, tau=1 / alpha, eos=eos)
    assert kernel.rejects_early and kernel.log_ratio_bound(ChainState.empty(), 0, [0.0], [0.0]) is None  # no ids
    masked = 0
    for seed in range(60):
        T, cut = 8, seed % 8
        state, suffix = _state_and_proposal(model, T, cut, 1.0 / alpha, seed)
        proposal = state.splice(cut, suffix)
        full = kernel.log_ratio(state, proposal, cut)
        masked += int(0 in proposal.tokens[:-1])
        bounds = [kernel.log_ratio_bound(state, cut, suffix.logq[:m], suffix.logp0[:m], suffix.ids[:m])
                  for m in range(T - cut + 1)]
        assert all(b >= full - 1e-12 for b in bounds), seed
        assert bounds[-1] == pytest.approx(full, abs=1e-9)
    assert masked > 10
