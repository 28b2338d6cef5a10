"""The references' horizon (`SamplerConfig.stop_at_eos`): at the end of a block a chain whose state holds an EOS
is cut after the first one and stops growing; sequential and PreSTO (round-based and streaming) chains stay
identical; without it the chain is the fixed n tokens of Table 6."""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pytest
from scipy.special import logsumexp

from forerun.programs.sampler_config import PrefetchConfig, SamplerConfig
from forerun.programs.sampler_factory import make_sampler
from forerun.programs.samplers import make_kernel
from forerun.programs.random_streams import DecisionStream
from forerun.programs.suffixes import Suffix
from forerun.programs.transitions import ChainState, MultiTryKernel
from forerun.testing.chains import assert_same_chain
from forerun.programs.streaming_presto import StreamingPrestoSampler
from forerun.testing.logit_table_model import LogitTableModel
from forerun.testing.stepped_streams import SteppedStreams

EOS = 2


def _run(kind, seed, stop, prefetch=None, n=12):
    model = LogitTableModel(5, seed=3, tempered_temperatures=(0.25, 0.5, 1.0) if kind == "multitry-mh" else ())
    cfg = SamplerConfig(kind=kind, response_length=n, block_size=3, steps_per_block=4, seed=seed, stop_at_eos=stop)
    if prefetch is not None and prefetch.streaming:
        return StreamingPrestoSampler(model, cfg, prefetch, streams=SteppedStreams(model)).run([1, 0, 3], prompt_id="p")
    return make_sampler(model, cfg, presto=prefetch is not None, prefetch=prefetch or PrefetchConfig()).run(
        [1, 0, 3], prompt_id="p")


@pytest.mark.parametrize("kind", ["power-mh", "entropy-cut", "multitry-mh"])
def test_a_chain_ends_after_the_block_that_holds_an_eos(kind):
    ended = 0
    for seed in range(8):
        seq = _run(kind, seed, (EOS,))
        full = _run(kind, seed, ())
        assert len(full.response_ids) == 12 and not full.ended_at_eos
        ids = list(seq.response_ids)
        if seq.ended_at_eos:
            ended += 1
            assert ids.index(EOS) == len(ids) - 1  # cut right after the first EOS
            blocks = sum(1 for c in seq.calls if c.kind == "extend")
            assert len(ids) <= 3 * blocks  # no block was extended after the one whose state held the EOS
        else:
            assert EOS not in ids and len(ids) == 12
        for pf in (PrefetchConfig(budget=6), PrefetchConfig(budget=6, streaming=True)):
            assert_same_chain(seq, _run(kind, seed, (EOS,), pf), f"seed {seed} {pf.streaming}")
    assert ended > 0


def test_stop_at_eos_ids_are_validated():
    with pytest.raises(ValueError, match="stop_at_eos"):
        SamplerConfig(stop_at_eos=(-1,))
    assert np.isin([EOS], np.asarray((EOS,))).all()


# -- what the chain samples: π_α over EOS-terminated responses (exact enumeration) ---------------------------
PROMPT, V, T, ALPHA, TEMPS = (1,), 3, 3, 4.0, (0.25, 0.5, 1.0)
TOY_EOS = 0


def _log_softmax(z):
    return z - logsumexp(z)


@functools.lru_cache(maxsize=None)
def _columns(model, prev, pos, tau):
    """log q_τ, log p0, H(p0) and log q_τ' (τ' ∈ 𝒯) of every token after `prev` at `pos`, from the raw logits."""
    z = model.logits(prev, pos)
    lp0 = _log_softmax(z)
    return _log_softmax(z / tau), lp0, -float(np.dot(np.exp(lp0), lp0)), [_log_softmax(z / t) for t in TEMPS]


def _toy_suffix(model, prefix, cont, tau) -> Suffix:
    """What the engine returns for `cont` after `prefix`, from the toy's raw logits (no sampler code)."""
    ids, cols = list(prefix), []
    for tok in cont:
        lq, lp0, h, by_t = _columns(model, ids[-1], len(ids), tau)
        cols.append((lq[tok], lp0[tok], h, [b[tok] for b in by_t]))
        ids.append(int(tok))
    lq, lp, ent, byt = zip(*cols)
    return Suffix(np.array(cont, dtype=np.int64), np.array(lq), np.array(lp), np.array(ent), np.array(byt).T.copy())


