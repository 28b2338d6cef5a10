"""Convergence of the three sequential kernels on an exactly enumerable toy (vocabulary 3-4, n = 3).

Detailed balance alone does not show convergence (STYLE.md), so for PowerMH, EntropyCut and MultiTryMH we

1. build the full one-step transition matrix P by exact enumeration with an ORACLE that uses only the toy's
   raw logits (its own softmax, entropies, Zhou et al.'s clip(diff(H, prepend=0), 0)^β cut law, full-sequence
   MH / Liu et al. ratios) and none of forerun's acceptance code, and check π_α P = π_α (π_α ∝ p0^α computed
   from the logits), a single unit eigenvalue and no other eigenvalue on the unit circle (irreducible,
   aperiodic), and TV(δ_x P^k, π_α) < 1e-3 for some k from every start state x;
2. build P again from the code under test (the sampler's kernel objects: cut law, requests, decide; for
   MultiTryMH its weight function) and require it to equal the oracle's P, and to pass the same checks;
3. draw one transition with the sampler's kernels (keyed streams, engine-contract toy model) from several
   start states and compare with the oracle's rows (chi-square).

With ΔH_0 := 0 (EntropyCut's first version) step 2 fails: cut 0 is never drawn, P has five unit
eigenvalues here and from a point mass the distance to π_α never shrinks.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats
from scipy.special import logsumexp

from forerun.programs.acceptance import mtm_log_weight
from forerun.programs.transitions import ChainState
from forerun.programs.suffixes import Suffix
from forerun.programs.random_streams import DecisionStream
from forerun.programs.samplers import make_kernel
from forerun.programs.sampler_config import SamplerConfig
from forerun.testing.logit_table_model import LogitTableModel

PROMPT = (0,)
TEMPS = (0.25, 0.5, 1.0)
ALPHA, BETA = 4.0, 4.0
KINDS = ("power-mh", "entropy-cut", "multitry-mh")
SETUPS = {  # kind -> (vocabulary, n, model seed, period)
    "power-mh": (4, 3, 1, 3),
    "entropy-cut": (3, 3, 3, 2),
    "multitry-mh": (3, 3, 5, 3),
}


# -- the oracle: the toy's raw logits and the textbook formulas, nothing from forerun's acceptance code -------
def log_softmax(z: np.ndarray) -> np.ndarray:
    return z - logsumexp(z)


def token_logprobs(model: LogitTableModel, prefix, cont, temperature: float) -> list[float]:
    ids, out = list(prefix), []
    for tok in cont:
        out.append(float(log_softmax(model.logits(ids[-1], len(ids)) / temperature)[tok]))
        ids.append(int(tok))
    return out


def entropies(model: LogitTableModel, x) -> np.ndarray:
    """H_t of p0(. | prompt, x_{0:t}) for t = 0..T-1 (H_0 at the prompt's last position)."""
    ids, out = list(PROMPT), []
    for tok in x:
        lp = log_softmax(model.logits(ids[-1], len(ids)))
        out.append(-float(np.dot(np.exp(lp), lp)))
        ids.append(int(tok))
    return np.array(out)


def zhou_cut_law(h: np.ndarray) -> np.ndarray:
    """Zhou et al.: weights clip(diff(H, prepend=0), 0)^β, uniform if all vanish."""
    w = np.clip(np.diff(h, prepend=0.0), 0.0, None) ** BETA
    return w / w.sum() if w.sum() > 0 else np.full(len(h), 1.0 / len(h))


def oracle_target(model, states) -> np.ndarray:
    logp = np.array([ALPHA * sum(token_logprobs(model, PROMPT, s, 1.0)) for s in states])
    p = np.exp(logp - logp.max())
    return p / p.sum()


def _cut_laws(model, states, kind, T):
    if kind == "entropy-cut":
        return {x: zhou_cut_law(entropies(model, x)) for x in states}
    return {x: np.full(T, 1.0 / T) for x in states}


def oracle_mh_matrix(model, kind: str, T: int) -> tuple[list, np.ndarray]:
    """PowerMH / EntropyCut:
    P(x, y) = Σ_c ρ_x(c) q_τ(y_{c:}|x_{0:c}) min(1, π(y)ρ_y(c)q(x|y,c) / π(x)ρ_x(c)q(y|x,c))."""
    V, tau = model.vocab_size, 1.0 / ALPHA
    states = list(itertools.product(range(V), repeat=T))
    index = {s: i for i, s in enumerate(states)}
    logpi = {s: ALPHA * sum(token_logprobs(model, PROMPT, s, 1.0)) for s in states}
    law = _cut_laws(model, states, kind, T)
    P = np.zeros((len(states), len(states)))
    for x in states:
        for c in range(T):
            if law[x][c] == 0:
                continue
            back = sum(token_logprobs(model, PROMPT + x[:c], x[c:], tau))
            for s in itertools.product(range(V), repeat=T - c):
                y = x[:c] + s
                fwd = sum(token_logprobs(model, PROMPT + x[:c], s, tau))
                if law[y][c] == 0:
                    a = 0.0
                else:
                    log_r = logpi[y] + math.log(law[y][c]) + back - logpi[x] - math.log(law[x][c]) - fwd
                    a = math.exp(min(0.0, log_r))
                P[index[x], index[y]] += law[x][c] * math.exp(fwd) * a
                P[index[x], index[x]] += law[x][c] * math.exp(fwd) * (1 - a)
    return states, P


def _mtm_row(T, c, x, suffixes, q_mix, log_w, log_w_x, index, P):
    """One cut's contribution of the M = 2 multiple-try kernel (Liu et al. 2000), vectorised."""
    w = np.exp(log_w - log_w.max())
    wx = math.exp(log_w_x - log_w.max())
    pair = w[:, None] + w[None, :]                                                  # W_ab = w_a + w_b
    acc = np.minimum(1.0, pair[:, :, None] / (w[None, None, :] + wx))             # reference r, then x
    acc = np.tensordot(acc, q_mix, axes=([2], [0]))                               # E_r[A(a, b, r)]
    move = 2.0 * q_mix * np.sum(q_mix[None, :] * (w[:, None] / pair) * acc, axis=1)  # select a = s
    for s, m in zip(suffixes, move):
        P[index[x], index[x[:c] + s]] += m / T
    P[index[x], index[x]] += (1.0 - move.sum()) / T


def oracle_mtm_matrix(model, T: int) -> tuple[list, np.ndarray]:
    """MultiTryMH, M = 2: candidates and the reference i.i.d. from Q = mean_τ q_τ, weights w = π(y)/Q(y|x_{0:c})."""
    V = model.vocab_size
    states = list(itertools.product(range(V), repeat=T))
    index = {s: i for i, s in enumerate(states)}
    P = np.zeros((len(states), len(states)))
    for x in states:
        for c in range(T):
            suffixes = list(itertools.product(range(V), repeat=T - c))
            prefix = PROMPT + x[:c]

            def log_q_mix(s):
                return logsumexp([sum(token_logprobs(model, prefix, s, t)) for t in TEMPS]) - math.log(len(TEMPS))

            def log_pi(s):
                return ALPHA * sum(token_logprobs(model, PROMPT, x[:c] + s, 1.0))

            lq = np.array([log_q_mix(s) for s in suffixes])
            log_w = np.array([log_pi(s) for s in suffixes]) - lq
            _mtm_row(T, c, x, suffixes, np.exp(lq), log_w, log_pi(x[c:]) - log_q_mix(x[c:]), index, P)
    return states, P


# -- the code under test -----------------------------------------------------------------------------
def toy_arrays(model: LogitTableModel, prefix, cont, tau: float) -> Suffix:
    """What the engine returns for `cont` after `prefix` (the toy's tables; sampler code not involved)."""
    ids, lq, lp, ent, byt = list(prefix), [], [], [], []
    for tok in cont:
        pos, p0 = len(ids), model.log_p0(ids[-1], len(ids))
        lq.append(model.log_q(ids[-1], pos, tau)[tok])
        lp.append(p0[tok])
        ent.append(-float(np.dot(np.exp(p0), p0)))
        byt.append([model.log_q(ids[-1], pos, t)[tok] for t in TEMPS])
        ids.append(int(tok))
    return Suffix(np.array(cont, dtype=np.int64), np.array(lq), np.array(lp), np.array(ent),
                  np.array(byt).T.reshape(len(TEMPS), len(cont)))


def code_state(model, x, tau) -> ChainState:
    s = toy_arrays(model, PROMPT, x, tau)
    return ChainState(s.ids, s.logq, s.logp0, s.entropy, s.logq_by_temp)


def code_kernel(kind: str, T: int):
    return make_kernel(SamplerConfig(kind=kind, response_length=T, block_size=T, alpha=ALPHA, beta=BETA,
                                     mtm_candidates=2, mtm_temperatures=TEMPS))


def state_space(V: int, T: int) -> tuple[list[tuple[int, ...]], dict[tuple[int, ...], int], np.ndarray]:
    """Every response of T tokens over V, its index, and an empty transition matrix over them."""
    states = list(itertools.product(range(V), repeat=T))
    return states, {s: i for i, s in enumerate(states)}, np.zeros((len(states), len(states)))


def code_mh_matrix(model, kind: str, T: int) -> np.ndarray:
    """P from the kernel object: its cut law, its request (prefix, length, τ) and its decision on each
    possible suffix; the suffix's probability is the toy engine's at the request's temperature."""
    kernel, V, stream = code_kernel(kind, T), model.vocab_size, DecisionStream(0, 1, 1)
    states, index, P = state_space(V, T)
    for x in states:
        xs = code_state(model, x, 1 / ALPHA)
        law = kernel.cut_law(xs)
        for c in np.flatnonzero(law):
            (req,) = kernel.requests(PROMPT + x[:c], int(c), T, 0, stream)
            assert req.prefix_ids == PROMPT + x[:c] and req.max_tokens == T - c
            for s in itertools.product(range(V), repeat=T - c):
                suffix = toy_arrays(model, req.prefix_ids, s, req.temperature)
                a = math.exp(kernel.decide(xs, int(c), [suffix], 0, stream).log_accept)
                q = math.exp(float(np.sum(suffix.logq)))
                P[index[x], index[x[:c] + s]] += law[c] * q * a
                P[index[x], index[x]] += law[c] * q * (1 - a)
    return P


def code_mtm_matrix(model, T: int) -> np.ndarray:
    """P with the sampler's MTM weight function (mtm_log_weight, mixture Q from log q per τ' ∈ 𝒯)."""
    kernel, V = code_kernel("multitry-mh", T), model.vocab_size
    states, index, P = state_space(V, T)
    for x in states:
        xs = code_state(model, x, 1 / ALPHA)
        law = kernel.cut_law(xs)
        for c in range(T):
            suffixes = list(itertools.product(range(V), repeat=T - c))
            ys = [xs.splice(c, toy_arrays(model, PROMPT + x[:c], s, 1.0)) for s in suffixes]
            q_mix = np.array([np.mean(np.exp(np.sum(y.logq_by_temp[:, c:], axis=1))) for y in ys])
            log_w = np.array([mtm_log_weight(y.logp0, y.logq_by_temp, c, kernel.alpha) for y in ys])
            log_w_x = mtm_log_weight(xs.logp0, xs.logq_by_temp, c, kernel.alpha)
            _mtm_row(T, c, x, suffixes, q_mix, log_w, log_w_x, index, P)
            assert law[c] == pytest.approx(1.0 / T)
    return P


# -- the checks --------------------------------------------------------------------------------------
def assert_converges(P: np.ndarray, pi: np.ndarray) -> int:
    """π P = π, detailed balance, one unit eigenvalue and none other on the unit circle, and
    max_x TV(δ_x P^k, π) < 1e-3 at some k = 2^i; returns that k."""
    assert np.allclose(P.sum(axis=1), 1.0, atol=1e-12)
    assert np.allclose(pi @ P, pi, atol=1e-12), "π_α is not stationary"
    flow = pi[:, None] * P
    assert np.allclose(flow, flow.T, atol=1e-12), "detailed balance fails"
    moduli = np.abs(np.linalg.eigvals(P))
    near_one = int(np.sum(moduli > 1.0 - 1e-9))
    assert near_one == 1, f"{near_one} eigenvalues on the unit circle: the chain is reducible or periodic"
    Pk, k = P.copy(), 1
    for _ in range(40):
        tv = 0.5 * np.abs(Pk - pi[None, :]).sum(axis=1).max()
        if tv < 1e-3:
            return k
        Pk, k = Pk @ Pk, 2 * k
    raise AssertionError(f"TV(δ_x P^k, π_α) = {tv:.3g} after k = {k} steps")


@pytest.fixture(scope="module", params=KINDS)
def case(request):
    kind = request.param
    V, T, seed, period = SETUPS[kind]
    model = LogitTableModel(V, seed=seed, period=period, tempered_temperatures=TEMPS)
    states, P = oracle_mtm_matrix(model, T) if kind == "multitry-mh" else oracle_mh_matrix(model, kind, T)
    return kind, model, T, states, P, oracle_target(model, states)


def test_oracle_kernel_is_reversible_irreducible_and_mixes(case):
    kind, _, _, _, P, pi = case
    k = assert_converges(P, pi)
    assert k <= 2**30, kind


def test_code_kernel_equals_the_oracle_and_converges(case):
    kind, model, T, _, P_oracle, pi = case
    P = code_mtm_matrix(model, T) if kind == "multitry-mh" else code_mh_matrix(model, kind, T)
    assert_converges(P, pi)
    assert np.allclose(P, P_oracle, atol=1e-12), f"{kind}: the sampler's kernel differs from the oracle"


def test_entropy_cut_reaches_cut_zero():
    """The EntropyCut law of every state of the toy gives the first token positive probability."""
    V, T, seed, period = SETUPS["entropy-cut"]
    model = LogitTableModel(V, seed=seed, period=period)
    kernel = code_kernel("entropy-cut", T)
    for x in itertools.product(range(V), repeat=T):
        law = kernel.cut_law(code_state(model, x, 1 / ALPHA))
        assert law[0] > 0 and law == pytest.approx(zhou_cut_law(entropies(model, x)), abs=1e-12)


def test_sampler_kernels_draw_the_oracle_rows(case):
    """One transition of the sampler (keyed streams, engine-contract toy) from three start states."""
    kind, model, T, states, P, _ = case
    kernel = code_kernel(kind, T)
    index = {s: i for i, s in enumerate(states)}
    n = 1000
    for x in (states[0], states[len(states) // 2], states[-1]):
        xs = code_state(model, x, 1 / ALPHA)
        counts = np.zeros(len(states))
        for seed in range(n):
            stream = DecisionStream(seed, 2, 1)
            c = kernel.cut(xs, 0, stream)
            d = kernel.decide(xs, c, model.generate(kernel.requests(PROMPT + x[:c], c, T, 0, stream)), 0, stream)
            nxt = tuple(int(t) for t in d.proposal.tokens) if stream.accept_log_uniform(0) < d.log_accept else x
            counts[index[nxt]] += 1
        expected = P[index[x]] * n
        assert counts[expected == 0].sum() == 0, f"{kind} from {x}: moved where the oracle cannot"
        keep = expected >= 5
        obs, exp = np.append(counts[keep], counts[~keep].sum()), np.append(expected[keep], expected[~keep].sum())
        if exp[-1] == 0:
            obs, exp = obs[:-1], exp[:-1]
        assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-4, f"{kind} from {x}"
