"""Power-SMC and the decoding baselines against hand computations: a scripted model with fixed per-token
log-probs (weights, ESS, resampling, final rules, best-of-N ranking), and the tiny engine (greedy against a
plain transformers forward; reproducibility across batch sizes)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from forerun.programs.baselines import BaselineConfig, DecodingBaseline
from forerun.programs.completions import Completion, ProgramCompletionModel
from forerun.programs.power_smc import PowerSMC, PowerSMCConfig
from forerun.programs.random_streams import keyed_generator, prompt_key
from forerun.testing.transformers_oracle import norms_in_model_dtype

PROMPT = (3, 4)
EOS = 0

# Block 1 from the empty response, by request position (particle); later blocks by the response so far.
# (ids, log q_tau per token, log p0 per token, ended with EOS)
FIRST = [((5, 6), (-0.2, -0.4), (-0.1, -0.3), False),
         ((7, 8), (-0.3, -0.2), (-1.5, -2.0), False),
         ((EOS,), (-0.5,), (-0.4,), True)]
NEXT = {(5, 6): ((9, 10), (-0.3, -0.3), (-0.2, -0.1), False),
        (7, 8): ((11, EOS), (-0.4, -0.5), (-0.5, -0.7), True)}


class Scripted:
    """A `CompletionModel` returning the fixed completions above (the seeds are ignored)."""

    def __init__(self) -> None:
        self.calls: list[list] = []

    def complete(self, requests):
        first = not self.calls
        self.calls.append(list(requests))
        out = []
        for k, req in enumerate(requests):
            ids, lq, lp, eos = FIRST[k] if first else NEXT[tuple(req.prefix_ids[len(PROMPT):])]
            n = min(len(ids), req.max_tokens)
            out.append(Completion(np.array(ids[:n], dtype=np.int64), np.array(lq[:n]), np.array(lp[:n]),
                                  np.zeros(n), eos and n == len(ids)))
        return out


ALPHA, RAMP, MAX_NEW = 2.0, 3, 4


def alpha_t(t):
    """The bridge written out: 1 at t = 0, linear to α at T_r, then α."""
    return 1.0 + (ALPHA - 1.0) * min(1.0, t / RAMP)


def hand_increment(lq, lp, before, ended):
    """Token by token: α_t log p0(y_t) + (α_t − α_{t−1}) L_{t−1} − log q(y_t); an ended particle is then lifted
    to the final exponent, (α − α_t) L_t.  `before` is the response so far (its log p0 per token)."""
    t, big_l, total = len(before), sum(before), 0.0
    for q, p in zip(lq, lp):
        t += 1
        total += alpha_t(t) * p + (alpha_t(t) - alpha_t(t - 1)) * big_l - q
        big_l += p
    if ended:
        total += (ALPHA - alpha_t(t)) * big_l
    return total


def hand_ess(log_w):
    w = np.exp(np.asarray(log_w) - max(log_w))
    return w.sum() ** 2 / (w ** 2).sum()


def first_above(cdf, point):
    return next(j for j, c in enumerate(cdf) if c > point)


def smc(kappa, final="sample", resampling="systematic", seed=5):
    cfg = PowerSMCConfig(alpha=ALPHA, particles=3, max_new_tokens=MAX_NEW, block_size=2, ramp_tokens=RAMP,
                         ess_threshold=kappa, resampling=resampling, final=final, seed=seed)
    model = Scripted()
    return PowerSMC(model, cfg).run(PROMPT), model


def test_smc_weights_and_ess_without_resampling_match_the_hand_computation():
    res, model = smc(kappa=0.0)
    w1 = [hand_increment(lq, lp, (), eos or len(ids) == MAX_NEW) for ids, lq, lp, eos in FIRST]
    assert res.extra["ess"][0] == pytest.approx(hand_ess(w1))
    w2 = list(w1)
    for i in (0, 1):
        ids, lq, lp, eos = NEXT[FIRST[i][0]]
        w2[i] += hand_increment(lq, lp, FIRST[i][2], True)  # both end: EOS, or the 4-token budget
    assert res.extra["log_weights"] == pytest.approx(w2)
    assert res.extra["ess"][1] == pytest.approx(hand_ess(w2))
    assert res.extra["resamples"] == 0 and len(model.calls) == 2 and len(model.calls[1]) == 2
    # every finished particle is weighted toward p0^α itself: α log p0 − log q over its whole response
    for i, (ids, lq, lp, _) in enumerate(FIRST):
        full_lq, full_lp = (lq + NEXT[ids][1], lp + NEXT[ids][2]) if ids in NEXT else (lq, lp)
        assert w2[i] == pytest.approx(ALPHA * sum(full_lp) - sum(full_lq))
    # the final rules, by hand
    u = keyed_generator(5, prompt_key(PROMPT), 303).random()
    w = np.exp(np.array(w2) - max(w2))
    assert res.extra["chosen"] == first_above(np.cumsum(w / w.sum()), u)
    assert smc(0.0, final="max")[0].extra["chosen"] == max(range(3), key=lambda i: w2[i])
    logp0 = [sum(FIRST[i][2]) + (sum(NEXT[FIRST[i][0]][2]) if i < 2 else 0.0) for i in range(3)]
    chosen = smc(0.0, final="max-logp0")[0]
    assert chosen.extra["chosen"] == max(range(3), key=lambda i: logp0[i]) == 2
    assert chosen.response_ids == (EOS,)


@pytest.mark.parametrize("resampling", ["systematic", "multinomial"])
def test_smc_resampling_ancestors_and_weights_match_the_hand_computation(resampling):
    """κ = 1: resample after block 1 (ESS < P); ancestors by inverse CDF at the documented keyed uniforms
    ((seed, prompt, block)), every survivor restarting from the mean weight."""
    seed = 5
    res, model = smc(kappa=1.0, resampling=resampling, seed=seed)
    w1 = [hand_increment(lq, lp, (), eos) for _, lq, lp, eos in FIRST]
    assert hand_ess(w1) < 3
    norm = np.exp(np.array(w1) - max(w1))
    cdf = np.cumsum(norm / norm.sum())
    rng = keyed_generator(seed, prompt_key(PROMPT), 1, 302)
    if resampling == "systematic":
        u = rng.random(1)[0]
        points = [(i + u) / 3 for i in range(3)]
    else:
        points = sorted(rng.random(3))
    ancestors = [first_above(list(cdf[:-1]) + [1.0], x) for x in points]
    mean = math.log(sum(math.exp(w) for w in w1) / 3)
    w2 = []
    for a in ancestors:
        ids, _, lp, _ = FIRST[a]
        w2.append(mean + (hand_increment(NEXT[ids][1], NEXT[ids][2], lp, True) if ids in NEXT else 0.0))
    assert res.extra["resamples"] == 1
    assert res.extra["log_weights"] == pytest.approx(w2)
    assert res.extra["ess"] == pytest.approx([hand_ess(w1), hand_ess(w2)])
    assert [tuple(r.prefix_ids[len(PROMPT):]) for r in model.calls[1]] == [FIRST[a][0] for a in ancestors if a < 2]


class EqualWeights:
    """Every token has log q = log p0 = −0.5 (dyadic, so every α = 1 weight is exactly 0)."""

    def complete(self, requests):
        return [Completion(np.ones(r.max_tokens, dtype=np.int64), np.full(r.max_tokens, -0.5),
                           np.full(r.max_tokens, -0.5), np.zeros(r.max_tokens), False) for r in requests]


@pytest.mark.parametrize("particles", [5, 7, 64])
def test_equal_weights_have_ess_p_and_are_not_resampled_at_kappa_one(particles):
    """(Σ w)² / Σ w² of P equal weights is P, and the trigger is ESS < κ·P: at κ = 1 nothing is resampled.  The
    logsumexp form gave 6.999999999999999 for 7 (and 63.99999999999998 for 64) equal weights, so every block
    was resampled and `resamples` counted them."""
    cfg = PowerSMCConfig(alpha=1.0, particles=particles, max_new_tokens=4, block_size=2, ramp_tokens=0,
                         ess_threshold=1.0)
    res = PowerSMC(EqualWeights(), cfg).run(PROMPT)
    assert res.extra["log_weights"] == [0.0] * particles
    assert res.extra["ess"] == [particles, particles] and res.extra["resamples"] == 0


# ---- best-of-N ---------------------------------------------------------------------------------------

CANDIDATES = [((1, 2), (-1.0, -1.0), (-0.5, -0.6)),    # Σ log q -2.0, Σ log p0 -1.1
              ((3,), (-0.5,), (-2.0,)),                # -0.5, -2.0
              ((4, 5), (-0.2, -0.3), (-0.3, -0.4)),    # -0.5 (tie with 1), -0.7
              ((6,), (-3.0,), (-0.7,))]                # -3.0, -0.7 (tie with 2)


class Fixed:
    """A `CompletionModel` whose k-th request of a call gets candidate k."""

    def __init__(self) -> None:
        self.calls: list[list] = []

    def complete(self, requests):
        self.calls.append(list(requests))
        return [Completion(np.array(ids), np.array(lq), np.array(lp), np.zeros(len(ids)), True)
                for ids, lq, lp in CANDIDATES[:len(requests)]]


@pytest.mark.parametrize("select, expected", [("logq", 1), ("logp0", 2)])
def test_best_of_n_picks_the_largest_score_and_the_lowest_index_on_a_tie(select, expected):
    model = Fixed()
    res = DecodingBaseline(model, BaselineConfig(kind="best-of-n", samples=4, alpha=4.0, select=select)).run(PROMPT)
    assert res.extra["chosen"] == expected and res.response_ids == CANDIDATES[expected][0]
    assert [r.temperature for r in model.calls[0]] == [0.25] * 4 and len({r.seed for r in model.calls[0]}) == 4


def test_best_of_one_is_the_low_temperature_sample():
    model = Fixed()
    one = DecodingBaseline(model, BaselineConfig(kind="best-of-n", samples=1, alpha=2.0, seed=9)).run(PROMPT)
    low = DecodingBaseline(model, BaselineConfig(kind="low-temp", alpha=2.0, seed=9)).run(PROMPT)
    assert model.calls[0] == model.calls[1] and model.calls[0][0].temperature == 0.5
    assert one.response_ids == low.response_ids == CANDIDATES[0][0]


# ---- the tiny engine ---------------------------------------------------------------------------------

def test_greedy_is_argmax_of_a_plain_forward(tiny_loaded_backend):
    loaded, backend = tiny_loaded_backend
    prompt = list(loaded.tokenizer.encode("greedy by hand"))
    res = DecodingBaseline(ProgramCompletionModel(backend), BaselineConfig(kind="greedy", max_new_tokens=8)).run(prompt)
    ids, expected = list(prompt), []
    with torch.inference_mode(), norms_in_model_dtype():
        for _ in range(8):
            tok = int(torch.argmax(loaded.model(input_ids=torch.tensor([ids])).logits[0, -1]))
            expected.append(tok)
            ids.append(tok)
            if tok in loaded.eos_token_ids:
                break
    assert res.response_ids == tuple(expected)


def test_low_temperature_samples_at_tau_one_over_alpha(tiny_loaded_backend):
    """The low-temp sample's log q per token is log_softmax(logits / τ) at τ = 1/α of a plain forward, and its log
    p0 is log_softmax(logits): the temperature reached the engine as documented."""
    loaded, backend = tiny_loaded_backend
    prompt = list(loaded.tokenizer.encode("low temperature"))
    res = DecodingBaseline(ProgramCompletionModel(backend),
                           BaselineConfig(kind="low-temp", alpha=2.0, max_new_tokens=6, seed=4)).run(prompt)
    seq = prompt + list(res.response_ids)
    with torch.inference_mode(), norms_in_model_dtype():
        logits = loaded.model(input_ids=torch.tensor([seq])).logits[0].double()
    rows = [logits[len(prompt) - 1 + t] for t in range(len(res.response_ids))]
    want_q = [float(torch.log_softmax(r / 0.5, -1)[y]) for r, y in zip(rows, res.response_ids)]
    want_p = [float(torch.log_softmax(r, -1)[y]) for r, y in zip(rows, res.response_ids)]
    assert list(res.response.logq) == pytest.approx(want_q, abs=1e-9)
    assert list(res.response.logp0) == pytest.approx(want_p, abs=1e-9)


class OneAtATime:
    """The same model, every request in a call of its own (batch size 1)."""

    def __init__(self, model) -> None:
        self.model = model

    def complete(self, requests):
        return [self.model.complete([r])[0] for r in requests]


def test_same_seed_same_output_across_runs_and_batch_sizes(tiny_loaded_backend):
    loaded, backend = tiny_loaded_backend
    prompt = loaded.tokenizer.encode("batch sizes")
    model = ProgramCompletionModel(backend)
    cfg = PowerSMCConfig(particles=4, max_new_tokens=8, block_size=4, ramp_tokens=4, seed=13)
    batched, single = PowerSMC(model, cfg).run(prompt), PowerSMC(OneAtATime(model), cfg).run(prompt)
    assert batched.response_ids == single.response_ids and batched.extra == single.extra
    best = BaselineConfig(kind="best-of-n", samples=3, max_new_tokens=8, seed=13)
    a, b = DecodingBaseline(model, best).run(prompt), DecodingBaseline(OneAtATime(model), best).run(prompt)
    assert a.response_ids == b.response_ids and a.extra == b.extra
    low = DecodingBaseline(model, BaselineConfig(kind="low-temp", max_new_tokens=8, seed=13)).run(prompt)
    one = DecodingBaseline(model, BaselineConfig(kind="best-of-n", samples=1, max_new_tokens=8, seed=13)).run(prompt)
    assert low.response_ids == one.response_ids
    assert a.extra["scores"][0] == pytest.approx(math.fsum(low.response.logq))  # sample 0 of 3 is that sample
