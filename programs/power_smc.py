"""Power-SMC (Azizi et al. 2026, arXiv 2602.10273): sequential Monte Carlo toward π_α ∝ p0^α.

P particles are advanced together, one batched model call per block of B tokens (`completions`); each
token adds an importance-weight increment toward the bridged target; when the effective sample size falls
below κ·P the particles are resampled with counter-based uniforms.

    paper                                      code
    π_α(y | x) ∝ p0(y | x)^α                   PowerSMCConfig.alpha
    proposal q_τ, τ = 1/α                      PowerSMCConfig.tau (fixed over the run, see below)
    P particles                                PowerSMCConfig.particles
    resample when ESS < κ·P                    PowerSMCConfig.ess_threshold (κ)
    block of B tokens between ESS checks       PowerSMCConfig.block_size
    exponent bridge α_t, ramp over T_r tokens  bridged_exponent(t, alpha, ramp_tokens)
    intermediate target γ_t = p0(y_{1:t})^α_t  log_weight_increment

Weights.  With L_t = log p0(y_{1:t}) and Q_t = log q_τ(y_{1:t}), the increment of a token is
α_t log p0(y_t) + (α_t − α_{t−1}) L_{t−1} − log q_τ(y_t): the first term is the power target's token
factor, the second moves the whole prefix from γ_{t−1} to γ_t (the bridge), the third the proposal.  Over a
block from t0 to t1 they telescope to α_{t1} L_{t1} − α_{t0} L_{t0} − (Q_{t1} − Q_{t0}).  A particle that
ends (EOS, or the token budget) is bridged to the final exponent at once, (α − α_t) L_t, so every finished
particle is weighted toward p0^α itself: the schedule changes the intermediate targets, never the final
one.  With ramp_tokens = 0 the increment is the plain α log p0(y_t) − log q_τ(y_t).

Proposal.  The reference code also lowers the proposal temperature along the ramp (τ_t = 1/α_t); here τ is
1/α throughout (one temperature per request, as SGLang's sampling params have), which keeps the weights
exact and is the proposal the paper proves variance-optimal at the final exponent.

Final answer (`PowerSMCConfig.final`, `FINAL_RULES`).  "sample" (default): a particle drawn with probability
∝ its final weight (a keyed uniform), as the reference implementation does: that is the SMC approximation of
one draw from π_α, the distribution the MH samplers target, so accuracies compare like with like.  "max": the
particle with the largest importance weight.  That is NOT the most likely particle under π_α: a weight is
π_α / (proposal) accumulated since the last resampling (after one, every survivor restarts from the same mean
weight), so it ranks how much the proposal under-sampled a particle's recent blocks, not its p0.
"max-logp0": the particle with the largest Σ_t log p0(y_t | y_<t), i.e. the most likely under p0, hence under
π_α ∝ p0^α (any α > 0): the mode-seeking choice among the final particles.  Neither "max" rule is a sample of
π_α, and Σ log p0 is not length-normalized: it favours particles that ended early (EOS).

Randomness is keyed by (seed, prompt, block, particle) for the suffix seeds and (seed, prompt, block) for
the resampling uniform: runs are reproducible and independent of batching.  EOS semantics follow E.8:
particles stop at EOS (up to `max_new_tokens`); a finished particle is carried unchanged.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
from scipy.special import logsumexp

from ..runtime_ext.protocol import EngineError, as_finite, as_integer, check_parallel_sequences, check_proposal_temperature
from .completions import Completion, CompletionModel, CompletionRequest, DecodeResult
from .random_streams import PAPER_SEED, SEED_RANGE, keyed_generator, prompt_key
from .selection_rules import FINAL_RULES

PARTICLE_SEED_PURPOSE, RESAMPLE_PURPOSE, FINAL_PURPOSE = 301, 302, 303


@dataclass(frozen=True)
class PowerSMCConfig:
    """Power-SMC settings (published defaults noted; the CPU eval uses smaller ones)."""

    alpha: float = 4.0
    """α of π_α ∝ p0^α.  Published: 4."""
    particles: int = 64
    """P.  Published: 64 (E.8 sweeps 2-32)."""
    max_new_tokens: int = 1024
    """Most tokens per particle (EOS stops earlier).  E.8: 1024."""
    block_size: int = 64
    """B: tokens per batched call; ESS is checked after each block.  Published: 64 (E.8: 128)."""
    ess_threshold: float = 0.5
    """κ: resample when ESS < κ·P.  Published: 0.5."""
    ramp_tokens: int = 400
    """T_r: α_t ramps linearly from 1 to α over the first T_r tokens (0: no bridge).  Published: 400."""
    resampling: str = "systematic"
    """"systematic" (one keyed uniform) or "multinomial" (P keyed uniforms)."""
    final: str = "sample"
    """The answer (`FINAL_RULES`): "sample" (a particle drawn ∝ final weight, a draw of π_α; default), "max"
    (the largest importance weight) or "max-logp0" (the largest Σ log p0: the most likely under π_α)."""
    seed: int = PAPER_SEED
    """Run seed.  Table 6: `PAPER_SEED` = 10086."""

    def __post_init__(self) -> None:
        # Types first (as SamplerConfig): a float count failed deep inside a run, α = inf or seed 1.5 ran silently.
        for name in ("particles", "max_new_tokens", "block_size", "ramp_tokens", "seed"):
            object.__setattr__(self, name, as_integer(name, getattr(self, name)))
        for name in ("alpha", "ess_threshold"):
            object.__setattr__(self, name, as_finite(name, getattr(self, name)))
        if not self.alpha >= 1:
            raise ValueError(f"alpha must be >= 1 (a sharpening power), got {self.alpha}")
        check_proposal_temperature("τ (1/α)", self.tau)
        check_parallel_sequences("particles", self.particles)
        for name in ("max_new_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.ess_threshold <= 1:
            raise ValueError(f"ess_threshold κ must be in [0, 1], got {self.ess_threshold}")
        if self.ramp_tokens < 0:
            raise ValueError(f"ramp_tokens must be >= 0, got {self.ramp_tokens}")
        if self.resampling not in ("systematic", "multinomial"):
            raise ValueError(f"resampling must be 'systematic' or 'multinomial', got {self.resampling!r}")
        if self.final not in FINAL_RULES:
            raise ValueError(f"final must be one of {tuple(FINAL_RULES)}, got {self.final!r}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")

    @property
    def tau(self) -> float:
        return 1.0 / self.alpha


def bridged_exponent(t: int, alpha: float, ramp_tokens: int) -> float:
    """α_t: 1 at t = 0, rising linearly to α at t = T_r, then α (T_r = 0: α from the first token)."""
    if ramp_tokens <= 0:
        return alpha if t > 0 else 1.0
    return 1.0 + (alpha - 1.0) * min(1.0, t / ramp_tokens)


def log_weight_increment(logp0_before: float, logq_block: float, logp0_block: float, t0: int, t1: int,
                         alpha_t: Callable[[int], float], ended: bool, alpha: float) -> float:
    """Σ over tokens t0+1..t1 of the bridged increments (telescoped), plus the final bridge if `ended`."""
    after = logp0_before + logp0_block
    exponent_end = alpha if ended else alpha_t(t1)
    return exponent_end * after - alpha_t(t0) * logp0_before - logq_block


def effective_sample_size(log_w: np.ndarray) -> float:
    """ESS = (Σ w)² / Σ w² of unnormalized log-weights, with w scaled so the largest is exactly 1: equal weights
    give exactly P (the exp/log round trip of logsumexp gave 6.999999999999999 for 7 equal weights, so κ = 1
    resampled a cloud whose ESS is P)."""
    w = np.exp(log_w - np.max(log_w))
    return float(np.sum(w) ** 2 / np.sum(w * w))


def resample_indices(log_w: np.ndarray, uniforms: np.ndarray, systematic: bool) -> np.ndarray:
    """Ancestor indices: systematic (u_i = (i + U)/P from one uniform) or multinomial (P sorted uniforms)."""
    w = np.exp(log_w - logsumexp(log_w))
    cdf = np.cumsum(w)
    cdf[-1] = 1.0
    p = len(log_w)
    points = (np.arange(p) + uniforms[0]) / p if systematic else np.sort(uniforms)
    return np.minimum(np.searchsorted(cdf, points, side="right"), p - 1)


@dataclass
class Particle:
    """One partial response with its running log p0, log q_τ, log-weight and per-token arrays."""

    ids: list[int] = field(default_factory=list)
    logq: list[float] = field(default_factory=list)
    logp0: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    log_w: float = 0.0
    finished: bool = False
    """Done growing: it produced EOS or reached max_new_tokens."""
    eos: bool = False
    """It ended with EOS."""

    def copy(self) -> "Particle":
        return Particle(list(self.ids), list(self.logq), list(self.logp0), list(self.entropy), self.log_w,
                        self.finished, self.eos)

    def as_completion(self) -> Completion:
        return Completion(np.asarray(self.ids, dtype=np.int64), np.asarray(self.logq), np.asarray(self.logp0),
                          np.asarray(self.entropy, dtype=np.float64), self.eos)


class PowerSMC:
    """Power-SMC over a `CompletionModel` (one batched call per block)."""

    name = "power-smc"

    def __init__(self, model: CompletionModel, config: PowerSMCConfig,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.model = model
        self.config = config
        self.clock = clock

    def _alpha_t(self, t: int) -> float:
        return bridged_exponent(t, self.config.alpha, self.config.ramp_tokens)

    def _extend(self, prompt: tuple[int, ...], particles: list[Particle], key: int, block: int) -> tuple[float, int]:
        """One batched call: every unfinished particle gets up to B more tokens; weights updated.  Returns the
        call's wall time and the tokens it decoded."""
        cfg = self.config
        alive = [i for i, p in enumerate(particles) if not p.finished and len(p.ids) < cfg.max_new_tokens]
        reqs = [CompletionRequest(prompt + tuple(particles[i].ids),
                                  min(cfg.block_size, cfg.max_new_tokens - len(particles[i].ids)), cfg.tau,
                                  int(keyed_generator(cfg.seed, key, block, i, PARTICLE_SEED_PURPOSE)
                                      .integers(0, SEED_RANGE))) for i in alive]
        start = self.clock()
        outs = self.model.complete(reqs)
        wall = self.clock() - start
        for i, out in zip(alive, outs):
            if len(out.ids) == 0 and not out.finished:  # the next call would ask the same again, for ever
                raise EngineError(f"Power-SMC: the backend returned no token and no EOS for particle {i} "
                                  f"(block {block}, {len(particles[i].ids)} tokens so far); its context may be full")
            p = particles[i]
            t0, before = len(p.ids), float(sum(p.logp0))
            p.ids += [int(t) for t in out.ids]
            p.logq += [float(x) for x in out.logq]
            p.logp0 += [float(x) for x in out.logp0]
            p.entropy += [float(x) for x in out.entropy]
            p.eos = out.finished
            p.finished = out.finished or len(p.ids) >= cfg.max_new_tokens
            p.log_w += log_weight_increment(before, float(np.sum(out.logq)), float(np.sum(out.logp0)), t0,
                                            len(p.ids), self._alpha_t, p.finished, cfg.alpha)
        return wall, sum(len(out.ids) for out in outs)

    def _maybe_resample(self, particles: list[Particle], key: int, block: int) -> tuple[list[Particle], float, bool]:
        cfg = self.config
        log_w = np.array([p.log_w for p in particles])
        ess = effective_sample_size(log_w)
        if ess >= cfg.ess_threshold * cfg.particles or all(p.finished for p in particles):
            return particles, ess, False
        rng = keyed_generator(cfg.seed, key, block, RESAMPLE_PURPOSE)
        u = rng.random(1 if cfg.resampling == "systematic" else cfg.particles)
        idx = resample_indices(log_w, u, cfg.resampling == "systematic")
        mean_w = float(logsumexp(log_w) - math.log(cfg.particles))
        new = [particles[int(i)].copy() for i in idx]
        for p in new:
            p.log_w = mean_w
        return new, ess, True

    def choose(self, particles: list[Particle], key: int) -> int:
        """The answer's particle by `PowerSMCConfig.final`: drawn ∝ final weight (keyed uniform), the largest
        weight, or the largest Σ log p0 (ties: the lowest index)."""
        log_w = np.array([p.log_w for p in particles])
        if self.config.final == "max":
            return int(np.argmax(log_w))
        if self.config.final == "max-logp0":
            return int(np.argmax([math.fsum(p.logp0) for p in particles]))
        u = float(keyed_generator(self.config.seed, key, FINAL_PURPOSE).random())
        cdf = np.cumsum(np.exp(log_w - logsumexp(log_w)))
        return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), len(particles) - 1))

    def run(self, prompt_ids: Sequence[int], prompt_id: str = "") -> DecodeResult:
        cfg = self.config
        prompt = tuple(int(t) for t in prompt_ids)
        key = prompt_key(prompt)
        particles = [Particle() for _ in range(cfg.particles)]
        calls, ess_log, resamples, tokens = [], [], 0, 0
        block = 0
        while not all(p.finished for p in particles):
            block += 1
            wall, decoded = self._extend(prompt, particles, key, block)
            calls.append(wall)
            tokens += decoded
            particles, ess, did = self._maybe_resample(particles, key, block)
            ess_log.append(ess)
            resamples += did
        chosen = self.choose(particles, key)
        extra = {"resamples": resamples, "ess": ess_log, "chosen": chosen, "final": cfg.final,
                 "log_weights": [p.log_w for p in particles], "unique_final": len({tuple(p.ids) for p in particles})}
        return DecodeResult(method=self.name, prompt_id=prompt_id, response=particles[chosen].as_completion(),
                            call_times=calls, extra=extra, tokens_decoded=tokens)
