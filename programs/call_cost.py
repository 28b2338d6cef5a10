"""A prefetch budget that counts what a model call costs: distinct generated requests (forerun's unit).

Why not nodes.  Cuts, suffix seeds and acceptance uniforms are drawn per transition (`random_streams`), so
every node at depth d of a round requests the SAME suffix (prefix root[:c_d] by Condition 1, the same length,
τ and seed): the engine generates it once.  Counting nodes (the paper's N_pf, where every node draws its own
cut and is its own request) charges breadth that costs nothing: at N_pf = 20 a round scored ~17 nodes but
generated ~6 distinct requests.

Why distinct requests and not tokens.  On an engine with continuous batching a call takes about (decode
steps) × (cost of one step), and the cost of a step grows with the number of distinct rows in the batch
(measured on the 2-core CPU engine: 6 rows ≈ 1.45×, 20 rows ≈ 2.5-2.9× one row; on a GPU far less).  Identical
requests are generated once, so a row is a distinct request.  Counting tokens (Σ (T − c) over distinct
requests) would also weigh row lengths, but a short row still occupies the batch for the longest row's steps
in the padded engines and the step count is set by the longest row, not the sum; the row count is the
quantity the step cost grows with, and it keeps N_pf's meaning from the paper: the number of suffix
requests in one batch (in the paper every node is one).  PowerMH and EntropyCut pay one request per depth,
MultiTryMH 2M − 1 (M candidates and M − 1 reference points share the prefix); a request already generated in
an earlier round of the chain (`suffix_cache`) costs nothing.

What that makes of the selection problem.  Another node at an already-requested depth is free, and a node
needs all its ancestors, so a selection's requested depths are always 0..m−1 and its cost is
Σ_{d<m} cost_d.  Every extra node only adds its reaching weight R(v) ≥ 0 to F̂ (Lemma 1), so under this cost
the optimum of Eq. 17 within the budget is every candidate node above the deepest affordable depth; the one
limit on breadth left is `max_nodes` (scoring work on the CPU, no engine cost), and within it the best
nodes are the `max_nodes` largest R(v) (R never grows along a path, so the top ones form an ancestor-closed
set: best-first search).  The predictive rule can also trade depth for a cheaper call: with a call overhead
κ0 (the fixed cost of a call in request-equivalents) it maximises F̂ / (κ0 + cost), the expected transitions
per unit of call time, over the affordable depths.

    paper / notion                          code
    N_pf (budget), in distinct requests     budget
    cost of requesting depth d              depth_costs[d] (requests not yet generated for that depth)
    deepest affordable depth m              affordable_depths(depth_costs, budget)
    R(v; ε) (Eq. 11), F̂_I (Eq. 12)          best_first_selection(...) weights, Allocation.value
    κ0 (call overhead, request units)       call_overhead
    optimum of Eq. 17 under this cost       request_budget_allocation(...)
"""

from __future__ import annotations

import heapq
import math
from typing import Callable, Iterable, Sequence

from .allocation import Allocation, NodeState
from .prefetch_tree import accept_child, check_request_cuts, node_depth, reject_child

BUDGET_UNITS: tuple[str, ...] = ("request", "node")
""""request": distinct generated requests (forerun, default); "node": scored nodes (the paper's count)."""

DEFAULT_MAX_NODES = 256
"""Default cap on the nodes scored in one round under the request unit (CPU work, no engine cost)."""


def check_depth_costs(depth_costs: Sequence[float], depths: int) -> tuple[float, ...]:
    costs = tuple(float(c) for c in depth_costs)
    if len(costs) < depths:
        raise ValueError(f"need a cost for each of the {depths} depths, got {len(costs)}")
    bad = [c for c in costs if not (c >= 0.0) or math.isinf(c)]
    if bad:
        raise ValueError(f"depth costs must be finite and >= 0, got {bad[0]!r}")
    return costs


