"""Decoding baselines of PreSTO App. E.8: greedy, low temperature τ = 1/α, best-of-N by model likelihood.

They stop at EOS (up to `max_new_tokens` tokens), as in E.8; the MH samplers generate a fixed n, EOS
ignored.  Each run is one batched model call (`completions.completion_program`), seeded per
(seed, prompt, sample) from the counter-based streams, so runs are reproducible.

    E.8                                                       code
    low temperature: one sample at τ = 1/α = 0.25             BaselineConfig(kind="low-temp", alpha=4)
    best-of-N: N samples at τ, keep the highest unnormalized  BaselineConfig(kind="best-of-n", samples=N,
      sequence log-probability under q_τ (not p0)               select="logq")
    -                                                         select="logp0": highest Σ log p0 instead

The selection rule (`BaselineConfig.select`, `SELECT_RULES`) and its bias.  With τ = 1/α, q_τ(v | y_<t) =
p0(v | y_<t)^α / Z_t, Z_t = Σ_v p0(v | y_<t)^α ≤ 1 (α ≥ 1), so

    Σ_t log q_τ(y_t) = α Σ_t log p0(y_t) + Σ_t (−log Z_t),        −log Z_t ≥ 0.

"logp0" ranks the N samples exactly as π_α ∝ p0^α does: it returns the most likely of them under the power
target (mode-seeking among N draws, not a sample of π_α).  "logq" (E.8, the default) adds the bonus Σ −log Z_t,
which grows with the entropy of p0 along the sample's own path (0 where p0 is one-hot; (α − 1) log V at a
uniform position over V tokens): relative to π_α it under-penalizes uncertain positions, i.e. it ranks by the
low-temperature distribution, whose per-prefix normalizers Z_t are exactly what separates it from the power
distribution (Karan & Du).  Both sums are unnormalized in length and favour short (early-EOS) samples.  The
default stays E.8's "logq" (so results compare with the paper); the run records which rule chose
(`DecodeResult.extra["select"]`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..runtime_ext.protocol import as_finite, as_integer, check_inverse_alpha, check_parallel_sequences
from .completions import CompletionModel, CompletionRequest, DecodeResult
from .random_streams import PAPER_SEED, SEED_RANGE, keyed_generator, prompt_key
from .selection_rules import SELECT_RULES

BASELINE_KINDS = ("greedy", "low-temp", "best-of-n")
SAMPLE_SEED_PURPOSE = 201
"""Stream purpose of a baseline sample's seed (distinct from the MH decision purposes)."""


@dataclass(frozen=True)
class BaselineConfig:
    """Settings of a decoding baseline."""

    kind: str = "low-temp"
    """"greedy", "low-temp" (one sample at τ = 1/α) or "best-of-n"."""
    max_new_tokens: int = 1024
    """Most tokens generated (EOS stops earlier).  E.8: 1024."""
    alpha: float = 4.0
    """α of the power target; the sampling temperature is τ = 1/α.  E.8: 4."""
    samples: int = 4
    """N of best-of-N.  E.8: N ∈ {4, 8, 16, 32}."""
    select: str = "logq"
    """best-of-N score (`SELECT_RULES`): "logq" (Σ log q_τ, E.8; biased away from π_α toward high-entropy paths)
    or "logp0" (Σ log p0: π_α's own ranking).  Both favour short samples."""
    seed: int = PAPER_SEED
    """Run seed.  Table 6: `PAPER_SEED` = 10086."""

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "samples", "seed"):  # a float count failed deep inside a run
            object.__setattr__(self, name, as_integer(name, getattr(self, name)))
        object.__setattr__(self, "alpha", as_finite("alpha", self.alpha))  # α = inf sampled at τ = 0
        if self.kind not in BASELINE_KINDS:
            raise ValueError(f"kind must be one of {BASELINE_KINDS}, got {self.kind!r}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.alpha > 0:
            raise ValueError(f"alpha must be > 0, got {self.alpha}")
        if self.kind != "greedy":  # greedy ignores τ
            check_inverse_alpha(self.alpha)
        check_parallel_sequences("samples N", self.samples)
        if self.select not in SELECT_RULES:
            raise ValueError(f"select must be one of {tuple(SELECT_RULES)}, got {self.select!r}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")

    @property
    def tau(self) -> float:
        return 1.0 / self.alpha


def sample_seed(seed: int, key: int, sample: int) -> int:
    """The sampling seed of sample `sample` of a prompt (counter-based: no generator state)."""
    return int(keyed_generator(seed, key, sample, SAMPLE_SEED_PURPOSE).integers(0, SEED_RANGE))


class DecodingBaseline:
    """Greedy, low-temperature or best-of-N decoding over a `CompletionModel`."""

    def __init__(self, model: CompletionModel, config: BaselineConfig,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.model = model
        self.config = config
        self.clock = clock

    @property
    def name(self) -> str:
        return self.config.kind

    def requests(self, prompt: Sequence[int]) -> list[CompletionRequest]:
        cfg = self.config
        ids = tuple(int(t) for t in prompt)
        if cfg.kind == "greedy":
            return [CompletionRequest(ids, cfg.max_new_tokens, 0.0, 0)]
        key = prompt_key(ids)
        n = cfg.samples if cfg.kind == "best-of-n" else 1
        return [CompletionRequest(ids, cfg.max_new_tokens, cfg.tau, sample_seed(cfg.seed, key, i)) for i in range(n)]

    def run(self, prompt_ids: Sequence[int], prompt_id: str = "") -> DecodeResult:
        reqs = self.requests(prompt_ids)
        start = self.clock()
        outs = self.model.complete(reqs)
        wall = self.clock() - start
        if len(outs) != len(reqs):
            raise RuntimeError(f"model returned {len(outs)} completions for {len(reqs)} requests")
        scores = [float(np.sum(o.logq if self.config.select == "logq" else o.logp0)) for o in outs]
        best = int(np.argmax(scores))  # ties: the lowest sample index
        extra = {"scores": scores, "chosen": best, "select": self.config.select} if self.config.kind == "best-of-n" else {}
        return DecodeResult(method=self.name, prompt_id=prompt_id, response=outs[best], call_times=[wall],
                            extra=extra, tokens_decoded=sum(len(o.ids) for o in outs))
