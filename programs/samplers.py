"""Blockwise power samplers (PowerMH, EntropyCut, MultiTryMH) and their PreSTO variants.

Both variants share the blockwise outer loop (Algorithms 1 and 2): for ℓ = 1..n/B, extend the response to
T = ℓB tokens with q_τ (one model call), then realize K MH transitions.  The sequential sampler makes one
model call per transition; the PreSTO variant makes one batched call per prefetch round (BFS or
predictive traversal, at most N_pf decisions, depth cap K − k), then follows the realized path
(`mh_transition`).  Every random input is drawn per decision from `DecisionStream` (seed, prompt, block,
transition), so with the same seed both variants produce the identical chain (Proposition 1).

    paper                               code
    n, B, K, α, τ = 1/α                 SamplerConfig.response_length, block_size, steps_per_block, alpha, temperature
    β (EntropyCut), M, 𝒯 (MultiTryMH)   SamplerConfig.beta, mtm_candidates, mtm_temperatures
    N_pf, traversal rule                PrefetchConfig.budget, traversal
    x^(k) (MH state)                    ChainState
    PrefetchAndScore                    PrestoSampler._round (collect, one model call, score every node)
    MHTransition                        prefetch_tree.mh_transition
    k_Δ                                 transitions realized by one call (CallRecord.transitions)

MultiTryMH costs one decision of the budget per transition but issues M + (M − 1) engine requests (the M
candidates and the M − 1 reference points, all at the same prefix x_{0:c}; see `acceptance`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Literal, Protocol, Sequence

import numpy as np

from .acceptance import (
    EPSILON,
    accept_decision,
    cut_from_law,
    entropy_cut_law,
    entropy_cut_log_ratio,
    epsilon_class,
    log_acceptance,
    log_mh_ratio,
    mtm_log_ratio,
    mtm_log_weight,
    mtm_select,
)
from .prefetch_tree import (
    PrefetchPlan,
    accept_child,
    accepts_on_path,
    bfs_collect,
    mh_transition,
    node_depth,
    parent_of,
    is_accept_child,
    plan_from_selection,
)
from .proposals import ProposalModel, Suffix, SuffixRequest
from .random_streams import DecisionStream, prompt_key, uniform_cut
from .records import CallRecord, NodeRecord

SamplerKind = Literal["power-mh", "entropy-cut", "multitry-mh"]
SAMPLER_KINDS: tuple[str, ...] = ("power-mh", "entropy-cut", "multitry-mh")
TRAVERSALS: tuple[str, ...] = ("bfs", "predictive")


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
    seed: int = 10086
    """Run seed of the decision streams.  Table 6: 10086."""
    epsilon: float = EPSILON
    """ε of the recorded certainty classes.  Table 6b: 0.01."""

    def __post_init__(self) -> None:
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
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(f"temperature τ must be > 0, got {self.temperature}")
        if not self.beta > 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")
        if self.mtm_candidates < 1:
            raise ValueError(f"mtm_candidates M must be >= 1, got {self.mtm_candidates}")
        if not self.mtm_temperatures or any(not t > 0 for t in self.mtm_temperatures):
            raise ValueError(f"mtm_temperatures must be non-empty and > 0, got {self.mtm_temperatures}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
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

    budget: int = 20
    """N_pf: decisions (proposal requests; MultiTryMH: transitions) per prefetch round.  Table 6: 20."""
    traversal: str = "bfs"
    """Tree traversal rule: "bfs" (default) or "predictive" (DP of Prop. 2, needs branch_prob)."""
    branch_prob: Callable[[float], float] | None = None
    """ĥ(v+) as a function of the cut fraction c_j/T (predictive rule only)."""

    def __post_init__(self) -> None:
        if self.budget < 1:
            raise ValueError(f"budget N_pf must be >= 1, got {self.budget}")
        if self.traversal not in TRAVERSALS:
            raise ValueError(f"traversal must be one of {TRAVERSALS}, got {self.traversal!r}")
        if self.traversal == "predictive" and self.branch_prob is None:
            raise ValueError("traversal='predictive' needs branch_prob (cut fraction -> ĥ)")


# -- states ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChainState:
    """An MH state: the response and its per-position log q_τ, log p0, entropy (and log q per τ' ∈ 𝒯)."""

    tokens: np.ndarray
    logq: np.ndarray
    logp0: np.ndarray
    entropy: np.ndarray
    logq_by_temp: np.ndarray | None = None

    @classmethod
    def empty(cls, n_temps: int | None = None) -> "ChainState":
        z = np.zeros(0)
        return cls(np.zeros(0, dtype=np.int64), z, z, z, None if n_temps is None else np.zeros((n_temps, 0)))

    @property
    def length(self) -> int:
        return len(self.tokens)

    def splice(self, cut: int, suffix: Suffix) -> "ChainState":
        """(x_{0:c}, y_{c:T}): keep [0, cut) of this state, then the generated suffix."""
        if cut < 0 or cut > self.length:
            raise ValueError(f"cut {cut} outside [0, {self.length}]")
        by_temp = None
        if self.logq_by_temp is not None:
            if suffix.logq_by_temp is None:
                raise ValueError("suffix lacks log q per temperature needed by this state")
            by_temp = np.concatenate([self.logq_by_temp[:, :cut], suffix.logq_by_temp], axis=1)
        return ChainState(
            tokens=np.concatenate([self.tokens[:cut], suffix.ids]),
            logq=np.concatenate([self.logq[:cut], suffix.logq]),
            logp0=np.concatenate([self.logp0[:cut], suffix.logp0]),
            entropy=np.concatenate([self.entropy[:cut], suffix.entropy]),
            logq_by_temp=by_temp,
        )


@dataclass(frozen=True)
class Decision:
    """A scored proposal: log A and the state the chain moves to if it accepts."""

    log_accept: float
    proposal: ChainState


# -- kernels -----------------------------------------------------------------------------------------
class TransitionKernel(Protocol):
    state_dependent_cut: bool

    def cut(self, state: ChainState, j: int, stream: DecisionStream) -> int: ...

    def requests(self, prefix_ids: tuple[int, ...], cut: int, horizon: int, j: int,
                 stream: DecisionStream) -> list[SuffixRequest]: ...

    def decide(self, state: ChainState, cut: int, suffixes: Sequence[Suffix], j: int,
               stream: DecisionStream) -> Decision: ...


@dataclass(frozen=True)
class PowerMHKernel:
    """Uniform cut over the response, suffix from q_τ, Eq. 6."""

    alpha: float
    tau: float
    state_dependent_cut: bool = False

    def cut(self, state: ChainState, j: int, stream: DecisionStream) -> int:
        return uniform_cut(stream.cut_uniform(j), state.length)

    def requests(self, prefix_ids, cut, horizon, j, stream):
        return [SuffixRequest(prefix_ids, horizon - cut, self.tau, stream.suffix_seed(j))]

    def log_ratio(self, state: ChainState, proposal: ChainState, cut: int) -> float:
        return log_mh_ratio(state.logq, state.logp0, proposal.logq, proposal.logp0, cut, self.alpha)

    def decide(self, state, cut, suffixes, j, stream):
        (suffix,) = suffixes
        proposal = state.splice(cut, suffix)
        return Decision(log_acceptance(self.log_ratio(state, proposal, cut)), proposal)


@dataclass(frozen=True)
class EntropyCutKernel(PowerMHKernel):
    """Cut by inverse CDF of ρ_x ∝ max(ΔH, 0)^β at the transition's uniform; Eq. 6 + cut-law correction."""

    beta: float = 4.0
    state_dependent_cut: bool = True

    def cut(self, state: ChainState, j: int, stream: DecisionStream) -> int:
        return cut_from_law(entropy_cut_law(state.entropy, self.beta), stream.cut_uniform(j))

    def log_ratio(self, state: ChainState, proposal: ChainState, cut: int) -> float:
        return entropy_cut_log_ratio(state.logq, state.logp0, state.entropy, proposal.logq, proposal.logp0,
                                     proposal.entropy, cut, self.alpha, self.beta)


@dataclass(frozen=True)
class MultiTryKernel:
    """Multiple-try Metropolis with the temperature-mixture proposal (see `acceptance`)."""

    alpha: float
    temperatures: tuple[float, ...]
    candidates: int = 4
    state_dependent_cut: bool = False

    def cut(self, state: ChainState, j: int, stream: DecisionStream) -> int:
        return uniform_cut(stream.cut_uniform(j), state.length)

    def requests(self, prefix_ids, cut, horizon, j, stream):
        n = len(self.temperatures)
        out = [SuffixRequest(prefix_ids, horizon - cut, self.temperatures[stream.slot_choice(j, i, n)],
                             stream.suffix_seed(j, i)) for i in range(self.candidates)]
        out += [SuffixRequest(prefix_ids, horizon - cut,
                              self.temperatures[stream.slot_choice(j, i, n, reference=True)],
                              stream.reference_seed(j, i)) for i in range(self.candidates - 1)]
        return out

    def decide(self, state, cut, suffixes, j, stream):
        m = self.candidates
        if len(suffixes) != 2 * m - 1:
            raise ValueError(f"MultiTryMH expects {2 * m - 1} suffixes, got {len(suffixes)}")
        if state.logq_by_temp is None:
            raise ValueError("MultiTryMH states need log q per temperature")
        cands = [state.splice(cut, s) for s in suffixes[:m]]
        refs = [state.splice(cut, s) for s in suffixes[m:]]
        lw = [mtm_log_weight(y.logp0, y.logq_by_temp, cut, self.alpha) for y in cands]
        chosen = mtm_select(lw, stream.select_uniform(j))
        ref_lw = [mtm_log_weight(r.logp0, r.logq_by_temp, cut, self.alpha) for r in refs]
        ref_lw.append(mtm_log_weight(state.logp0, state.logq_by_temp, cut, self.alpha))
        return Decision(log_acceptance(mtm_log_ratio(lw, ref_lw)), cands[chosen])


def make_kernel(cfg: SamplerConfig) -> TransitionKernel:
    if cfg.kind == "power-mh":
        return PowerMHKernel(alpha=cfg.alpha, tau=cfg.tau)
    if cfg.kind == "entropy-cut":
        return EntropyCutKernel(alpha=cfg.alpha, tau=cfg.tau, beta=cfg.beta)
    return MultiTryKernel(alpha=cfg.alpha, temperatures=cfg.mtm_temperatures, candidates=cfg.mtm_candidates)


# -- results -----------------------------------------------------------------------------------------
@dataclass
class ChainResult:
    """A finished chain: final response, accept/reject history, per-call records."""

    sampler: str
    prompt_id: str
    prompt_ids: tuple[int, ...]
    state: ChainState
    history: list[bool] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)

    @property
    def response_ids(self) -> tuple[int, ...]:
        return tuple(int(t) for t in self.state.tokens)

    @property
    def mh_calls(self) -> list[CallRecord]:
        return [c for c in self.calls if c.kind == "mh"]

    @property
    def transitions(self) -> int:
        return len(self.history)

    @property
    def call_time(self) -> float:
        """Cumulative model-call time of the MH calls (App. D.2; block extensions excluded, shared by both)."""
        return float(sum(c.wall_time for c in self.mh_calls))

    @property
    def num_calls(self) -> int:
        return len(self.mh_calls)

    @property
    def transitions_per_call(self) -> float:
        return self.transitions / self.num_calls if self.num_calls else math.nan

    @property
    def time_per_call(self) -> float:
        return self.call_time / self.num_calls if self.num_calls else math.nan

    @property
    def log_likelihood(self) -> float:
        """Eq. 21: (1/n) log p0(x_{1:n} | x_0)."""
        return float(np.mean(self.state.logp0)) if self.state.length else math.nan

    @property
    def confidence(self) -> float:
        """Eq. 22: mean negative entropy of p0 along the response."""
        return float(-np.mean(self.state.entropy)) if self.state.length else math.nan

    def summary(self) -> dict:
        return {
            "sampler": self.sampler,
            "prompt_id": self.prompt_id,
            "response_ids": list(self.response_ids),
            "transitions": self.transitions,
            "accepts": int(sum(self.history)),
            "calls": self.num_calls,
            "call_time_s": self.call_time,
            "transitions_per_call": self.transitions_per_call,
            "time_per_call_s": self.time_per_call,
            "log_likelihood": self.log_likelihood,
            "confidence": self.confidence,
        }


