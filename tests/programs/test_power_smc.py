"""Power-SMC and the decoding baselines on the enumerable toy model: weights against a brute-force π_α,
the bridge's telescoping, resampling, reproducibility."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
from scipy.special import logsumexp

from forerun.programs.baselines import BaselineConfig, DecodingBaseline
from forerun.programs.power_smc import (
    PowerSMC,
    PowerSMCConfig,
    bridged_exponent,
    effective_sample_size,
    log_weight_increment,
    resample_indices,
)
from forerun.testing.logit_table_model import LogitTableModel
from forerun.testing.toy_completions import LogitTableCompletions

PROMPT = (1, 2)
EOS = 0


def _toy(seed=3):
    return LogitTableCompletions(LogitTableModel(vocab_size=3, seed=seed, scale=1.0), eos=EOS)


def _sequences(max_len):
    """Every complete response: ends with EOS, or has max_len tokens."""
    out = []
    for n in range(1, max_len + 1):
        for seq in itertools.product(range(3), repeat=n):
            if EOS in seq[:-1]:
                continue
            if seq[-1] == EOS or n == max_len:
                out.append(seq)
    return out


def _target(toy, alpha, max_len):
    seqs = _sequences(max_len)
    logp = np.array([toy.table.sequence_logp0(PROMPT, s) for s in seqs])
    w = alpha * logp
    return dict(zip(seqs, np.exp(w - logsumexp(w))))


def test_bridged_exponent_ramps_from_one_to_alpha():
    assert bridged_exponent(0, 4.0, 400) == 1.0
    assert bridged_exponent(200, 4.0, 400) == pytest.approx(2.5)
    assert bridged_exponent(400, 4.0, 400) == bridged_exponent(900, 4.0, 400) == 4.0
    assert bridged_exponent(1, 4.0, 0) == 4.0


def test_block_increment_equals_the_sum_of_token_increments():
    rng = np.random.default_rng(0)
    lp, lq = -rng.random(12), -rng.random(12)
    alpha_t = lambda t: bridged_exponent(t, 3.0, 7)  # noqa: E731
    token_sum, prefix = 0.0, 0.0
    for t in range(1, 13):
        token_sum += alpha_t(t) * lp[t - 1] + (alpha_t(t) - alpha_t(t - 1)) * prefix - lq[t - 1]
        prefix += lp[t - 1]
    blocks = sum(log_weight_increment(float(lp[:a].sum()), float(lq[a:b].sum()), float(lp[a:b].sum()), a, b,
                                      alpha_t, False, 3.0) for a, b in ((0, 5), (5, 9), (9, 12)))
    assert blocks == pytest.approx(token_sum)
    # a particle that ends before the ramp is bridged to α: its total is α log p0 − log q
    end = log_weight_increment(0.0, float(lq[:4].sum()), float(lp[:4].sum()), 0, 4, alpha_t, True, 3.0)
    assert end == pytest.approx(3.0 * lp[:4].sum() - lq[:4].sum())


def test_ess_and_resampling():
    assert effective_sample_size(np.zeros(8)) == pytest.approx(8)
    assert effective_sample_size(np.array([0.0, -1e9, -1e9])) == pytest.approx(1)
    idx = resample_indices(np.log(np.array([0.5, 0.25, 0.25])), np.array([0.1]), systematic=True)
    assert list(idx) == [0, 0, 1]  # points 0.033, 0.367, 0.7 against the CDF 0.5, 0.75, 1
    idx = resample_indices(np.array([0.0, -np.inf, 0.0]), np.array([0.3, 0.9, 0.5]), systematic=False)
    assert 1 not in idx


@pytest.mark.parametrize("ramp,block,resampling", [(0, 3, "systematic"), (2, 1, "systematic"), (2, 1, "multinomial")])
def test_weighted_particles_approximate_the_power_target(ramp, block, resampling):
    """Self-normalized weights of many particles vs the exact π_α over every complete response."""
    toy, alpha, max_len = _toy(), 3.0, 3
    cfg = PowerSMCConfig(alpha=alpha, particles=6000, max_new_tokens=max_len, block_size=block, ramp_tokens=ramp,
                         ess_threshold=0.5, resampling=resampling, seed=7)
    res = PowerSMC(toy, cfg).run(PROMPT)
    # rebuild the final particle cloud from the diagnostics: weights and responses of every particle
    sampler = PowerSMC(_toy(), cfg)
    particles = _final_particles(sampler)
    w = np.array([p.log_w for p in particles])
    probs = np.exp(w - logsumexp(w))
    est: dict = {}
    for p, pr in zip(particles, probs):
        est[tuple(p.ids)] = est.get(tuple(p.ids), 0.0) + pr
    target = _target(toy, alpha, max_len)
    tv = 0.5 * sum(abs(est.get(s, 0.0) - q) for s, q in target.items())
    assert tv < 0.04, tv
    assert res.response_ids in target


def _final_particles(sampler):
    """Run `sampler` and return its final particles (the same loop as PowerSMC.run)."""
    from forerun.programs.power_smc import Particle
    from forerun.programs.random_streams import prompt_key

    key = prompt_key(PROMPT)
    particles = [Particle() for _ in range(sampler.config.particles)]
    block = 0
    while not all(p.finished for p in particles):
        block += 1
        sampler._extend(PROMPT, particles, key, block)
        particles, _, _ = sampler._maybe_resample(particles, key, block)
    return particles


def test_runs_are_reproducible_and_one_call_per_block():
    cfg = PowerSMCConfig(alpha=4.0, particles=8, max_new_tokens=6, block_size=2, ramp_tokens=3, seed=11)
    toy = _toy()
    a = PowerSMC(toy, cfg).run(PROMPT)
    b = PowerSMC(_toy(), cfg).run(PROMPT)
    assert a.response_ids == b.response_ids and a.extra == b.extra
    assert a.num_calls == len(toy.calls) <= 3
    assert all(len(reqs) <= cfg.particles for reqs in toy.calls)
    assert len({r.seed for r in toy.calls[0]}) == cfg.particles  # one seed per particle


def test_final_max_picks_the_heaviest_particle():
    cfg = PowerSMCConfig(alpha=4.0, particles=8, max_new_tokens=4, block_size=2, ramp_tokens=0, final="max")
    res = PowerSMC(_toy(), cfg).run(PROMPT)
    assert res.extra["chosen"] == int(np.argmax(res.extra["log_weights"]))


def test_configs_are_validated():
    with pytest.raises(ValueError, match="particles"):
        PowerSMCConfig(particles=0)
    with pytest.raises(ValueError, match="ess_threshold"):
        PowerSMCConfig(ess_threshold=1.5)
    with pytest.raises(ValueError, match="select"):
        BaselineConfig(kind="best-of-n", select="reward")
    with pytest.raises(ValueError, match="kind"):
        BaselineConfig(kind="beam")


def test_baselines_greedy_low_temperature_best_of_n():
    toy = _toy()
    greedy = DecodingBaseline(toy, BaselineConfig(kind="greedy", max_new_tokens=5)).run(PROMPT)
    ids = list(PROMPT)
    for tok in greedy.response_ids:
        assert tok == int(np.argmax(toy.table.log_p0(ids[-1], len(ids))))
        ids.append(tok)
    low = DecodingBaseline(toy, BaselineConfig(kind="low-temp", max_new_tokens=5, alpha=2.0)).run(PROMPT)
    assert low.num_calls == 1 and len(toy.calls[-1]) == 1 and toy.calls[-1][0].temperature == 0.5
    bon = DecodingBaseline(toy, BaselineConfig(kind="best-of-n", samples=6, max_new_tokens=5)).run(PROMPT)
    reqs = toy.calls[-1]
    assert len(reqs) == 6 and len({r.seed for r in reqs}) == 6
    scores = [toy.table.sequence_logq(PROMPT, c.ids, 0.25) for c in toy.complete(reqs)]
    assert bon.extra["chosen"] == int(np.argmax(scores))
    assert math.isclose(max(scores), bon.extra["scores"][bon.extra["chosen"]])
    by_p0 = DecodingBaseline(toy, BaselineConfig(kind="best-of-n", samples=6, max_new_tokens=5, select="logp0")).run(PROMPT)
    p0_scores = [toy.table.sequence_logp0(PROMPT, c.ids) for c in toy.complete(reqs)]
    assert by_p0.extra["chosen"] == int(np.argmax(p0_scores))


def test_final_max_logp0_picks_the_most_likely_particle():
    """final="max-logp0": the final particle with the largest Σ log p0, the oracle recomputed here from the toy's
    table over the final particle cloud; on this run the heaviest particle is a less likely one ("max" fails)."""
    cfg = PowerSMCConfig(alpha=4.0, particles=8, max_new_tokens=6, block_size=2, ramp_tokens=0, seed=1,
                         final="max-logp0")
    toy = _toy()
    res = PowerSMC(toy, cfg).run(PROMPT)
    particles = _final_particles(PowerSMC(_toy(), cfg))
    oracle = [toy.table.sequence_logp0(PROMPT, p.ids) for p in particles]
    assert res.extra["final"] == "max-logp0"
    assert toy.table.sequence_logp0(PROMPT, res.response_ids) == pytest.approx(max(oracle))
    assert math.fsum(res.response.logp0) == pytest.approx(max(oracle))  # the returned per-token log p0 agree
    heaviest = int(np.argmax([p.log_w for p in particles]))
    assert oracle[heaviest] < max(oracle) - 1e-9  # the largest weight is not the most likely particle here
    by_weight = PowerSMC(_toy(), replace(cfg, final="max")).run(PROMPT)
    assert toy.table.sequence_logp0(PROMPT, by_weight.response_ids) < max(oracle) - 1e-9
    assert by_weight.extra["final"] == "max"


def test_final_rule_is_validated_and_documented():
    from forerun.programs.power_smc import FINAL_RULES

    assert set(FINAL_RULES) == {"sample", "max", "max-logp0"}
    for rule in FINAL_RULES:
        assert PowerSMCConfig(final=rule).final == rule
    with pytest.raises(ValueError, match="final must be one of"):
        PowerSMCConfig(final="mode")


def test_best_of_n_records_its_rule_and_logq_is_logp0_plus_the_normalizer_bonus():
    """The documented bias of select="logq": Σ log q_τ = α Σ log p0 + Σ_t −log Z_t with Z_t = Σ_v p0(v|·)^α ≤ 1,
    Z_t computed here from the toy's logits; the two rules pick different samples on this prompt."""
    from forerun.programs.baselines import SELECT_RULES

    toy, alpha = _toy(), 4.0
    picks = {}
    for rule in SELECT_RULES:
        res = DecodingBaseline(toy, BaselineConfig(kind="best-of-n", samples=16, max_new_tokens=5, alpha=alpha,
                                                   select=rule, seed=2)).run(PROMPT)
        assert res.extra["select"] == rule
        picks[rule] = res.response_ids
    for c in toy.complete(toy.calls[-1]):
        ids, bonus = list(PROMPT), 0.0
        for tok in c.ids:
            bonus -= float(logsumexp(alpha * toy.table.log_p0(ids[-1], len(ids))))
            ids.append(int(tok))
        assert bonus >= 0.0
        assert math.fsum(c.logq) == pytest.approx(alpha * math.fsum(c.logp0) + bonus)
    assert picks["logq"] != picks["logp0"]


