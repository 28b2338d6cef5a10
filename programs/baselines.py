"""Decoding baselines of PreSTO App. E.8: greedy, low temperature τ = 1/α, best-of-N by model likelihood.

They stop at EOS (up to `max_new_tokens` tokens), as in E.8; the MH samplers generate a fixed n, EOS
ignored.  Each run is one batched model call (`completions.completion_program`), seeded per
(seed, prompt, sample) from the counter-based streams, so runs are reproducible.

    E.8                                                       code
    low temperature: one sample at τ = 1/α = 0.25             BaselineConfig(kind="low-temp", alpha=4)
    best-of-N: N samples at τ, keep the highest unnormalized  BaselineConfig(kind="best-of-n", samples=N,
      sequence log-probability under q_τ (not p0)               select="logq")
    -                                                         select="logp0": highest Σ log p0 instead

Why offer `select="logp0"`: π_α ∝ p0^α ranks sequences by p0, so best-of-N by Σ log p0 is the crude
"argmax of the power target among N draws"; E.8's Σ log q_τ also rewards sequences on which q_τ is
peaked (low-entropy paths).  Both sums are unnormalized and favour short (early-EOS) samples; E.8 uses
q_τ, so that is the default.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .completions import CompletionModel, CompletionRequest, DecodeResult
from .random_streams import PAPER_SEED, SEED_RANGE, keyed_generator, prompt_key

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
    """best-of-N score: "logq" (Σ log q_τ, E.8) or "logp0" (Σ log p0)."""
    seed: int = PAPER_SEED
    """Run seed.  Table 6: `PAPER_SEED` = 10086."""

    def __post_init__(self) -> None:
        if self.kind not in BASELINE_KINDS:
            raise ValueError(f"kind must be one of {BASELINE_KINDS}, got {self.kind!r}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.alpha > 0:
            raise ValueError(f"alpha must be > 0, got {self.alpha}")
        if self.samples < 1:
            raise ValueError(f"samples N must be >= 1, got {self.samples}")
        if self.select not in ("logq", "logp0"):
            raise ValueError(f"select must be 'logq' or 'logp0', got {self.select!r}")
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
        extra = {"scores": scores, "chosen": best} if self.config.kind == "best-of-n" else {}
        return DecodeResult(method=self.name, prompt_id=prompt_id, response=outs[best], call_times=[wall],
                            extra=extra, tokens_decoded=sum(len(o.ids) for o in outs))
