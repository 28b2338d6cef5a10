"""Acceptance rules against brute force: exact transition kernels on a toy model whose π_α is enumerable.

For each sampler we build the exact one-transition kernel P(x, y) over all responses of length T (tiny
vocabulary) from the module's acceptance functions, and check detailed balance π_α(x) P(x, y) = π_α(y) P(y, x)
and stationarity π_α P = π_α with π_α computed exactly by enumeration.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from forerun.programs.acceptance import (
    accept_decision,
    cut_by_gumbel_max,
    cut_from_law,
    entropy_cut_law,
    entropy_cut_log_ratio,
    entropy_jumps,
    epsilon_class,
    log_acceptance,
    log_mh_ratio,
    mixture_log_density,
    mtm_log_ratio,
    mtm_log_weight,
    mtm_select,
    suffix_sum,
)
from forerun.testing.logit_table_model import LogitTableModel

PROMPT = (0,)
TEMPS = (0.25, 0.5, 1.0)


def arrays(model: LogitTableModel, resp, tau: float):
    """Per-position log q_τ, log p0, entropy, log q per τ' ∈ TEMPS of a response after PROMPT."""
    ids = list(PROMPT)
    lq, lp, ent, byt = [], [], [], []
    for tok in resp:
        pos = len(ids)
        p0 = model.log_p0(ids[-1], pos)
        lq.append(model.log_q(ids[-1], pos, tau)[tok])
        lp.append(p0[tok])
        ent.append(-float(np.dot(np.exp(p0), p0)))
        byt.append([model.log_q(ids[-1], pos, t)[tok] for t in TEMPS])
        ids.append(tok)
    return np.array(lq), np.array(lp), np.array(ent), np.array(byt).T


def target(model, states, alpha):
    logp = np.array([alpha * model.sequence_logp0(PROMPT, s) for s in states])
    p = np.exp(logp - logp.max())
    return p / p.sum()


def check_kernel(P, pi):
    assert np.allclose(P.sum(axis=1), 1.0, atol=1e-12)
    flow = pi[:, None] * P
    assert np.allclose(flow, flow.T, atol=1e-12), "detailed balance fails"
    assert np.allclose(pi @ P, pi, atol=1e-12), "π_α is not stationary"


def power_mh_kernel(model, T, alpha, tau, with_entropy_cut=False, beta=4.0):
    states = list(itertools.product(range(model.vocab_size), repeat=T))
    index = {s: i for i, s in enumerate(states)}
    P = np.zeros((len(states), len(states)))
    for x in states:
        xq, xp, xh, _ = arrays(model, x, tau)
        law = entropy_cut_law(xh, beta) if with_entropy_cut else np.full(T, 1.0 / T)
        for c in range(T):
            if law[c] == 0:
                continue
            for s in itertools.product(range(model.vocab_size), repeat=T - c):
                y = x[:c] + s
                q = math.exp(model.sequence_logq(PROMPT + x[:c], s, tau))
                yq, yp, yh, _ = arrays(model, y, tau)
                if with_entropy_cut:
                    r = entropy_cut_log_ratio(xq, xp, xh, yq, yp, yh, c, alpha, beta)
                else:
                    r = log_mh_ratio(xq, xp, yq, yp, c, alpha)
                a = math.exp(log_acceptance(r))
                P[index[x], index[y]] += law[c] * q * a
                P[index[x], index[x]] += law[c] * q * (1 - a)
    return states, P


@pytest.mark.parametrize("alpha", [1.0, 4.0])
def test_power_mh_kernel_is_pi_alpha_reversible(alpha):
    model = LogitTableModel(3, seed=1)
    states, P = power_mh_kernel(model, T=3, alpha=alpha, tau=1 / alpha)
    check_kernel(P, target(model, states, alpha))


def test_power_mh_with_another_temperature_still_targets_pi_alpha():
    model = LogitTableModel(3, seed=2)
    states, P = power_mh_kernel(model, T=3, alpha=4.0, tau=0.7)
    check_kernel(P, target(model, states, 4.0))


@pytest.mark.parametrize("seed", [3, 4])
def test_entropy_cut_kernel_is_pi_alpha_reversible(seed):
    model = LogitTableModel(3, seed=seed, period=2)
    states, P = power_mh_kernel(model, T=3, alpha=4.0, tau=0.25, with_entropy_cut=True)
    check_kernel(P, target(model, states, 4.0))


def test_entropy_cut_without_correction_breaks_balance():
    """The cut-law correction is necessary: dropping it breaks detailed balance on the same model."""
    model = LogitTableModel(3, seed=3, period=2)
    states = list(itertools.product(range(3), repeat=3))
    index = {s: i for i, s in enumerate(states)}
    P = np.zeros((27, 27))
    for x in states:
        xq, xp, xh, _ = arrays(model, x, 0.25)
        law = entropy_cut_law(xh, 4.0)
        for c in range(3):
            for s in itertools.product(range(3), repeat=3 - c):
                y = x[:c] + s
                yq, yp, _, _ = arrays(model, y, 0.25)
                q = math.exp(model.sequence_logq(PROMPT + x[:c], s, 0.25))
                a = math.exp(log_acceptance(log_mh_ratio(xq, xp, yq, yp, c, 4.0)))
                P[index[x], index[y]] += law[c] * q * a
                P[index[x], index[x]] += law[c] * q * (1 - a)
    pi = target(model, states, 4.0)
    assert not np.allclose(pi @ P, pi, atol=1e-6)


