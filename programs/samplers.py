"""Blockwise power samplers (PowerMH, EntropyCut, MultiTryMH) and their PreSTO variants.

Both variants share the blockwise outer loop (Algorithms 1 and 2): for ℓ = 1..n/B, extend the response to
T = ℓB tokens with q_τ (one model call), then realize K MH transitions.  The sequential sampler makes one
model call per transition; the PreSTO variant makes one batched call per prefetch round (BFS or
predictive traversal within the budget N_pf, depth cap K − k), then follows the realized path
(`mh_transition`).  Every random input is drawn per decision from `DecisionStream` (seed, prompt, block,
transition), so with the same seed both variants produce the identical chain (Proposition 1).

    paper                               code
    n, B, K, α, τ = 1/α                 sampler_config.SamplerConfig.response_length, block_size, steps_per_block, alpha, temperature
    β (EntropyCut), M, 𝒯 (MultiTryMH)   SamplerConfig.beta, mtm_candidates, mtm_temperatures
    N_pf, traversal rule, ĥ(v+; ε)      PrefetchConfig.budget (+ budget_unit), traversal, branch_prob
    x^(k) (MH state)                    transitions.ChainState
    PrefetchAndScore                    PrestoSampler._round (plan, one model call, `prefetch_round.score_round`)
    MHTransition                        prefetch_tree.mh_transition
    k_Δ                                 transitions realized by one call (CallRecord.transitions)

The budget counts distinct generated requests by default (`call_cost`): all nodes of a depth share their
transition's request, so extra nodes there are free; MultiTryMH pays 2M − 1 per depth (the M candidates and
the M − 1 reference points, all at the same prefix x_{0:c}; see `acceptance`); `budget_unit="node"` counts
scored nodes as the paper does.  A request the chain generated in an earlier round of the block is served
from `suffix_cache` and costs nothing; a round needing only such requests makes no model call
(CallRecord.kind "reuse").
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from .acceptance import accept_decision, epsilon_class
from .cut_statistics import RootCutFeatures, root_cut_features
from .transitions import ChainState, EntropyCutKernel, MultiTryKernel, PowerMHKernel, TransitionKernel
from .prefetch_round import round_requests, score_round
from .prefetch_tree import PrefetchPlan, accept_child, accepts_on_path, mh_transition, node_depth, parent_of
from .suffixes import ProposalModel, Suffix, SuffixRequest
from .random_streams import DecisionStream, prompt_key
from .records import CallRecord, NodeRecord
from .request_ledger import RequestLedger
from .suffix_cache import SuffixCache
from .sampler_config import PrefetchConfig, SamplerConfig
from .traversal import plan_prefetch

def make_kernel(cfg: SamplerConfig) -> TransitionKernel:
    if cfg.kind == "power-mh":
        return PowerMHKernel(alpha=cfg.alpha, tau=cfg.tau, eos=cfg.stop_at_eos)
    if cfg.kind == "entropy-cut":
        return EntropyCutKernel(alpha=cfg.alpha, tau=cfg.tau, beta=cfg.beta, eos=cfg.stop_at_eos)
    return MultiTryKernel(alpha=cfg.alpha, temperatures=cfg.mtm_temperatures, candidates=cfg.mtm_candidates,
                          eos=cfg.stop_at_eos)


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
    ended_at_eos: bool = False
    """The chain stopped at the end of a block whose state held an EOS (`SamplerConfig.stop_at_eos`)."""
    requests: RequestLedger = field(default_factory=RequestLedger)
    """The MH phase's generated and used requests (`request_ledger`: wasted tokens, repeated requests)."""

    @property
    def response_ids(self) -> tuple[int, ...]:
        return tuple(int(t) for t in self.state.tokens)

    @property
    def mh_calls(self) -> list[CallRecord]:
        """The proposal calls of the engine (block extensions and rounds served from the cache excluded)."""
        return [c for c in self.calls if c.kind == "mh"]

    @property
    def rounds(self) -> list[CallRecord]:
        """Every round that realized transitions: the model calls and the rounds served from the cache."""
        return [c for c in self.calls if c.kind in ("mh", "reuse")]

    def total(self, field_name: str) -> int:
        """Sum of a CallRecord count over the rounds, e.g. "generated_requests", "nodes_scored"."""
        return int(sum(getattr(c, field_name) for c in self.rounds))

    @property
    def transitions(self) -> int:
        return len(self.history)

    @property
    def tokens_decoded(self) -> int:
        """Every token the engine generated for this chain (block extensions and every proposal, rejected ones
        included; requests served from the suffix cache cost nothing): the compute-matched budget."""
        return int(sum(c.generated_tokens for c in self.calls))

    @property
    def wasted_token_fraction(self) -> float:
        """Tokens of the MH phase that no realized decision read ÷ tokens it generated (`request_ledger`)."""
        return self.requests.wasted_token_fraction

    @property
    def repeated_requests(self) -> int:
        """Generations of a request the chain had already generated (`request_ledger`)."""
        return self.requests.repeated_requests

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
            "rounds": len(self.rounds),
            "nodes_scored": self.total("nodes_scored"),
            "distinct_requests": self.total("distinct_requests"),
            "generated_requests": self.total("generated_requests"),
            "generated_tokens": self.total("generated_tokens"),
            "wasted_tokens": self.requests.wasted_tokens,
            "wasted_token_fraction": self.wasted_token_fraction,
            "repeated_requests": self.repeated_requests,
            "resumed_requests": self.requests.resumed_requests,
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
        self._last_steps = 0

    @property
    def name(self) -> str:
        return self.config.kind

    def _generate(self, requests: Sequence[SuffixRequest], cache: SuffixCache | None = None,
                  transitions: Sequence[int] = (), ledger: RequestLedger | None = None,
                  ) -> tuple[list[Suffix], float, tuple[int, int, int]]:
        """One timed model call for the distinct requests not in `cache`; returns the suffixes in request
        order, the wall time and (distinct, generated requests, generated tokens).  Identical requests (same
        prefix, seed, length, τ: nodes of one depth share their transition's inputs) are generated once -
        their suffixes are identical by the engine contract; no call is made when every one is cached.  The
        generated ones are entered in `ledger` (the chain's MH phase)."""
        unique = list(dict.fromkeys(requests))
        todo = [r for r in unique if cache is None or r not in cache]
        by_request = {r: cache.get(r) for r in unique if cache is not None and r in cache}
        wall = 0.0
        self._last_steps = max((r.max_tokens for r in todo), default=0)  # decode steps of the call (one per token)
        if todo:
            start = self.clock()
            out = self.model.generate(todo)
            wall = self.clock() - start
            if len(out) != len(todo):
                raise RuntimeError(f"model returned {len(out)} suffixes for {len(todo)} requests")
            by_request.update(zip(todo, out))
            for r, suffix in zip(todo, out):
                if ledger is not None:
                    ledger.generated(r, len(suffix.ids))
            if cache is not None:
                serves = dict(zip(requests, transitions))
                for r, suffix in zip(todo, out):
                    cache.put(r, suffix, serves[r])
        return [by_request[r] for r in requests], wall, (len(unique), len(todo), sum(r.max_tokens for r in todo))

    def _extend(self, result: ChainResult, stream: DecisionStream, block: int) -> None:
        cfg = self.config
        req = SuffixRequest(result.prompt_ids + result.response_ids, cfg.block_size, cfg.tau, stream.extend_seed())
        (suffix,), wall, _ = self._generate([req])
        result.state = result.state.splice(result.state.length, suffix)
        result.calls.append(CallRecord(prompt_id=result.prompt_id, sampler=self.name, call_index=len(result.calls),
                                       kind="extend", block=block, wall_time=wall, nodes_scored=0,
                                       distinct_requests=1, generated_requests=1, generated_tokens=cfg.block_size,
                                       transitions=0))

    def _node_record(self, result: ChainResult, block: int, call_index: int, node: int, parent_cut: int,
                     cut: int, j: int, log_a: float, realized: bool, accepted: bool | None,
                     root_features: dict[str, float]) -> NodeRecord:
        """The record of a scored node; `root_features` are the ROOT state's statistics at the cut (Features 3/4,
        `cut_statistics`)."""
        a = math.exp(log_a)
        prefetch = getattr(self, "prefetch", None)  # PreSTO samplers; the sequential one has none
        return NodeRecord(prompt_id=result.prompt_id, sampler=self.name,
                          traversal=prefetch.traversal if prefetch is not None else None, block=block,
                          call_index=call_index,
                          node_id=node, depth=node_depth(parent_of(node)), transition=j, cut=cut,
                          parent_cut=parent_cut, cut_fraction=cut / result.state.length,
                          accepts_on_path=accepts_on_path(parent_of(node)), accept_prob=a, log_accept=log_a,
                          certainty_class=epsilon_class(a, self.config.epsilon), realized=realized,
                          accepted=accepted, extra=root_features)

    def run(self, prompt_ids: Sequence[int], prompt_id: str = "", *,
            progress: Callable[[int], None] | None = None,
            on_call: Callable[[CallRecord], None] | None = None) -> ChainResult:
        """Run the chain; `progress(k)` (optional) is called after every k realized MH transitions, `on_call(c)`
        (optional) with each CallRecord once its call has finished, in order (a records file written from it
        keeps every finished call when the chain is interrupted or fails)."""
        prompt = tuple(int(t) for t in prompt_ids)
        key = prompt_key(prompt)
        n_temps = len(self.config.mtm_temperatures) if self.config.kind == "multitry-mh" else None
        result = ChainResult(sampler=self.name, prompt_id=prompt_id or str(key), prompt_ids=prompt,
                             state=ChainState.empty(n_temps))
        sent = 0

        def finished_calls() -> None:
            nonlocal sent
            while on_call is not None and sent < len(result.calls):
                sent += 1
                on_call(result.calls[sent - 1])

        def advanced(k: int) -> None:
            finished_calls()
            if progress is not None:
                progress(k)

        self._progress = advanced
        for block in range(1, self.config.num_blocks + 1):
            stream = DecisionStream(self.config.seed, key, block)
            self._extend(result, stream, block)
            self._run_block(result, stream, block)
            finished_calls()  # streaming PreSTO records its windows at the end of the block
            if self._ended_at_eos(result):
                break
        return result

    def _ended_at_eos(self, result: ChainResult) -> bool:
        """`SamplerConfig.stop_at_eos`: a state holding an EOS is cut after the first one and the chain ends."""
        eos = self.config.stop_at_eos
        if not eos:
            return False
        hits = np.flatnonzero(np.isin(result.state.tokens, np.asarray(eos)))
        if not len(hits):
            return False
        result.state = result.state.truncated(int(hits[0]) + 1)
        result.ended_at_eos = True
        return True

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
            suffixes, wall, (distinct, generated, tokens) = self._generate(reqs, ledger=result.requests)
            decision = self.kernel.decide(state, cut, suffixes, j, stream)
            result.requests.used(reqs)
            accepted = accept_decision(stream.accept_log_uniform(j), decision.log_accept)
            call_index = len(result.calls)
            node = self._node_record(result, block, call_index, accept_child(0), horizon, cut, j,
                                     decision.log_accept, True, accepted,
                                     root_cut_features(state, cut, self.config.alpha))
            result.calls.append(CallRecord(prompt_id=result.prompt_id, sampler=self.name, call_index=call_index,
                                           kind="mh", block=block, wall_time=wall, nodes_scored=1,
                                           distinct_requests=distinct, generated_requests=generated,
                                           generated_tokens=tokens, transitions=1, nodes=(node,),
                                           decode_steps=self._last_steps, row_steps=tokens))
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
        self.prefetch = prefetch.resolved(config)  # N_pf set: the given one, or the sampler's default

    @property
    def name(self) -> str:
        return f"presto-{self.config.kind}"

    def plan(self, root: ChainState, k: int, cap: int, stream: DecisionStream, prompt_ids: tuple[int, ...],
             cache: SuffixCache | None = None, features: RootCutFeatures | None = None) -> PrefetchPlan:
        """Collect the round's requests (BFS or predictive) with per-depth cuts of transitions k + d.  Under the
        request unit a depth costs the requests of its transition not yet in the chain's cache.  `features`: the
        round's statistics of the root by cut (shared with its node records; default computed here)."""
        pf = self.prefetch
        costs = None
        if pf.budget_unit != "request":
            cuts = self.kernel.cuts(root, range(k, k + min(cap, pf.budget)), stream)
        else:
            cuts, costs, spent = [], [], 0
            for d, c in enumerate(self._cuts_ahead(root, k, cap, stream)):  # the affordable leading depths only
                prefix = prompt_ids + tuple(int(t) for t in root.tokens[:c])
                cost = sum(1 for r in self.kernel.requests(prefix, c, root.length, k + d, stream)
                           if cache is None or r not in cache)
                if d and cost and spent + cost > pf.budget:
                    break
                cuts.append(c)
                costs.append(cost)
                spent += cost
        features = features if features is not None else RootCutFeatures(root, self.config.alpha)
        stats = [features.at(c) for c in cuts] if pf.traversal == "predictive" else []  # BFS reads no feature
        by_name = {name: [f[name] for f in stats] for name in stats[0]} if stats else {}
        return plan_prefetch(cuts, root.length, pf.budget, cap, traversal=pf.traversal, branch_prob=pf.branch_prob,
                             tree_position=pf.tree_position, budget_unit=pf.budget_unit, depth_costs=costs,
                             max_nodes=pf.max_nodes, call_overhead=pf.call_overhead, depth_features=by_name)

    def _cuts_ahead(self, root: ChainState, k: int, cap: int, stream: DecisionStream) -> Iterator[int]:
        """The cuts of transitions k, k + 1, ..., k + cap − 1, drawn as they are consumed, in chunks of doubling size
        (from N_pf + 2): a round reads only its affordable depths, and drawing all K − k of them made every round's
        planning cost grow with the steps left in the block."""
        d, size = 0, int(self.prefetch.budget) + 2
        while d < cap:
            chunk = self.kernel.cuts(root, range(k + d, k + min(cap, d + size)), stream)
            yield from chunk
            d, size = d + len(chunk), 2 * size

    def _run_block(self, result, stream, block):
        K = self.config.steps_per_block
        cache = SuffixCache() if self.prefetch.reuse_suffixes else None
        k = 0
        while k < K:
            if cache is not None:
                cache.prune(k)
            steps = self._round(result, stream, block, k, K - k, cache)
            k += steps
            self._advanced(steps)

    def _round(self, result: ChainResult, stream: DecisionStream, block: int, k: int, cap: int,
               cache: SuffixCache | None) -> int:
        root = result.state
        features = RootCutFeatures(root, self.config.alpha)  # once per cut this round (plan and records)
        plan = self.plan(root, k, cap, stream, result.prompt_ids, cache, features)
        if not plan.requests:
            raise RuntimeError("prefetch round collected no request (the root's request is always feasible)")
        by_depth = round_requests(self.kernel, result.prompt_ids, root, plan.requests, k, stream)
        flat = [r for d in sorted(by_depth) for r in by_depth[d]]
        serves = [k + d for d in sorted(by_depth) for _ in by_depth[d]]
        suffixes, wall, (distinct, generated, tokens) = self._generate(flat, cache, serves, ledger=result.requests)
        suffix_of = dict(zip(flat, suffixes))
        scored = score_round(self.kernel, root, plan.requests,
                             [[suffix_of[q] for q in by_depth[r.depth]] for r in plan.requests], k, stream)

        def decide(node: int) -> bool | None:
            child = accept_child(node)
            if child not in scored.decisions:
                return None
            return accept_decision(stream.accept_log_uniform(k + node_depth(node)), scored.decisions[child].log_accept)

        final, steps = mh_transition(decide, cap)
        if not steps:
            raise RuntimeError("the walk realized no transition (the root's proposal must be scored)")
        taken = {s.node: s.accepted for s in steps}
        for s in steps:  # a realized decision at depth d read its transition's requests
            result.requests.used(by_depth[node_depth(s.node)])
        call_index = len(result.calls)
        nodes = tuple(
            self._node_record(result, block, call_index, r.node, r.parent_cut, r.cut, k + r.depth,
                              scored.decisions[r.node].log_accept, r.parent in taken, taken.get(r.parent),
                              features.at(r.cut))
            for r in plan.requests if r.node in scored.decisions
        )
        result.calls.append(CallRecord(prompt_id=result.prompt_id, sampler=self.name, call_index=call_index,
                                       kind="mh" if generated else "reuse", block=block, wall_time=wall,
                                       nodes_scored=len(nodes), distinct_requests=distinct,
                                       generated_requests=generated, generated_tokens=tokens,
                                       transitions=len(steps), speculation_misses=scored.misses, nodes=nodes,
                                       decode_steps=self._last_steps, row_steps=tokens))
        result.history.extend(s.accepted for s in steps)
        state = scored.state_of(final)
        assert state is not None  # the walk only passes scored proposals
        result.state = state
        return len(steps)
