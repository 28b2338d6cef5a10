"""The settings of a power sampler and of its PreSTO variant: frozen, validated, each default written once.

    paper (Table 6)                     code                                        Table 6   CPU default
    sampler                             SamplerConfig.kind (SAMPLER_KINDS)
    n, B                                response_length, block_size                 1024      32 (`CPU_SAMPLER`)
    K                                   steps_per_block                             100       10
    α, τ = 1/α, β                       alpha, temperature, beta                    4, ¼, 4
    M, 𝒯 (MultiTryMH)                   mtm_candidates, mtm_temperatures            4, {¼, ½, 1}
    seed                                seed (`random_streams.PAPER_SEED`)          10086
    N_pf                                PrefetchConfig.budget                       20        20; MultiTryMH 3(2M − 1)
    traversal rule, ĥ(v+; ε)            PrefetchConfig.traversal, branch_prob

`SamplerConfig()` is the library's default (n = B = 64, K = 10); `CPU_SAMPLER` is what `forerun sample` and
`forerun bench presto` run without flags (the README's main job on 2 cores); `TABLE6_SAMPLER` is `--paper`.

N_pf without a value (`PrefetchConfig(budget=None)`, no `--npf`) is `default_budget`: Table 6's 20, except where
20 requests buy too few decision levels.  Under the request unit one MultiTryMH transition costs 2M − 1 = 7
requests, so N_pf < 2(2M − 1) = 14 prefetches nothing (1.00 transitions per call) and 14-20 buys one level below
the root (measured on `--model tiny`, 2 MATH500 prompts, n = 32, K = 10: 1.67 transitions per call at N_pf = 14
and 20, 2.50 at 21, 2.92 at 28); its default is 3(2M − 1) = 21, the root's level and two prefetched ones.
`prefetch_shortfall` says when a given budget cannot prefetch anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ..runtime_ext.protocol import as_finite, as_integer, check_inverse_alpha, check_proposal_temperature
from .acceptance import EPSILON
from .call_cost import BUDGET_UNITS, DEFAULT_MAX_NODES
from .random_streams import PAPER_SEED
from .traversal import TRAVERSALS, BranchProb

SAMPLER_KINDS: tuple[str, ...] = ("power-mh", "entropy-cut", "multitry-mh")

DEFAULT_BUDGET = 20
"""N_pf of Table 6: the default budget of PowerMH and EntropyCut (and of every sampler under the node unit)."""
DEFAULT_PREFETCH_LEVELS = 3
"""Decision levels the default request budget pays for at least: the root's and two prefetched ones (with only
one, a round realizes at most 2 transitions and fewer wherever an acceptance's cut blocks the next level)."""