def mtm_kernel(model, T, alpha, M):
    """Exact MTM kernel: candidates and references i.i.d. from the temperature mixture Q(·|x_{0:c})."""
    V = model.vocab_size
    states = list(itertools.product(range(V), repeat=T))
    index = {s: i for i, s in enumerate(states)}
    P = np.zeros((len(states), len(states)))
    for x in states:
        xa = arrays(model, x, 1.0)
        for c in range(T):
            suffixes = list(itertools.product(range(V), repeat=T - c))
            full = [x[:c] + s for s in suffixes]
            qmix = np.array([math.exp(mixture_log_density(arrays(model, y, 1.0)[3], c)) for y in full])
            direct = np.array([np.mean([math.exp(model.sequence_logq(PROMPT + x[:c], s, t)) for t in TEMPS])
                               for s in suffixes])
            assert np.allclose(qmix, direct)
            logw = np.array([mtm_log_weight(arrays(model, y, 1.0)[1], arrays(model, y, 1.0)[3], c, alpha) for y in full])
            logw_x = mtm_log_weight(xa[1], xa[3], c, alpha)
            for cand in itertools.product(range(len(full)), repeat=M):
                pc = np.prod(qmix[list(cand)])
                lw = logw[list(cand)]
                sel = np.exp(lw - np.logaddexp.reduce(lw))
                for J in range(M):
                    for refs in itertools.product(range(len(full)), repeat=M - 1):
                        pr = np.prod(qmix[list(refs)]) if refs else 1.0
                        ref_lw = list(logw[list(refs)]) + [logw_x]
                        a = math.exp(log_acceptance(mtm_log_ratio(lw, ref_lw)))
                        mass = (1.0 / T) * pc * sel[J] * pr
                        P[index[x], index[full[cand[J]]]] += mass * a
                        P[index[x], index[x]] += mass * (1 - a)
    return states, P


@pytest.mark.parametrize("T,M", [(3, 2), (2, 3)])
def test_multitry_kernel_is_pi_alpha_reversible(T, M):
    model = LogitTableModel(2, seed=5)
    states, P = mtm_kernel(model, T=T, alpha=4.0, M=M)
    check_kernel(P, target(model, states, 4.0))


def test_eq6_matches_direct_sequence_probabilities():
    model = LogitTableModel(4, seed=6)
    x, y, c = (1, 2, 3, 0, 1), (1, 2, 0, 0, 3), 2
    xq, xp, _, _ = arrays(model, x, 0.25)
    yq, yp, _, _ = arrays(model, y, 0.25)
    direct = (model.sequence_logq(PROMPT + x[:c], x[c:], 0.25) - model.sequence_logq(PROMPT + x[:c], y[c:], 0.25)
              + 4.0 * (model.sequence_logp0(PROMPT + x[:c], y[c:]) - model.sequence_logp0(PROMPT + x[:c], x[c:])))
    assert log_mh_ratio(xq, xp, yq, yp, c, 4.0) == pytest.approx(direct, abs=1e-12)
    assert suffix_sum(xp, c) == pytest.approx(model.sequence_logp0(PROMPT + x[:c], x[c:]))


def test_entropy_law_definition_and_fallback():
    h = np.array([1.0, 2.0, 1.5, 3.0])
    assert list(entropy_jumps(h)) == [1.0, 1.0, -0.5, 1.5]  # ΔH_0 = H_0 (Zhou et al.: diff(H, prepend=0))
    law = entropy_cut_law(h, 2.0)
    assert law == pytest.approx(np.array([1, 1, 0, 2.25]) / 4.25)
    assert list(entropy_cut_law([0.0, 0.0, 0.0], 4.0)) == pytest.approx([1 / 3] * 3)  # all-zero -> uniform
    assert entropy_cut_law([3.0, 2.0, 1.0], 4.0) == pytest.approx([1.0, 0.0, 0.0])  # only the first jump is up
    assert cut_from_law(law, 0.0) == 0 and cut_from_law(law, 0.999) == 3
    with pytest.raises(ValueError, match="beta"):
        entropy_cut_law(h, 0.0)


