"""The names and settings of the methods `forerun eval` compares (no model imports: the CLI reads the
defaults when it builds its parser).  What each method is: `harness.methods`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

from ...programs.random_streams import PAPER_SEED
from ...programs.sampler_config import CPU_STREAM_ROWS, SAMPLER_KINDS, PrefetchConfig, SamplerConfig, prefetch_shortfall
from ...programs.selection_rules import FINAL_RULES, SELECT_RULES, rule_line
from ..datasets.loading import GPQA_SHUFFLE_SEED

_SAMPLER = SamplerConfig()
"""Where the samplers' own defaults (α, β, M, 𝒯, seed) are read from: written once, in `SamplerConfig`."""

BASELINES = ("greedy", "low-temp", "best-of-n")
MH_METHODS = SAMPLER_KINDS
PRESTO_METHODS = tuple(f"presto-{k}" for k in SAMPLER_KINDS)
PREDICTIVE_METHODS = tuple(f"presto-{k}-predictive" for k in SAMPLER_KINDS)
STREAMING_METHODS = tuple(f"presto-{k}-streaming" for k in SAMPLER_KINDS)
METHODS = BASELINES + MH_METHODS + PRESTO_METHODS + PREDICTIVE_METHODS + STREAMING_METHODS + ("power-smc",)
PRESTO_VARIANTS = {"": ("bfs", False), "-predictive": ("predictive", False), "-streaming": ("bfs", True)}
"""Method-name suffix of a PreSTO variant -> (traversal rule, streaming)."""
DEFAULT_METHODS = ("greedy", "low-temp", "best-of-n", "power-mh", "presto-power-mh", "power-smc")
CPU_NPF = 8
"""N_pf of the PreSTO methods without --npf, where it can prefetch (Case Study 2's low end)."""


@dataclass(frozen=True)
class Method:
    """A method name of `forerun eval`, parsed once: what it is and what it is compared against.

        name                        family      sampler         presto  traversal   streaming
        greedy / low-temp / best-of-n  baseline  -              no      -           -
        power-smc                   power-smc   -               no      -           -
        <kind>                      mh          <kind>          no      -           -
        presto-<kind>               mh          <kind>          yes     bfs         no (round-based)
        presto-<kind>-predictive    mh          <kind>          yes     predictive  no (round-based)
        presto-<kind>-streaming     mh          <kind>          yes     bfs         yes (issue 12)
    """

    name: str
    family: str
    """"baseline", "power-smc" or "mh"."""
    sampler: str | None = None
    """The MH sampler kind (`SAMPLER_KINDS`) of an MH method."""
    presto: bool = False
    traversal: str | None = None
    """The PreSTO traversal rule: "bfs" or "predictive"."""
    streaming: bool = False
    """Streaming PreSTO (`programs.streaming_presto`: rows started the moment their prefix exists) instead of
    round-based prefetch calls."""

    @classmethod
    def parse(cls, name: str) -> "Method":
        if name in BASELINES:
            return cls(name, "baseline")
        if name == "power-smc":
            return cls(name, "power-smc")
        if name in MH_METHODS:
            return cls(name, "mh", sampler=name)
        for kind in SAMPLER_KINDS:
            for suffix, (traversal, streaming) in PRESTO_VARIANTS.items():
                if name == f"presto-{kind}{suffix}":
                    return cls(name, "mh", sampler=kind, presto=True, traversal=traversal, streaming=streaming)
        raise ValueError(f"unknown method {name!r}; known: {', '.join(METHODS)}")

    @property
    def is_mh(self) -> bool:
        return self.family == "mh"

    @property
    def sequential(self) -> str | None:
        """The sequential method a PreSTO method is compared against (its Table 7 row); None otherwise."""
        return self.sampler if self.presto else None


PAPER_BUDGETS = {"aime": 20480, "aime2024": 20480, "aime2025": 20480, "lcb-v5": 8092, "lcb-v6": 8092}
"""PreSTO's evaluation token budgets where they differ from `PAPER_DEFAULT_BUDGET` (its harness)."""
PAPER_DEFAULT_BUDGET = 3072
CPU_BUDGET_SCALE = 96
"""The default model on 2 cores runs each dataset at the paper's budget ÷ 96 (MATH500: 32 tokens, AIME: 214,
LiveCodeBench: 85): small enough for minutes per item; answers that need more are cut (`--n` raises it)."""


def default_budget(dataset: str) -> int:
    """The CPU default of MH response length n / the most new tokens, for `dataset`."""
    return math.ceil(PAPER_BUDGETS.get(dataset, PAPER_DEFAULT_BUDGET) / CPU_BUDGET_SCALE)


