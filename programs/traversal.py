"""The traversal rule of one prefetch round (PreSTO §3.2-3.3): BFS, or the predictive rule whose ĥ comes from
a callable on the candidate node's features.

`plan_prefetch` is the one planner: the PreSTO sampler calls it every round, and anyone who wants the
requests of a round (a benchmark, a classifier study) calls it with the same arguments.  The tree
(κ, Condition 1, BFS) is `prefetch_tree`; the DP of Proposition 2 is `allocation`; a certainty classifier
supplies ĥ only (`CertaintyClassifier.branch_prob_of`).

    paper                                   code
    c_j of transitions k + d (per depth)    request_cuts[d]
    T, N_pf, K − k                          horizon, budget, depth_cap
    candidate v before its request          CandidateNode(depth, cut, horizon, parent_cut, accepts_on_path)
    c_j / T (Feature 1)                     CandidateNode.cut_fraction
    κ(v), accepts on the path (Feature 2)   CandidateNode.parent_cut, .accepts_on_path (tree_position=True)
    likelihood statistics (Features 3/4)    CandidateNode.features (per depth, from depth_features)
    ĥ(v+; ε) (Eq. 14)                       branch_prob(node)
    BFS (§3.2) / predictive rule (§3.3)     plan_prefetch(..., traversal="bfs" | "predictive")
    F̂_I(v0; ε) of the chosen selection      PrefetchPlan.predicted_transitions
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from .allocation import NodeState, optimal_allocation, optimal_allocation_by_state
from .prefetch_tree import PrefetchPlan, bfs_collect, check_request_cuts, plan_from_selection

TRAVERSALS: tuple[str, ...] = ("bfs", "predictive")


@dataclass(frozen=True)
class CandidateNode:
    """What is known about a candidate node v before its request at v+ is generated."""

    depth: int
    """d(v): the decision is transition k + depth of the block."""
    cut: int
    """c_j: the cut of the request at v+."""
    horizon: int
    """T: the response length of the round's root state."""
    parent_cut: int | None = None
    """κ(v), the known cut of v itself; None when ĥ is computed per depth (tree_position=False)."""
    accepts_on_path: int | None = None
    """Acceptance edges from the root to v; None when ĥ is computed per depth."""
    features: Mapping[str, float] = field(default_factory=dict)
    """Further per-depth values by name (e.g. likelihood statistics at the cut)."""

    @property
    def cut_fraction(self) -> float:
        """c_j / T (Feature 1)."""
        return self.cut / self.horizon

    def values(self) -> dict[str, Any]:
        """Every known value by name (what a feature of `classifiers.features` may read)."""
        out: dict[str, Any] = dict(self.features)
        out.update(cut_fraction=self.cut_fraction, cut=self.cut, depth=self.depth)
        if self.parent_cut is not None:
            out["parent_cut"] = self.parent_cut
        if self.accepts_on_path is not None:
            out["accepts_on_path"] = self.accepts_on_path
        return out


BranchProb = Callable[[CandidateNode], float]
"""ĥ(v+; ε) of a candidate node (Eq. 14)."""


def plan_prefetch(
    request_cuts: Sequence[int],
    horizon: int,
    budget: int,
    depth_cap: int | None = None,
    *,
    traversal: str = "bfs",
    branch_prob: BranchProb | None = None,
    tree_position: bool = False,
    state_dependent_cut: bool = False,
    depth_features: Mapping[str, Sequence[float]] | None = None,
) -> PrefetchPlan:
    """The requests of one prefetch round.

    `request_cuts[d]` is the cut of transition k + d; the depth cap K' is `depth_cap` (default: one depth
    per cut).  "bfs" collects at most N_pf feasible requests breadth-first (§3.2).  "predictive" runs the
    DP of Proposition 2 with ĥ = `branch_prob(node)`: per depth (d, κ memo) when ĥ reads only per-depth
    values, over (depth, κ, accepts) when `tree_position` says it reads κ(v) or the accepts on the path.
    A state-dependent cut law (EntropyCut) can be drawn only at nodes still holding the root's state: BFS
    defers the others, the DP never expands them.  `depth_features[name][d]` adds per-depth values.
    """
    if traversal not in TRAVERSALS:
        raise ValueError(f"traversal must be one of {TRAVERSALS}, got {traversal!r}")
    cap = len(request_cuts) if depth_cap is None else depth_cap
    if traversal == "bfs":
        return bfs_collect(request_cuts, horizon, budget, cap, state_dependent_cut=state_dependent_cut)
    if branch_prob is None:
        raise ValueError("the predictive traversal needs branch_prob (candidate node -> ĥ)")
    cuts = check_request_cuts(request_cuts, horizon)[: max(cap, 0)]
    extra = {k: list(v) for k, v in (depth_features or {}).items()}
    for name, vals in extra.items():
        if len(vals) < len(cuts):
            raise ValueError(f"depth_features[{name!r}] has {len(vals)} values for {len(cuts)} depths")

    def node_at(d: int, state: NodeState | None = None) -> CandidateNode:
        at = {k: v[d] for k, v in extra.items()}
        if state is None:
            return CandidateNode(d, cuts[d], int(horizon), features=at)
        return CandidateNode(d, cuts[d], int(horizon), state.known_cut, state.accepts_on_path, at)

    if not (tree_position or state_dependent_cut):
        hhat = [float(branch_prob(node_at(d))) for d in range(len(cuts))]
        alloc = optimal_allocation(cuts, horizon, hhat, budget)
        return plan_from_selection(alloc.selected, cuts, horizon, predicted_transitions=alloc.value)

    def by_state(state: NodeState) -> float:
        return float(branch_prob(node_at(state.depth, state)))

    if not state_dependent_cut:
        alloc = optimal_allocation_by_state(cuts, horizon, by_state, budget)
        return plan_from_selection(alloc.selected, cuts, horizon, predicted_transitions=alloc.value)
    # Only nodes holding the root's state (no acceptance on the path) can draw their cut now; Condition 1
    # always holds there (κ = T), so the DP sees cuts of T plus that extra condition.
    root_cuts = [int(horizon)] * len(cuts)
    alloc = optimal_allocation_by_state(root_cuts, horizon, by_state, budget,
                                        expandable=lambda s: s.accepts_on_path == 0)
    plan = plan_from_selection(alloc.selected, root_cuts, horizon, predicted_transitions=alloc.value)
    return replace(plan, requests=tuple(replace(r, cut=cuts[r.depth]) for r in plan.requests))