def test_entropy_law_at_a_large_beta_is_not_uniform():
    """ΔH^β overflowing (3^1000) or every positive one underflowing (0.4^1000) used to make the law uniform: cuts
    with no entropy jump drew the mass of the largest one.  The law is ∝ ΔH^β, normalized in log space there."""
    assert list(entropy_cut_law([0.0, 3.0, 0.1], 1000.0)) == [0.0, 1.0, 0.0]
    assert list(entropy_cut_law([0.4, 0.8, 0.8], 1000.0)) == [0.5, 0.5, 0.0]  # jumps 0.4, 0.4, 0: a tie
    assert list(entropy_cut_law([0.3, 0.5, 0.5], 1000.0)) == pytest.approx([1.0, 0.0, 0.0])  # 0.3 ≫ 0.2 at β = 1000
    assert list(entropy_cut_law([0.0, 0.0], 1000.0)) == [0.5, 0.5]  # no positive jump: uniform, as before
    h = np.array([1.0, 2.0, 1.5, 3.0])
    assert np.array_equal(entropy_cut_law(h, 2.0), np.array([1, 1, 0, 2.25]) / 4.25)  # unchanged where finite


def test_gumbel_max_cut_draws_the_law_and_never_a_zero_weight_cut():
    rng = np.random.default_rng(1)
    law = np.array([0.1, 0.0, 0.6, 0.3])
    draws = np.bincount([cut_by_gumbel_max(law, rng.gumbel(size=4)) for _ in range(20000)], minlength=4) / 20000
    assert draws[1] == 0 and draws == pytest.approx(law, abs=0.015)
    # the winner at or before κ is decided by the scores at t <= κ: another law with the same weights there
    # (other normalizer, other weights after κ) picks the same cut or one after κ
    for _ in range(2000):
        g, kappa = rng.gumbel(size=4), 2
        c = cut_by_gumbel_max(law, g)
        other = np.concatenate([law[: kappa + 1], rng.random(1)])
        c_other = cut_by_gumbel_max(other / other.sum(), g)
        if c <= kappa:
            assert c_other == c or c_other > kappa
    with pytest.raises(ValueError, match="one Gumbel per cut"):
        cut_by_gumbel_max(law, [0.0])


def test_inverse_cdf_matches_law():
    rng = np.random.default_rng(0)
    law = np.array([0.1, 0.0, 0.6, 0.3])
    draws = np.bincount([cut_from_law(law, u) for u in rng.random(20000)], minlength=4) / 20000
    assert draws == pytest.approx(law, abs=0.015)
    assert mtm_select(np.log([0.2, 0.8]), 0.1) == 0 and mtm_select(np.log([0.2, 0.8]), 0.3) == 1


def test_epsilon_classes_and_decision():
    assert epsilon_class(0.01) == "reject" and epsilon_class(0.99) == "accept" and epsilon_class(0.5) == "uncertain"
    assert accept_decision(math.log(0.3), math.log(0.5)) and not accept_decision(math.log(0.6), math.log(0.5))
    with pytest.raises(ValueError, match="acceptance probability"):
        epsilon_class(1.5)
    with pytest.raises(ValueError, match="cut"):
        log_mh_ratio([0.0], [0.0], [0.0], [0.0], 1, 4.0)
    with pytest.raises(ValueError, match="NaN"):
        log_acceptance(float("nan"))


def _state(model, x, tau):
    from forerun.programs.transitions import ChainState

    lq, lp, ent, byt = arrays(model, x, tau)
    return ChainState(np.array(x), lq, lp, ent, byt)


@pytest.mark.parametrize("kind", ["power-mh", "entropy-cut", "multitry-mh"])
def test_sampler_kernels_draw_from_the_exact_kernel(kind):
    """Chi-square: one transition of the samplers' kernels (keyed streams, splice, decision) from a fixed
    state, over many seeds, against the brute-force kernel row."""
    from scipy import stats

    from forerun.programs.random_streams import DecisionStream
    from forerun.programs.samplers import make_kernel
    from forerun.programs.sampler_config import SamplerConfig

    V, T, alpha = (2, 3, 4.0) if kind == "multitry-mh" else (3, 3, 4.0)
    model = LogitTableModel(V, seed=3, period=2, tempered_temperatures=TEMPS)
    cfg = SamplerConfig(kind=kind, response_length=T, block_size=T, alpha=alpha, mtm_candidates=2)
    kernel = make_kernel(cfg)
    if kind == "multitry-mh":
        states, P = mtm_kernel(model, T=T, alpha=alpha, M=2)
    else:
        states, P = power_mh_kernel(model, T=T, alpha=alpha, tau=1 / alpha, with_entropy_cut=kind == "entropy-cut")
    x = states[5]
    xs = _state(model, x, 1 / alpha)
    index = {s: i for i, s in enumerate(states)}
    counts = np.zeros(len(states))
    n = 3000
    for seed in range(n):
        stream = DecisionStream(seed, 1, 1)
        c = kernel.cut(xs, 0, stream)
        reqs = kernel.requests(PROMPT + x[:c], c, T, 0, stream)
        d = kernel.decide(xs, c, model.generate(reqs), 0, stream)
        nxt = tuple(int(t) for t in d.proposal.tokens) if accept_decision(stream.accept_log_uniform(0), d.log_accept) else x
        counts[index[nxt]] += 1
    expected = P[index[x]] * n
    keep = expected >= 5
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3