@dataclass(frozen=True)
class SamplerConfig:
    """Power-sampling settings (Table 6a defaults noted; CPU defaults are smaller)."""

    kind: str = "power-mh"
    """Sampler: "power-mh" (Karan & Du), "entropy-cut" (Zhou et al.), "multitry-mh" (simplified EGPS)."""
    response_length: int = 64
    """n: response tokens (fixed; EOS ignored).  Table 6: 1024."""
    block_size: int = 64
    """B: block size (n must be a multiple).  Table 6: a single block, B = n."""
    steps_per_block: int = 10
    """K: realized MH transitions per block.  Table 6: 100."""
    alpha: float = 4.0
    """α: power exponent of π_α ∝ p0^α.  Table 6: 4.0."""
    temperature: float | None = None
    """τ: proposal temperature; None means 1/α (Table 6)."""
    beta: float = 4.0
    """β: EntropyCut cut-law exponent.  Table 6: 4.0."""
    mtm_candidates: int = 4
    """M: MultiTryMH candidates per transition.  Table 6: 4."""
    mtm_temperatures: tuple[float, ...] = (0.25, 0.5, 1.0)
    """𝒯: MultiTryMH candidate temperatures (each candidate draws one uniformly).  Table 6."""
    seed: int = PAPER_SEED
    """Run seed of the decision streams.  Table 6: `PAPER_SEED` = 10086."""
    epsilon: float = EPSILON
    """ε of the recorded certainty classes.  Table 6b: 0.01."""
    stop_at_eos: tuple[int, ...] = ()
    """End-of-sequence token ids of the references' horizon (Karan & Du; the EntropyCut reference): at the end
    of each block a chain whose state contains one of them is cut after the first and stops growing.  Empty
    (default): PreSTO Table 6's fixed horizon, n tokens with EOS ignored.  Proposals inside a block are still
    generated to the block's end (the references let them end early), but the MH ratio counts a state's tokens
    only through its first EOS, so the response cut there is a draw of π_α ∝ p0(response)^α, the references'
    target (`transitions` module docstring)."""

    def __post_init__(self) -> None:
        # Types first: a float block size or an infinite α used to pass here and fail deep inside a run.
        for name in ("response_length", "block_size", "steps_per_block", "mtm_candidates", "seed"):
            object.__setattr__(self, name, as_integer(name, getattr(self, name)))
        for name in ("alpha", "beta", "epsilon") + (("temperature",) if self.temperature is not None else ()):
            object.__setattr__(self, name, as_finite(name, getattr(self, name)))
        object.__setattr__(self, "mtm_temperatures",
                           tuple(as_finite("mtm_temperatures", t) for t in self.mtm_temperatures))
        object.__setattr__(self, "stop_at_eos", tuple(as_integer("stop_at_eos", t) for t in self.stop_at_eos))
        if self.kind not in SAMPLER_KINDS:
            raise ValueError(f"kind must be one of {SAMPLER_KINDS}, got {self.kind!r}")
        if self.response_length < 1:
            raise ValueError(f"response_length n must be >= 1, got {self.response_length}")
        if self.block_size < 1 or self.response_length % self.block_size:
            raise ValueError(f"block_size B must divide response_length n={self.response_length}, got {self.block_size}")
        if self.steps_per_block < 1:
            raise ValueError(f"steps_per_block K must be >= 1, got {self.steps_per_block}")
        if not self.alpha > 0:
            raise ValueError(f"alpha must be > 0, got {self.alpha}")
        if self.temperature is None:
            check_inverse_alpha(self.alpha)
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(f"temperature τ must be > 0, got {self.temperature}")
        if not self.beta > 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")
        if self.mtm_candidates < 1:
            raise ValueError(f"mtm_candidates M must be >= 1, got {self.mtm_candidates}")
        if not self.mtm_temperatures or any(not t > 0 for t in self.mtm_temperatures):
            raise ValueError(f"mtm_temperatures must be non-empty and > 0, got {self.mtm_temperatures}")
        check_proposal_temperature("τ (1/α)" if self.temperature is None else "temperature τ", self.tau)
        if self.kind == "multitry-mh":
            for t in self.mtm_temperatures:
                check_proposal_temperature("an mtm_temperatures entry", t)
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if any(t < 0 for t in self.stop_at_eos):
            raise ValueError(f"stop_at_eos token ids must be >= 0, got {self.stop_at_eos}")
        if not (0 < self.epsilon < 0.5):
            raise ValueError(f"epsilon must be in (0, 0.5), got {self.epsilon}")

    @property
    def tau(self) -> float:
        return 1.0 / self.alpha if self.temperature is None else self.temperature

    @property
    def num_blocks(self) -> int:
        return self.response_length // self.block_size