# -- samplers ----------------------------------------------------------------------------------------
class BlockwiseSampler:
    """The blockwise outer loop shared by both variants (extend the block, then K transitions)."""

    variant = "sequential"

    def __init__(self, model: ProposalModel, config: SamplerConfig,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.model = model
        self.config = config
        self.kernel = make_kernel(config)
        self.clock = clock
        self._progress: Callable[[int], None] | None = None

    @property
    def name(self) -> str:
        return self.config.kind

    def _call(self, requests: Sequence[SuffixRequest]) -> tuple[list[Suffix], float, int]:
        """One timed model call; returns the suffixes in request order, the wall time and the number of
        engine requests.  Identical requests (same prefix, seed, length, τ: nodes of one depth share their
        transition's inputs) are generated once - their suffixes are identical by the engine contract."""
        unique = list(dict.fromkeys(requests))
        start = self.clock()
        out = self.model.generate(unique)
        wall = self.clock() - start
        if len(out) != len(unique):
            raise RuntimeError(f"model returned {len(out)} suffixes for {len(unique)} requests")
        by_request = dict(zip(unique, out))
        return [by_request[r] for r in requests], wall, len(unique)

    def _extend(self, result: ChainResult, stream: DecisionStream, block: int) -> None:
        cfg = self.config
        req = SuffixRequest(result.prompt_ids + result.response_ids, cfg.block_size, cfg.tau, stream.extend_seed())
        (suffix,), wall, _ = self._call([req])
        result.state = result.state.splice(result.state.length, suffix)
        result.calls.append(CallRecord(prompt_id=result.prompt_id, sampler=self.name, call_index=len(result.calls),
                                       kind="extend", block=block, wall_time=wall, requests=1, decisions=0,
                                       transitions=0))

    def _node_record(self, result: ChainResult, block: int, call_index: int, node: int, parent_cut: int,
                     cut: int, j: int, log_a: float, realized: bool, accepted: bool | None) -> NodeRecord:
        a = math.exp(log_a)
        return NodeRecord(prompt_id=result.prompt_id, sampler=self.name, block=block, call_index=call_index,
                          node_id=node, depth=node_depth(parent_of(node)), transition=j, cut=cut,
                          parent_cut=parent_cut, cut_fraction=cut / result.state.length,
                          accepts_on_path=accepts_on_path(parent_of(node)), accept_prob=a, log_accept=log_a,
                          certainty_class=epsilon_class(a, self.config.epsilon), realized=realized,
                          accepted=accepted)

    def run(self, prompt_ids: Sequence[int], prompt_id: str = "", *,
            progress: Callable[[int], None] | None = None) -> ChainResult:
        """Run the chain; `progress(k)` (optional) is called after every k realized MH transitions."""
        self._progress = progress
        prompt = tuple(int(t) for t in prompt_ids)
        key = prompt_key(prompt)
        n_temps = len(self.config.mtm_temperatures) if self.config.kind == "multitry-mh" else None
        result = ChainResult(sampler=self.name, prompt_id=prompt_id or str(key), prompt_ids=prompt,
                             state=ChainState.empty(n_temps))
        for block in range(1, self.config.num_blocks + 1):
            stream = DecisionStream(self.config.seed, key, block)
            self._extend(result, stream, block)
            self._run_block(result, stream, block)
        return result

    def _run_block(self, result: ChainResult, stream: DecisionStream, block: int) -> None:
        raise NotImplementedError

    def _advanced(self, transitions: int) -> None:
        if self._progress is not None:
            self._progress(transitions)


class SequentialSampler(BlockwiseSampler):
    """PowerMH / EntropyCut / MultiTryMH: one model call per MH transition (Algorithm 1)."""

    def _run_block(self, result, stream, block):
        horizon = result.state.length
        for j in range(self.config.steps_per_block):
            state = result.state
            cut = self.kernel.cut(state, j, stream)
            reqs = self.kernel.requests(result.prompt_ids + tuple(int(t) for t in state.tokens[:cut]), cut, horizon,
                                        j, stream)
            suffixes, wall, n_requests = self._call(reqs)
            decision = self.kernel.decide(state, cut, suffixes, j, stream)
            accepted = accept_decision(stream.accept_log_uniform(j), decision.log_accept)
            call_index = len(result.calls)
            node = self._node_record(result, block, call_index, accept_child(0), horizon, cut, j,
                                     decision.log_accept, True, accepted)
            result.calls.append(CallRecord(prompt_id=result.prompt_id, sampler=self.name, call_index=call_index,
                                           kind="mh", block=block, wall_time=wall, requests=n_requests, decisions=1,
                                           transitions=1, nodes=(node,)))
            result.history.append(accepted)
            if accepted:
                result.state = decision.proposal
            self._advanced(1)


class PrestoSampler(BlockwiseSampler):
    """PreSTO variant: one batched call per prefetch round, then the walk (Algorithm 2)."""

    variant = "presto"

    def __init__(self, model: ProposalModel, config: SamplerConfig, prefetch: PrefetchConfig = PrefetchConfig(),
                 clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__(model, config, clock)
        self.prefetch = prefetch

    @property
    def name(self) -> str:
        return f"presto-{self.config.kind}"

    def plan(self, root: ChainState, k: int, cap: int, stream: DecisionStream) -> PrefetchPlan:
        """Collect the round's requests (BFS or predictive) with per-depth cuts of transitions k + d."""
        horizon = root.length
        depth_n = min(cap, self.prefetch.budget)
        cuts = [self.kernel.cut(root, k + d, stream) for d in range(depth_n)]
        dependent = self.kernel.state_dependent_cut
        if self.prefetch.traversal == "bfs":
            return bfs_collect(cuts, horizon, self.prefetch.budget, cap, state_dependent_cut=dependent)
        from .allocation import optimal_allocation, optimal_allocation_by_state  # Prop. 2, another module

        hhat = [float(self.prefetch.branch_prob(c / horizon)) for c in cuts]  # type: ignore[misc]
        if not dependent:
            alloc = optimal_allocation(cuts, horizon, hhat, self.prefetch.budget)
            return plan_from_selection(sorted(alloc.selected), cuts, horizon)
        # A state-dependent cut law is computable only at nodes holding the root's state (no acceptance on
        # the path): Condition 1 always holds there (κ = T), so pass cuts of T plus that extra condition.
        feas_cuts = [horizon] * depth_n
        alloc = optimal_allocation_by_state(feas_cuts, horizon, lambda st: hhat[st.depth], self.prefetch.budget,
                                            expandable=lambda st: st.accepts_on_path == 0)
        plan = plan_from_selection(sorted(alloc.selected), feas_cuts, horizon)
        reqs = tuple(type(r)(node=r.node, parent=r.parent, depth=r.depth, cut=cuts[r.depth], parent_cut=r.parent_cut)
                     for r in plan.requests)
        return PrefetchPlan(requests=reqs, deferred=plan.deferred, known_cut=plan.known_cut)

    def _run_block(self, result, stream, block):
        K = self.config.steps_per_block
        k = 0
        while k < K:
            steps = self._round(result, stream, block, k, K - k)
            k += steps
            self._advanced(steps)

    def _round(self, result: ChainResult, stream: DecisionStream, block: int, k: int, cap: int) -> int:
        root = result.state
        horizon = root.length
        plan = self.plan(root, k, cap, stream)
        if not plan.requests:
            raise RuntimeError("prefetch round collected no request (the root's request is always feasible)")
        all_reqs: list[SuffixRequest] = []
        spans = []
        for r in plan.requests:
            if r.cut > r.parent_cut or (self.kernel.state_dependent_cut and accepts_on_path(r.parent) > 0):
                raise RuntimeError(f"request at node {r.node} is not feasible this round (Condition 1)")
            prefix = result.prompt_ids + tuple(int(t) for t in root.tokens[: r.cut])
            reqs = self.kernel.requests(prefix, r.cut, horizon, k + r.depth, stream)
            spans.append((len(all_reqs), len(all_reqs) + len(reqs)))
            all_reqs.extend(reqs)
        suffixes, wall, n_requests = self._call(all_reqs)

        # Score every prefetched node: states follow the tree (v− keeps v's state, v+ is v's proposal).
        states: dict[int, ChainState] = {0: root}

        def state_of(node: int) -> ChainState:
            if node not in states:
                par = parent_of(node)
                if is_accept_child(node):
                    raise KeyError(f"acceptance child {node} was not generated")
                states[node] = state_of(par)
            return states[node]

        decisions: dict[int, Decision] = {}
        for r, (a, b) in zip(plan.requests, spans):  # BFS / depth order: a parent's state exists first
            d = self.kernel.decide(state_of(r.parent), r.cut, suffixes[a:b], k + r.depth, stream)
            decisions[r.node] = d
            states[r.node] = d.proposal

        def decide(node: int) -> bool | None:
            child = accept_child(node)
            if child not in decisions:
                return None
            return accept_decision(stream.accept_log_uniform(k + node_depth(node)), decisions[child].log_accept)

        final, steps = mh_transition(decide, cap)
        if not steps:
            raise RuntimeError("the walk realized no transition (the root's proposal must be scored)")
        taken = {s.node: s.accepted for s in steps}
        call_index = len(result.calls)
        nodes = tuple(
            self._node_record(result, block, call_index, r.node, r.parent_cut, r.cut, k + r.depth,
                              decisions[r.node].log_accept, r.parent in taken, taken.get(r.parent))
            for r in plan.requests
        )
        result.calls.append(CallRecord(prompt_id=result.prompt_id, sampler=self.name, call_index=call_index,
                                       kind="mh", block=block, wall_time=wall, requests=n_requests,
                                       decisions=len(plan.requests), transitions=len(steps), nodes=nodes))
        result.history.extend(s.accepted for s in steps)
        result.state = state_of(final)
        return len(steps)


def make_sampler(model: ProposalModel, config: SamplerConfig, *, presto: bool = False,
                 prefetch: PrefetchConfig = PrefetchConfig()) -> BlockwiseSampler:
    """The sequential sampler of `config.kind`, or its PreSTO variant."""
    return PrestoSampler(model, config, prefetch) if presto else SequentialSampler(model, config)
