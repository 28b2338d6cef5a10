"""The methods `forerun eval` compares, their settings, and one runner that gives every method the same
record shape.

    method                      what it is                                               model calls
    greedy                      argmax decoding, stops at EOS                            1
    low-temp                    one sample at τ = 1/α, stops at EOS (E.8)                1
    best-of-n                   N samples at τ in one batch, the highest Σ log q_τ (E.8)  1
    power-mh                    PowerMH (Karan & Du): blockwise MH toward p0^α, fixed n   1 per transition
    entropy-cut                 EntropyCut (Zhou et al.): cuts at entropy jumps          1 per transition
    multitry-mh                 MultiTryMH (simplified EGPS)                             1 per transition
    presto-<sampler>            its PreSTO variant, BFS traversal (the paper's default)  1 per prefetch round
    presto-<sampler>-predictive its PreSTO variant, predictive traversal (certainty      1 per prefetch round
                                classifier: --classifier FILE, else the shipped one)
    presto-<sampler>-streaming  streaming PreSTO: rows start the moment their prefix      1 per window
                                exists, best first by reach, at most N_pf at once, rows free (λ = 0)
                                (`programs.streaming_presto`)
    power-smc                   Power-SMC (Azizi et al. 2026): P particles, 1 batch/block 1 per block

EOS semantics follow App. E.8: the MH samplers generate exactly n tokens (EOS ignored); the baselines and
Power-SMC stop at EOS (at most n tokens).

Timing fields of a record: `wall_s` is the whole generation of the item (every model call, the block
extensions included; model loading and grading excluded); `call_time_s` is the App. D.2 cumulative
model-call time (MH samplers: the MH calls only, block extensions excluded, as in Table 7; the others: every
call).  `transitions` / `transitions_per_call` exist for the MH samplers only.  A streaming method's "calls" are
its windows (`programs.streaming_presto`), so its transitions per call read the same way.
"""

from __future__ import annotations

import math
import time
from typing import Any, Sequence

from ...classifiers.shipped import load_shipped
from ...programs.baselines import BaselineConfig, DecodingBaseline
from ...programs.completions import DecodeResult, ProgramCompletionModel
from ...programs.power_smc import PowerSMC, PowerSMCConfig
from ...programs.samplers import ChainResult
from ...programs.sampler_config import PrefetchConfig, SamplerConfig, predictive_rule
from ...programs.sampler_factory import make_sampler
from ...programs.proposals import proposal_model_for
from .settings import EvalSettings, Method


def prefetch_config(method: Method, budget: int, classifier: Any = None) -> PrefetchConfig:
    """The `PrefetchConfig` of a PreSTO method: N_pf, its traversal rule (predictive: ĥ from `classifier`, a
    `CertaintyClassifier`) and whether it streams.  Every other setting is PrefetchConfig's default."""
    rule = predictive_rule(classifier) if method.traversal == "predictive" else {}
    return PrefetchConfig(budget=budget, streaming=method.streaming, **rule)


def _mh_outcome(res: ChainResult) -> dict[str, Any]:
    tpc = res.transitions_per_call
    return {"response_ids": list(res.response_ids), "finished": None, "call_time_s": res.call_time,
            "num_calls": res.num_calls, "all_calls": len(res.calls), "transitions": res.transitions,
            "transitions_per_call": tpc, "time_per_call_s": res.time_per_call,
            "log_likelihood": res.log_likelihood, "confidence": res.confidence, "tokens_decoded": res.tokens_decoded,
            "extra": {"sampler": res.sampler, "accepts": int(sum(res.history)),
                      "history": [bool(h) for h in res.history]}}


def _decode_outcome(res: DecodeResult) -> dict[str, Any]:
    n = res.num_calls
    extra = {k: v for k, v in res.extra.items() if k != "log_weights"}
    return {"response_ids": list(res.response_ids), "finished": bool(res.response.finished),
            "call_time_s": res.call_time, "num_calls": n, "all_calls": n, "transitions": None,
            "transitions_per_call": None, "time_per_call_s": res.call_time / n if n else math.nan,
            "log_likelihood": res.log_likelihood, "confidence": res.confidence, "tokens_decoded": res.tokens_decoded,
            "extra": extra}


class MethodRunner:
    """Runs any method on one prompt over a runtime's frontend backend; thread-safe (one per run)."""

    def __init__(self, backend: Any, settings: EvalSettings,
                 classifier: Any = None, eos_token_ids: Sequence[int] = ()) -> None:
        self.backend = backend
        self.settings = settings
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        """The model's EOS ids: where MH chains stop unless `settings.fixed_horizon`."""
        self.classifier = classifier
        """The certainty classifier of the predictive traversal (`CertaintyClassifier`); None: the shipped one
        (`classifiers.shipped`, loaded when a predictive method first runs)."""

    def config(self, method: str, seed: int) -> SamplerConfig | PowerSMCConfig | BaselineConfig:
        """The validated settings `method` runs with for `seed`: a ValueError for settings it cannot run with
        (`forerun eval` builds every method's before any model loads, not once per failing item)."""
        s, parsed = self.settings, Method.parse(method)
        if parsed.is_mh:
            return SamplerConfig(kind=parsed.sampler, response_length=s.n, block_size=s.block or s.n,
                                 steps_per_block=s.K, alpha=s.alpha, beta=s.beta, seed=seed,
                                 stop_at_eos=() if s.fixed_horizon else self.eos_token_ids)
        if method == "power-smc":
            return PowerSMCConfig(alpha=s.alpha, particles=s.smc_particles, max_new_tokens=s.n,
                                  block_size=s.smc_block, ramp_tokens=s.smc_ramp, ess_threshold=s.smc_ess,
                                  final=s.smc_final, seed=seed)
        return BaselineConfig(kind=method, max_new_tokens=s.n, alpha=s.alpha, samples=s.best_of,
                              select=s.best_of_select, seed=seed)

    def _mh(self, method: Method, seed: int):
        s = self.settings
        cfg = self.config(method.name, seed)
        if method.traversal == "predictive" and self.classifier is None:  # the shipped one (classifiers.shipped)
            self.classifier = load_shipped().classifier
        prefetch = prefetch_config(method, s.npf_for(method.sampler, method.streaming), self.classifier)
        model = proposal_model_for(self.backend, method.sampler, cfg.mtm_temperatures)
        return make_sampler(model, cfg, presto=method.presto, prefetch=prefetch)

    def _decoder(self, method: str, seed: int):
        model = ProgramCompletionModel(self.backend)
        if method == "power-smc":
            return PowerSMC(model, self.config(method, seed))
        return DecodingBaseline(model, self.config(method, seed))

    def run(self, method: str, prompt_ids: Sequence[int], prompt_id: str, seed: int) -> dict[str, Any]:
        """Generate for one (method, prompt, seed): the record fields of the outcome, with `wall_s`."""
        parsed = Method.parse(method)
        mh = parsed.is_mh
        runner = self._mh(parsed, seed) if mh else self._decoder(method, seed)
        start = time.perf_counter()
        res = runner.run(prompt_ids, prompt_id=prompt_id)
        wall = time.perf_counter() - start
        out = _mh_outcome(res) if mh else _decode_outcome(res)
        out["wall_s"] = wall
        return out