@pytest.mark.parametrize("make, bad, match", [
    (PowerSMCConfig, dict(particles=2.5), "particles must be an integer"),
    (PowerSMCConfig, dict(block_size=1.5), "block_size must be an integer"),
    (PowerSMCConfig, dict(particles=True), "particles must be an integer"),
    (PowerSMCConfig, dict(seed=1.5), "seed must be an integer"),
    (PowerSMCConfig, dict(alpha=math.inf), "alpha must be finite"),
    (BaselineConfig, dict(kind="best-of-n", samples=2.5), "samples must be an integer"),
    (BaselineConfig, dict(max_new_tokens=2.5), "max_new_tokens must be an integer"),
    (BaselineConfig, dict(seed=0.5), "seed must be an integer"),
    (BaselineConfig, dict(alpha=math.inf), "alpha must be finite"),
])
def test_ill_typed_smc_and_baseline_configs_are_refused_at_construction(make, bad, match):
    """A float count failed deep inside a run ('float' object cannot be interpreted as an integer); α = inf
    (τ = 0) and a float seed ran silently: refused by name, as SamplerConfig does."""
    with pytest.raises(ValueError, match=match):
        make(**bad)
    assert make(max_new_tokens=np.int64(8), seed=np.int64(3)).max_new_tokens == 8


def test_a_backend_that_returns_nothing_unfinished_is_an_error_not_a_loop():
    """A completion with no token and no EOS (a server cut at its context) left the particle unfinished with the
    same request to send again: PowerSMC.run looped for ever.  It is an EngineError naming the particle."""
    from forerun.programs.completions import Completion
    from forerun.runtime_ext.protocol import EngineError

    class Silent:
        calls = 0

        def complete(self, requests):
            Silent.calls += 1
            assert Silent.calls < 5, "looping"
            empty = np.zeros(0)
            return [Completion(np.zeros(0, dtype=np.int64), empty, empty, empty, False) for _ in requests]

    smc = PowerSMC(Silent(), PowerSMCConfig(alpha=2.0, particles=3, max_new_tokens=8, block_size=4, ramp_tokens=0))
    with pytest.raises(EngineError, match="no token and no EOS for particle 0"):
        smc.run([1, 2, 3])