@dataclass(frozen=True)
class PrefetchConfig:
    """PreSTO settings."""

    budget: int | None = None
    """N_pf: what one prefetch round may cost, in `budget_unit`s (streaming: rows running at once).  None: the
    sampler's `default_budget` (Table 6: 20; MultiTryMH under the request unit 3(2M − 1)), set by the samplers
    (`resolved`)."""
    budget_unit: str = "request"
    """What N_pf counts (`call_cost`): "request" - distinct suffix requests the call generates (one per
    requested depth; MultiTryMH 2M − 1; requests the chain already generated are free), the default;
    "node" - scored nodes, the paper's count (BFS over nodes, the DP of Proposition 2)."""
    traversal: str = "bfs"
    """Tree traversal rule: "bfs" (default) or "predictive" (ĥ from branch_prob)."""
    branch_prob: BranchProb | None = None
    """ĥ(v+; ε) of a candidate node (`traversal.CandidateNode`: cut fraction c_j/T, depth, Features 3/4,
    ...), e.g. `CertaintyClassifier.branch_prob_of` (predictive rule only)."""
    tree_position: bool = False
    """Whether branch_prob reads the node's tree position (κ(v), accepts on the path): the node-unit DP then
    runs over (depth, κ, accepts) states, e.g. `CertaintyClassifier.uses_tree_position`."""
    max_nodes: int = DEFAULT_MAX_NODES
    """Request unit: at most this many nodes scored per round (CPU work; free for the engine)."""
    call_overhead: float | None = None
    """κ0, request unit, predictive rule: the fixed cost of a call in request-equivalents.  None: maximise
    the predicted transitions F̂ within the budget (Eq. 17); a number: maximise F̂ / (κ0 + requests)."""
    reuse_suffixes: bool = True
    """Serve a request the chain already generated in an earlier round from `suffix_cache` (same chain)."""
    streaming: bool = False
    """Streaming PreSTO (`streaming_presto`, issue 12): every request is a row started the moment its prefix is
    known, N_pf bounds the rows running at once, the tree is ranked best first by the probability that the walk
    reaches a node (ĥ: the classifier's with `traversal="predictive"`, else the chain's acceptance rate so far)."""
    row_cost: float = 0.0
    """λ, streaming only: what one more row adds to a decode step, relative to the step (b / a of the step time
    t(r) ≈ a + b·r with r rows; `forerun` measures it on the embedded engine).  A row of L tokens costs L·b and
    saves L·a of waiting for its node (reached with probability P) and for the acceptance subtree its tokens make
    feasible (about P·ĥ per level, D levels below), so a row starts only for a node with P·(1 + ĥ·D) ≥ λ
    (`stream_tree.walk_tree`).  0 (default): rows are free (a GPU batch): up to N_pf rows run."""

    early_reject: bool = True
    """Streaming only: reject a PowerMH proposal (τ = 1/α) while it is still decoding once the bound of its log MH
    ratio over the tokens so far decides the rejection (`acceptance.log_mh_ratio_bound`): the same decision the
    complete proposal gives, sooner and with fewer tokens.  False: every decision waits for its whole proposal,
    as the round-based and sequential samplers do."""

    def __post_init__(self) -> None:
        if self.budget is not None:  # a float N_pf (2.5), True or NaN used to pass or fail deep inside a round
            object.__setattr__(self, "budget", as_integer("budget N_pf", self.budget))
        object.__setattr__(self, "max_nodes", as_integer("max_nodes", self.max_nodes))
        if self.budget is not None and self.budget < 1:
            raise ValueError(f"budget N_pf must be >= 1, got {self.budget}")
        if self.budget_unit not in BUDGET_UNITS:
            raise ValueError(f"budget_unit must be one of {BUDGET_UNITS}, got {self.budget_unit!r}")
        if self.traversal not in TRAVERSALS:
            raise ValueError(f"traversal must be one of {TRAVERSALS}, got {self.traversal!r}")
        if self.traversal == "predictive" and self.branch_prob is None:
            raise ValueError("traversal='predictive' needs branch_prob (candidate node -> ĥ)")
        if not (0.0 <= self.row_cost < math.inf):
            raise ValueError(f"row_cost λ must be a finite number >= 0, got {self.row_cost!r}")
        if self.max_nodes < 1:
            raise ValueError(f"max_nodes must be >= 1, got {self.max_nodes}")
        if self.call_overhead is not None and not (0 < self.call_overhead < math.inf):
            raise ValueError(f"call_overhead κ0 must be a positive number, got {self.call_overhead!r}")
        if self.call_overhead is not None and (self.budget_unit != "request" or self.traversal != "predictive"):
            raise ValueError("call_overhead applies to the predictive rule under budget_unit='request' only")

    def resolved(self, config: SamplerConfig) -> "PrefetchConfig":
        """This config with N_pf set: the given budget, or `default_budget` of the sampler `config`."""
        return self if self.budget is not None else replace(self, budget=default_budget(config, self.budget_unit))