@dataclass(frozen=True)
class EvalSettings:
    """CPU-sized defaults of `forerun eval` (every one is a flag); the papers' values in brackets.

    Sized so that `--datasets all --limit 3` with five methods finishes in well under an hour on 2 shared
    cores with SmolLM2-135M: responses of n = 32 tokens are too short for most final answers, so accuracies
    at these settings measure the harness, not the samplers."""

    n: int | None = None
    """MH response length n, and the most tokens of the baselines / Power-SMC, for every dataset; None
    (default): per dataset, `default_budget` [3072; AIME 20480; LiveCodeBench 8092]."""
    budgets: tuple[tuple[str, int], ...] = ()
    """Per-dataset n that override `n` (`--n math500=64,aime=512`)."""
    system: str | None = None
    """A system turn before each prompt (`--system`)."""
    chat_template: bool = True
    """Render prompts with the model's chat template (`--no-chat-template`: the plain text)."""
    thinking: bool | None = None
    """The chat template's thinking switch where it has one (`--thinking on|off`; None: the template's default)."""
    block: int | None = None
    """MH block size B (None: n, a single block) [n]."""
    K: int = 8
    """MH transitions per block [100]."""
    npf: int | None = None
    """PreSTO prefetch budget N_pf [20; Case Study 2: 8-20]; None: `npf_for` each sampler."""
    alpha: float = _SAMPLER.alpha
    """Power exponent α; τ = 1/α [4]."""
    beta: float = _SAMPLER.beta
    """EntropyCut β [4]."""
    best_of: int = 4
    """N of best-of-N [4-32]."""
    best_of_select: str = "logq"
    """best-of-N score (`SELECT_RULES`): logq (E.8) or logp0."""
    smc_particles: int = 8
    """Power-SMC particles P [64; E.8: 2-32]."""
    smc_block: int = 8
    """Power-SMC block B (tokens per batched call, ESS checked after each) [64; E.8: 128]."""
    smc_ramp: int = 8
    """Power-SMC exponent ramp T_r in tokens [400 of 1024-2048 tokens; scaled down with n here]."""
    smc_ess: float = 0.5
    """Power-SMC resampling threshold κ [0.5]."""
    smc_final: str = "sample"
    """Power-SMC's answer (`FINAL_RULES`): sample (∝ final weight, the reference's), max or max-logp0."""
    seed: int = PAPER_SEED
    """Run seed [10086]."""
    gpqa_shuffle_seed: int = GPQA_SHUFFLE_SEED
    """Seed of GPQA's per-question answer-choice shuffle (`--gpqa-shuffle-seed`): decides the option order, and so
    the gold letter, the model is shown [10086]."""
    fixed_horizon: bool = False
    """MH samplers: exactly n tokens with EOS ignored (PreSTO Table 6's setting).  False (default): the
    references' rule, a chain whose state holds an EOS at the end of a block is cut after it and stops."""
    forced_answer: bool = False
    """After each response, one greedy forced-answer pass graded on its own (`harness.forced`; code: none)."""

    def __post_init__(self) -> None:
        for name, value, rules in (("best_of_select", self.best_of_select, SELECT_RULES),
                                   ("smc_final", self.smc_final, FINAL_RULES)):
            if value not in rules:
                raise ValueError(f"{name} must be one of {tuple(rules)}, got {value!r}")
        for name in ("K", "npf", "best_of", "smc_particles", "smc_block"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for ds, n in ((None, self.n), *self.budgets):
            if n is not None and n < 1:
                raise ValueError(f"n must be >= 1, got {n}" + (f" for {ds}" if ds else ""))
            if n is not None and self.block is not None and (self.block < 1 or n % self.block):
                raise ValueError(f"block B must divide n={n}" + (f" ({ds})" if ds else "") + f", got {self.block}")

    def n_for(self, dataset: str) -> int:
        """n of `dataset`: its --n override, else --n, else `default_budget`."""
        return dict(self.budgets).get(dataset) or self.n or default_budget(dataset)

    def for_dataset(self, dataset: str) -> "EvalSettings":
        """These settings with n resolved for `dataset` (what its items run with)."""
        n = self.n_for(dataset)
        if self.block is not None and n % self.block:
            raise ValueError(f"block B={self.block} does not divide n={n} of {dataset}")
        return replace(self, n=n, budgets=())

    def for_method(self, method: str) -> dict[str, Any]:
        """The settings that define `method`'s output (recorded on every line; n resolved: `for_dataset`)."""
        if self.n is None or self.budgets:
            raise ValueError("for_method needs settings resolved for one dataset (EvalSettings.for_dataset)")
        m = Method.parse(method)
        if m.name == "greedy":  # argmax: no temperature, so neither α nor τ = 1/α
            return {"max_new_tokens": self.n}
        if m.family == "baseline":
            out = {"max_new_tokens": self.n, "alpha": self.alpha, "tau": 1 / self.alpha}
            if m.name == "best-of-n":
                out.update(samples=self.best_of, select=self.best_of_select)
            return out
        if m.family == "power-smc":
            return {"max_new_tokens": self.n, "alpha": self.alpha, "particles": self.smc_particles,
                    "block": self.smc_block, "ramp_tokens": self.smc_ramp, "ess_threshold": self.smc_ess,
                    "resampling": "systematic", "final": self.smc_final}
        out = {"n": self.n, "block": self.block or self.n, "K": self.K, "alpha": self.alpha,
               "horizon": "fixed" if self.fixed_horizon else "eos"}
        if m.sampler == "entropy-cut":
            out["beta"] = self.beta
        if m.sampler == "multitry-mh":
            out["mtm_temperatures"] = list(_SAMPLER.mtm_temperatures)
            out["mtm_candidates"] = _SAMPLER.mtm_candidates
        if m.presto:
            out.update(npf=self.npf_for(m.sampler, m.streaming), traversal=m.traversal, streaming=m.streaming)
        return out

    def npf_for(self, sampler: str, streaming: bool = False) -> int:
        """N_pf of the PreSTO variant of `sampler`: --npf, else CPU_NPF (streaming: CPU_STREAM_ROWS rows at once,
        as `bench presto` runs streaming on the embedded engine), or the sampler's own default budget where that
        cannot prefetch anything (MultiTryMH: one transition is 2M - 1 = 7 requests, so 8 would realize one
        transition per call; its default is 21)."""
        if self.npf is not None:
            return self.npf
        cfg = replace(_SAMPLER, kind=sampler, steps_per_block=self.K)
        budget = CPU_STREAM_ROWS if streaming else CPU_NPF
        if prefetch_shortfall(cfg, PrefetchConfig(budget=budget, streaming=streaming)) is None:
            return budget
        return PrefetchConfig().resolved(cfg).budget  # the sampler's own default

    def selection_rules(self, methods: list[str]) -> dict[str, str]:
        """The answer rule, with its bias, of best-of-n and power-smc where `methods` run them (the run header)."""
        chosen = {"best-of-n": self.best_of_select, "power-smc": self.smc_final}
        return {m: rule_line(m, rule) for m, rule in chosen.items() if m in methods}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


SHARED_SETTINGS = ("n", "budgets", "system", "chat_template", "thinking", "gpqa_shuffle_seed", "forced_answer", "seed")
"""EvalSettings fields every method's items depend on: the token budget, what the model is shown (system turn, chat
template, thinking switch, GPQA's option order), the forced-answer pass, the run seed."""


def settings_used_by(method: str) -> tuple[str, ...]:
    """The EvalSettings fields that define `method`'s output: `SHARED_SETTINGS` and its own (`MethodRunner.config`,
    `npf_for`).  Greedy is argmax (no α); low-temp samples at τ = 1/α; best-of-N adds N and its score; Power-SMC its
    particles, block, ramp, κ and answer rule; the MH samplers B, K, α and the horizon rule, EntropyCut β, PreSTO
    N_pf.  A setting no method of a run uses cannot make its results differ, so --resume does not compare it."""
    m = Method.parse(method)
    if m.family == "baseline":
        own: tuple[str, ...] = {"greedy": (), "low-temp": ("alpha",),
                                "best-of-n": ("alpha", "best_of", "best_of_select")}[m.name]
    elif m.family == "power-smc":
        own = ("alpha", "smc_particles", "smc_block", "smc_ramp", "smc_ess", "smc_final")
    else:
        own = (("block", "K", "alpha", "fixed_horizon") + (("beta",) if m.sampler == "entropy-cut" else ())
               + (("npf",) if m.presto else ()))
    return SHARED_SETTINGS + own


def parse_methods(text: str | Sequence[str]) -> list[str]:
    """Method names, as a list or comma-separated ("all": every method but the predictive ones; "default"); an empty
    item is a ValueError."""
    out: list[str] = []
    for i, raw in enumerate(text.split(",") if isinstance(text, str) else text, 1):
        name = raw.strip().lower()
        if not name:  # a doubled or trailing comma: refused, as the CLI's comma lists are (never silently dropped)
            raise ValueError(f"--methods: item {i} of {text!r} is empty")
        if name == "all":
            out += [m for m in METHODS if m not in PREDICTIVE_METHODS]
        elif name == "default":
            out += list(DEFAULT_METHODS)
        elif name in METHODS:
            out.append(name)
        else:
            raise ValueError(f"unknown method {raw.strip()!r}; known: {', '.join(METHODS)} (or all, default)")
    if not out:
        raise ValueError("--methods is empty")
    return list(dict.fromkeys(out))
