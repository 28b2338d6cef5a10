"""PrefetchAndScore of one PreSTO round (Algorithm 2): the round's engine requests and the scored subtree.

`round_requests` turns a plan into engine requests - one set per requested depth, since every feasible node
of a depth shares its transition's inputs and (Condition 1) the prefix root[:c_j].  `score_round` scores
every planned node on its own state: v− keeps v's state, v+ holds v's proposal.  A kernel whose cut law
depends on the state (EntropyCut) was planned at the ROOT's cut; a node below an acceptance keeps its
proposal only if the cut drawn from its own state, now generated, is the same (a speculation miss is not
scored: the walk defers there; nodes below its proposal are never scored, they do not exist in the chain).

    paper                                   code
    (v+, c_j) requests of the round         PrefetchPlan.requests -> round_requests(...) (per depth)
    scored prefetched subtree 𝒯             score_round(...) -> ScoredRound.decisions (v+ -> Decision)
    state of a node                         ScoredRound.states
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .transitions import ChainState, Decision, TransitionKernel
from .prefetch_tree import PrefetchRequest, accepts_on_path, is_accept_child, parent_of
from .suffixes import Suffix, SuffixRequest
from .random_streams import DecisionStream


def round_requests(kernel: TransitionKernel, prompt_ids: tuple[int, ...], root: ChainState,
                   requests: Sequence[PrefetchRequest], k: int,
                   stream: DecisionStream) -> dict[int, list[SuffixRequest]]:
    """depth -> the engine requests of the transition k + depth at the depth's cut (shared by its nodes)."""
    by_depth: dict[int, list[SuffixRequest]] = {}
    for r in requests:
        if r.cut > r.parent_cut:
            raise RuntimeError(f"request at node {r.node} is not feasible this round (Condition 1)")
        if r.depth not in by_depth:
            prefix = prompt_ids + tuple(int(t) for t in root.tokens[: r.cut])
            by_depth[r.depth] = kernel.requests(prefix, r.cut, root.length, k + r.depth, stream)
    return by_depth


@dataclass
class ScoredRound:
    """The scored nodes of one round."""

    decisions: dict[int, Decision] = field(default_factory=dict)
    """v+ -> the scored proposal of the decision at v."""
    states: dict[int, ChainState] = field(default_factory=dict)
    """Node -> its state (root 0; v+ its proposal; v− its parent's)."""
    misses: int = 0
    """Speculation misses (EntropyCut below an acceptance whose own cut differs from the root's)."""

    def state_of(self, node: int) -> ChainState | None:
        """The node's state, or None when it hangs below a proposal that was not scored."""
        if node in self.states:
            return self.states[node]
        if is_accept_child(node):
            return None
        state = self.state_of(parent_of(node))
        if state is not None:
            self.states[node] = state
        return state


def score_round(kernel: TransitionKernel, root: ChainState, requests: Sequence[PrefetchRequest],
                suffixes: Sequence[Sequence[Suffix]], k: int, stream: DecisionStream) -> ScoredRound:
    """Score every planned node (requests in BFS / depth order, with their suffixes)."""
    scored = ScoredRound(states={0: root})
    for r, sfx in zip(requests, suffixes):
        state = scored.state_of(r.parent)
        if state is None:
            continue
        j = k + r.depth
        if kernel.state_dependent_cut and accepts_on_path(r.parent) > 0 and kernel.cut(state, j, stream) != r.cut:
            scored.misses += 1
            continue
        decision = kernel.decide(state, r.cut, sfx, j, stream)
        scored.decisions[r.node] = decision
        scored.states[r.node] = decision.proposal
    return scored