def _cut_at_eos(x):
    return x[:x.index(TOY_EOS) + 1] if TOY_EOS in x else x


def _eos_target(model):
    """π_α over complete responses (ending at the first EOS, or T tokens without one): ∝ p0(response)^α."""
    out = {}
    for x in itertools.product(range(V), repeat=T):
        r = _cut_at_eos(x)
        ids, lp = list(PROMPT), 0.0
        for tok in r:
            lp += float(_log_softmax(model.logits(ids[-1], len(ids)))[tok])
            ids.append(tok)
        out[r] = ALPHA * lp
    z = logsumexp(list(out.values()))
    return {r: math.exp(v - z) for r, v in out.items()}


def _mh_matrix(model, kernel, states, index):
    stream, P = DecisionStream(0, 1, 1), np.zeros((len(states), len(states)))
    for x in states:
        xs = ChainState(*(lambda s: (s.ids, s.logq, s.logp0, s.entropy, s.logq_by_temp))(_toy_suffix(model, PROMPT, x, 0.25)))
        law = kernel.cut_law(xs)
        for c in np.flatnonzero(law):
            c = int(c)
            if isinstance(kernel, MultiTryKernel):  # M = 2: candidates and the reference i.i.d. from Q
                ys = [xs.splice(c, _toy_suffix(model, PROMPT + x[:c], s, 1.0))
                      for s in itertools.product(range(V), repeat=T - c)]
                q = np.array([np.mean(np.exp(np.sum(y.logq_by_temp[:, c:], axis=1))) for y in ys])
                lw = np.array([kernel.log_weight(y, c) for y in ys])
                w, wx = np.exp(lw - lw.max()), math.exp(kernel.log_weight(xs, c) - lw.max())
                pair = w[:, None] + w[None, :]
                acc = np.tensordot(np.minimum(1.0, pair[:, :, None] / (w[None, None, :] + wx)), q, axes=([2], [0]))
                move = 2.0 * q * np.sum(q[None, :] * (w[:, None] / pair) * acc, axis=1)
                for y, m in zip(ys, move):
                    P[index[x], index[tuple(int(t) for t in y.tokens)]] += law[c] * m
                P[index[x], index[x]] += law[c] * (1.0 - move.sum())
                continue
            (req,) = kernel.requests(PROMPT + x[:c], c, T, 0, stream)
            for s in itertools.product(range(V), repeat=T - c):
                suffix = _toy_suffix(model, req.prefix_ids, s, req.temperature)
                a = math.exp(kernel.decide(xs, c, [suffix], 0, stream).log_accept)
                qs = math.exp(float(np.sum(suffix.logq)))
                P[index[x], index[x[:c] + s]] += law[c] * qs * a
                P[index[x], index[x]] += law[c] * qs * (1 - a)
    return P


@pytest.mark.parametrize("kind", ["power-mh", "entropy-cut", "multitry-mh"])
def test_the_chain_cut_at_its_eos_samples_the_power_target_of_the_response(kind):
    """The kernel's stationary law, cut at the first EOS, is π_α ∝ p0(response)^α over complete responses.  Scoring
    the tokens after the EOS (the first version) made it ∝ p0(response)^α Σ_tail p0(tail | response)^α: here one
    response's probability was off by up to 0.39, the early-EOS responses under-weighted."""
    model = LogitTableModel(V, seed=1, period=3, tempered_temperatures=TEMPS)
    kernel = make_kernel(SamplerConfig(kind=kind, response_length=T, block_size=T, alpha=ALPHA, mtm_candidates=2,
                                       mtm_temperatures=TEMPS, stop_at_eos=(TOY_EOS,)))
    states = list(itertools.product(range(V), repeat=T))
    index = {s: i for i, s in enumerate(states)}
    P = _mh_matrix(model, kernel, states, index)
    assert np.allclose(P.sum(axis=1), 1.0, atol=1e-12)
    vals, vecs = np.linalg.eig(P.T)
    assert np.sum(np.abs(vals) > 1 - 1e-9) == 1, "reducible or periodic"
    pi = np.real(vecs[:, np.argmax(np.real(vals))])
    pi /= pi.sum()
    got: dict = {}
    for x, p in zip(states, pi):
        got[_cut_at_eos(x)] = got.get(_cut_at_eos(x), 0.0) + p
    target = _eos_target(model)
    assert max(abs(got[r] - target[r]) for r in target) < 1e-9, kind