def affordable_depths(depth_costs: Sequence[float], budget: float) -> int:
    """m: the most leading depths 0..m−1 that fit the budget: their summed cost is at most the budget, or
    every one but the root's is free.  At least 1: the root's request is always made, even when it alone
    exceeds the budget (e.g. MultiTryMH's 2M − 1 > N_pf), and a depth of cost 0 always fits."""
    spent, m = 0.0, 0
    for cost in depth_costs:
        if m and cost > 0 and spent + cost > budget:
            break
        spent += cost
        m += 1
    return max(1, m) if depth_costs else 0


def selection_cost(selected: Iterable[int], depth_costs: Sequence[float]) -> float:
    """Σ over the distinct depths of `selected` of their cost: what the call generates."""
    return float(sum(depth_costs[d] for d in {node_depth(v) for v in selected}))


def best_first_selection(
    request_cuts: Sequence[int],
    horizon: int,
    accept_prob: Callable[[NodeState], float],
    max_nodes: int,
    depth_cap: int,
) -> dict[int, float]:
    """The `max_nodes` candidate nodes of depth < depth_cap with the largest reaching weight R(v) (Eq. 11),
    node -> R(v), found best-first; ties go to the shallower node, so the result is ancestor-closed.
    Nodes that cannot be reached (R = 0) are left out; the root is always in."""
    cuts = check_request_cuts(request_cuts, horizon)
    cap = min(depth_cap, len(cuts))
    heap: list[tuple[float, int, int, NodeState]] = [(-1.0, 0, 0, NodeState(0, int(horizon), 0))]
    chosen: dict[int, float] = {}
    while heap and len(chosen) < max_nodes:
        neg_r, _, node, state = heapq.heappop(heap)
        d = state.depth
        if d >= cap or cuts[d] > state.known_cut or (node and neg_r == 0.0):
            continue
        chosen[node] = -neg_r
        h = float(accept_prob(state))
        for child, weight, child_state in (
            (accept_child(node), -neg_r * h, NodeState(d + 1, cuts[d], state.accepts_on_path + 1)),
            (reject_child(node), -neg_r * (1.0 - h), NodeState(d + 1, state.known_cut, state.accepts_on_path)),
        ):
            heapq.heappush(heap, (-weight, d + 1, child, child_state))
    return chosen


def request_budget_allocation(
    request_cuts: Sequence[int],
    horizon: int,
    accept_prob: Callable[[NodeState], float],
    budget: float,
    depth_costs: Sequence[float],
    *,
    max_nodes: int = DEFAULT_MAX_NODES,
    call_overhead: float | None = None,
) -> tuple[Allocation, float]:
    """The selection maximising F̂ (Eq. 12) under the request cost, or F̂ / (κ0 + cost) with a call overhead
    κ0; returns it with its cost.  Feasible selections contain the root, cost at most `budget` (or cost
    only their root depth's), and have at most `max_nodes` nodes.  `accept_prob` is ĥ(v+; ε) of a node's state."""
    if max_nodes < 1:
        raise ValueError(f"max_nodes must be >= 1, got {max_nodes}")
    if call_overhead is not None and not (call_overhead > 0.0 and math.isfinite(call_overhead)):
        raise ValueError(f"call_overhead κ0 must be finite and > 0, got {call_overhead!r}")
    cuts = check_request_cuts(request_cuts, horizon)
    costs = check_depth_costs(depth_costs, len(cuts))
    m_max = affordable_depths(costs[: len(cuts)], budget)
    memo: dict[NodeState, float] = {}

    def h(state: NodeState) -> float:
        if state not in memo:
            p = float(accept_prob(state))
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"accept_prob({state}) must be a probability in [0, 1], got {p!r}")
            memo[state] = p
        return memo[state]

    best: tuple[float, dict[int, float], float] | None = None
    for m in ([m_max] if call_overhead is None else range(1, m_max + 1)):
        chosen = best_first_selection(cuts, horizon, h, max_nodes, m)
        value, cost = math.fsum(chosen.values()), selection_cost(chosen, costs)
        score = value if call_overhead is None else value / (call_overhead + cost)
        if best is None or score > best[0] * (1.0 + 1e-12):
            best = (score, chosen, cost)
    assert best is not None
    _, chosen, cost = best
    return Allocation(selected=frozenset(chosen), value=math.fsum(chosen.values())), cost