def predictive_rule(classifier: Any) -> dict[str, Any]:
    """The PrefetchConfig fields of the predictive traversal driven by a certainty classifier
    (`classifiers.certainty.CertaintyClassifier`): its ĥ, and whether ĥ reads the node's place in the tree."""
    return {"traversal": "predictive", "branch_prob": classifier.branch_prob_of,
            "tree_position": classifier.uses_tree_position}


def requests_per_transition(config: SamplerConfig) -> int:
    """Distinct suffix requests one MH transition generates: 1 (PowerMH, EntropyCut), or MultiTryMH's M candidates
    and M − 1 reference points (`transitions.MultiTryKernel.requests`)."""
    return 2 * config.mtm_candidates - 1 if config.kind == "multitry-mh" else 1


def default_budget(config: SamplerConfig, budget_unit: str = "request") -> int:
    """N_pf when none is given: Table 6's 20, or under the request unit enough for `DEFAULT_PREFETCH_LEVELS`
    levels of the sampler's transitions when that is more (MultiTryMH, M = 4: 21)."""
    if budget_unit != "request":
        return DEFAULT_BUDGET
    return max(DEFAULT_BUDGET, DEFAULT_PREFETCH_LEVELS * requests_per_transition(config))


def prefetch_shortfall(config: SamplerConfig, prefetch: PrefetchConfig) -> str | None:
    """Why the PreSTO variant of `config` prefetches nothing at this budget (every call realizes one transition,
    as the sequential sampler does), or None when it can prefetch.  Round-based, a round pays its root's
    transition first (always made), then whole levels: the next level fits only from N_pf = 2 × the requests of
    a transition (2 nodes under the node unit).  Streaming runs N_pf rows (the walk's own always) and starts a
    node's requests all together: a prefetched node's rows fit beside the walk's only from the same 2 × (the
    walk's rows start together at one length and finish together)."""
    if config.steps_per_block < 2:
        return None  # one transition per block: nothing to prefetch at any budget
    pf = prefetch.resolved(config)
    assert pf.budget is not None
    per = requests_per_transition(config) if pf.budget_unit == "request" or pf.streaming else 1
    need = 2 * per
    if pf.budget >= need:
        return None
    what = f"{per} requests" if per > 1 else ("1 request" if pf.budget_unit == "request" else "1 node")
    return (f"N_pf = {pf.budget} cannot prefetch anything for {config.kind}: one transition takes {what}, so every "
            f"{'window' if pf.streaming else 'call'} realizes one transition; N_pf >= {need} prefetches "
            f"(default without --npf: {default_budget(config, pf.budget_unit)})")


CPU_SAMPLER = SamplerConfig(response_length=32, block_size=32, steps_per_block=10)
"""CPU-sized defaults of `forerun sample` / `forerun bench presto` (3 MATH500 prompts in minutes on 2 cores)."""
CPU_STREAM_ROWS = 6
"""Streaming PreSTO's rows at once on the embedded engine (CPU) without --stream-rows: each more row there costs
a measurable share of a decode step, so more rows make more tokens the walk never uses.  Measured on 2 cores
(MATH500, 5 prompts, early rejection on, one run per row count; BENCHMARKS.md): 4 / 6 / 8 rows gave 3.22x /
4.01x / 4.30x at n = 64 with 18 / 23 / 31 % of the generated tokens wasted, 2.95x / 3.57x / 3.50x at n = 128 with
20 / 30 / 40 %: 6 keeps the waste at or under 30 %.  On a server (a GPU batch, rows nearly free) streaming
runs N_pf rows."""
TABLE6_SAMPLER = replace(SamplerConfig(), response_length=1024, block_size=1024, steps_per_block=100)
"""PreSTO Table 6 (a): n = 1024, a single block B = n, α = 4, K = 100, seed 10086 (N_pf: `DEFAULT_BUDGET`)."""
