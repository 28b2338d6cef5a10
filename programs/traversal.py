"""The traversal rule of one prefetch round (PreSTO §3.2-3.3): BFS, or the predictive rule whose ĥ comes from
a callable on the candidate node's features.

`plan_prefetch` is the one planner: the PreSTO sampler calls it every round, and anyone who wants the
requests of a round (a benchmark, a classifier study) calls it with the same arguments.  The tree
(κ, Condition 1, BFS) is `prefetch_tree`; the DP of Proposition 2 is `allocation` (the paper's per-node
budget, `budget_unit="node"`); the allocation under the request budget is `call_cost`; a certainty
classifier supplies ĥ only (`CertaintyClassifier.branch_prob_of`).

    paper                                   code
    c_j of transitions k + d (per depth)    request_cuts[d]
    T, N_pf, K − k                          horizon, budget, depth_cap
    what N_pf counts                        budget_unit: "request" (distinct requests, `call_cost`) | "node"
    candidate v before its request          CandidateNode(depth, cut, horizon, parent_cut, accepts_on_path)
    c_j / T (Feature 1)                     CandidateNode.cut_fraction
    κ(v), accepts on the path (Feature 2)   CandidateNode.parent_cut, .accepts_on_path (tree_position=True)
    likelihood statistics (Features 3/4)    CandidateNode.features (per depth, from depth_features)
    ĥ(v+; ε) (Eq. 14)                       branch_prob(node)
    BFS (§3.2) / predictive rule (§3.3)     plan_prefetch(..., traversal="bfs" | "predictive")
    F̂_I(v0; ε) of the chosen selection      PrefetchPlan.predicted_transitions
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from .allocation import NodeState, optimal_allocation, optimal_allocation_by_state
from .call_cost import BUDGET_UNITS, DEFAULT_MAX_NODES, check_depth_costs, request_budget_allocation
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
    budget: float,
    depth_cap: int | None = None,
    *,
    traversal: str = "bfs",
    branch_prob: BranchProb | None = None,
    tree_position: bool = False,
    budget_unit: str = "request",
    depth_costs: Sequence[float] | None = None,
    max_nodes: int = DEFAULT_MAX_NODES,
    call_overhead: float | None = None,
    depth_features: Mapping[str, Sequence[float]] | None = None,
) -> PrefetchPlan:
    """The requests of one prefetch round.

    `request_cuts[d]` is the cut of transition k + d; the depth cap K' is `depth_cap` (default: one depth
    per cut).  `budget_unit` says what N_pf counts (`call_cost`): "request" (default) the distinct requests
    the call generates - requesting depth d costs `depth_costs[d]` (default 1) once, further nodes there are
    free, at most `max_nodes` nodes are scored; "node" the scored nodes, as in the paper.
    "bfs" collects breadth-first (§3.2).  "predictive" uses ĥ = `branch_prob(node)`: under "node" the DP of
    Proposition 2 (per depth, or over (depth, κ, accepts) when `tree_position` says ĥ reads κ(v) or the
    accepts on the path); under "request" the best-first selection of `call_cost.request_budget_allocation`
    (maximising F̂, or F̂ / (κ0 + cost) with `call_overhead` κ0).  `depth_features[name][d]` adds per-depth
    values to the candidate nodes.
    """
    if traversal not in TRAVERSALS:
        raise ValueError(f"traversal must be one of {TRAVERSALS}, got {traversal!r}")
    if budget_unit not in BUDGET_UNITS:
        raise ValueError(f"budget_unit must be one of {BUDGET_UNITS}, got {budget_unit!r}")
    cap = len(request_cuts) if depth_cap is None else depth_cap
    cuts = check_request_cuts(request_cuts, horizon)[: max(cap, 0)]
    costs = None
    if budget_unit == "request":
        costs = check_depth_costs([1.0] * len(cuts) if depth_costs is None else depth_costs, len(cuts))
    if traversal == "bfs":
        return bfs_collect(request_cuts, horizon, budget, cap, depth_costs=costs, max_nodes=max_nodes)
    if branch_prob is None:
        raise ValueError("the predictive traversal needs branch_prob (candidate node -> ĥ)")
    node_at = _candidate_factory(cuts, int(horizon), depth_features)
    if costs is not None:
        alloc, _ = request_budget_allocation(cuts, horizon, lambda s: float(branch_prob(node_at(s.depth, s))),
                                             budget, costs, max_nodes=max_nodes, call_overhead=call_overhead)
    elif not tree_position:
        hhat = [float(branch_prob(node_at(d))) for d in range(len(cuts))]
        alloc = optimal_allocation(cuts, horizon, hhat, int(budget))
    else:
        alloc = optimal_allocation_by_state(cuts, horizon, lambda s: float(branch_prob(node_at(s.depth, s))),
                                            int(budget))
    return plan_from_selection(alloc.selected, cuts, horizon, predicted_transitions=alloc.value)


def _candidate_factory(cuts: Sequence[int], horizon: int, depth_features: Mapping[str, Sequence[float]] | None):
    """node_at(d[, state]) -> CandidateNode with the per-depth features (and the state's tree position)."""
    extra = {k: list(v) for k, v in (depth_features or {}).items()}
    for name, vals in extra.items():
        if len(vals) < len(cuts):
            raise ValueError(f"depth_features[{name!r}] has {len(vals)} values for {len(cuts)} depths")

    def node_at(d: int, state: NodeState | None = None) -> CandidateNode:
        at = {k: v[d] for k, v in extra.items()}
        if state is None:
            return CandidateNode(d, cuts[d], horizon, features=at)
        return CandidateNode(d, cuts[d], horizon, state.known_cut, state.accepts_on_path, at)

    return node_at
