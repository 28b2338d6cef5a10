"""The prefetching tree of PreSTO (§3.2, App. C.1): heap indexing, κ, Condition 1, BFS collection, the walk.

Nodes use heap indexing: the round's root (current MH state after k transitions) is 0; node i's
acceptance child is 2i+1 (its state is a new proposal: expanding i costs one request) and its rejection
child is 2i+2 (keeps i's state; no request).  All nodes at depth d below the root decide the same MH
transition j = k + d and share its random inputs, in particular its request cut `request_cuts[d]`.

    paper                                   code
    v, v+, v−                               i, accept_child(i), reject_child(i)
    d(v)                                    node_depth(i)
    c_v ("cut index" of a node; root: T)    known_cut κ(i): κ(0) = T, κ(2i+1) = c of its request,
                                            κ(2i+2) = κ(i); positions [0, κ) equal the root state's
    c_j (cut of the request at v+)          request_cuts[node_depth(i)]
    T                                       horizon
    Condition 1: c' ≤ c                     is_feasible(request_cut, known_cut)
    v expandable (Condition 1, d(v) < K')   is_expandable(i, request_cuts, horizon)
    I_max (App. C.1)                        candidate_nodes(...), is_candidate(...)
    N_pf                                    budget (nodes, or distinct requests: `call_cost`)
    K' = K − k (depth cap)                  depth_cap (BFS); len(request_cuts) (I_max)
    (v_i, c_i) request                      PrefetchRequest
    MHTransition                            mh_transition

Every feasible request's prefix is root_state[:c] (Condition 1 and the prefix identity of §3.2), so all
feasible nodes of one depth share one request.  A request whose cut law depends on a state not yet
generated (EntropyCut below an acceptance) is made at the root's cut and validated after generation
(`transitions.EntropyCutKernel`); one that fails is deferred like an infeasible one.  Deferred inputs are a pure
function of j, so deferral keeps them (Prop. 1, A2).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Container, Iterable, Sequence

import numpy as np


# -- heap indexing ------------------------------------------------------------------------------------
def check_node(node: int) -> int:
    """`node` as an int, or ValueError unless it is a non-negative heap index."""
    if isinstance(node, bool) or not isinstance(node, (int, np.integer)) or node < 0:
        raise ValueError(f"node must be a non-negative heap index, got {node!r}")
    return int(node)


def accept_child(node: int) -> int:
    """Heap index of v+ (acceptance child, 2i+1); expanding v issues its proposal request."""
    return 2 * check_node(node) + 1


def reject_child(node: int) -> int:
    """Heap index of v− (rejection child, 2i+2); it keeps v's state and needs no request."""
    return 2 * check_node(node) + 2


def parent_of(node: int) -> int:
    """Parent of a non-root node."""
    if check_node(node) == 0:
        raise ValueError(f"the root has no parent (node {node})")
    return (int(node) - 1) // 2


def is_accept_child(node: int) -> bool:
    return node > 0 and node % 2 == 1


def node_depth(node: int) -> int:
    """Depth d(v) of a heap index: floor(log2(i + 1)); the root has depth 0."""
    return (check_node(node) + 1).bit_length() - 1


def path_from_root(node: int) -> list[int]:
    """Heap indices root, ..., node."""
    path = [node]
    while node > 0:
        node = parent_of(node)
        path.append(node)
    return path[::-1]


def accepts_on_path(node: int) -> int:
    """Number of acceptance edges on the path from the root to `node`."""
    return sum(1 for v in path_from_root(node)[1:] if is_accept_child(v))


def ancestors_in(node: int, nodes: Container[int]) -> bool:
    """Whether every strict ancestor of `node` is in `nodes` (a traversal from the root can reach it)."""
    return all(v in nodes for v in path_from_root(node)[:-1])


# -- κ and Condition 1 --------------------------------------------------------------------------------
def check_request_cuts(request_cuts: Sequence[int], horizon: int) -> tuple[int, ...]:
    """The per-depth request cuts as ints in [0, T], or ValueError naming the bad entry."""
    if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 1:
        raise ValueError(f"horizon must be a positive integer (T), got {horizon!r}")
    cuts: list[int] = []
    for d, c in enumerate(request_cuts):
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)):
            raise ValueError(f"request_cuts[{d}] must be an integer cut index, got {c!r}")
        if not 0 <= c <= horizon:
            raise ValueError(f"request_cuts[{d}] = {c} must lie in [0, horizon] = [0, {horizon}]")
        cuts.append(int(c))
    return tuple(cuts)


def _known_cut(node: int, cuts: Sequence[int], horizon: int) -> int:
    # Walk up until the first acceptance edge: that edge's transition set the state's cut.
    while node != 0:
        if is_accept_child(node):
            return cuts[node_depth(parent_of(node))]
        node = parent_of(node)
    return horizon


def known_cut(node: int, request_cuts: Sequence[int], horizon: int) -> int:
    """Known cut κ(v): T at the root, the request cut of the transition that created v for an
    acceptance child, the parent's κ for a rejection child (the cut c_i of Condition 1)."""
    return _known_cut(check_node(node), check_request_cuts(request_cuts, horizon), int(horizon))


def known_cuts(nodes: Sequence[int], request_cuts: Sequence[int], horizon: int) -> dict[int, int]:
    """κ for the given nodes and their ancestors."""
    cuts = check_request_cuts(request_cuts, horizon)
    out = {0: int(horizon)}
    out.update((v, _known_cut(v, cuts, int(horizon))) for n in nodes for v in path_from_root(check_node(n)))
    return out


def is_feasible(request_cut: int, known_cut: int) -> bool:
    """Condition 1: the request at v's acceptance child (cut c') can be generated now iff c' ≤ κ(v)."""
    return request_cut <= known_cut


def _expandable(node: int, cuts: Sequence[int], horizon: int) -> bool:
    d = node_depth(node)
    return d < len(cuts) and is_feasible(cuts[d], _known_cut(node, cuts, horizon))


def is_expandable(node: int, request_cuts: Sequence[int], horizon: int) -> bool:
    """Condition 1 at v and the depth cap: d(v) < K' and the request at v+ has cut c_j <= κ(v)."""
    return _expandable(check_node(node), check_request_cuts(request_cuts, horizon), int(horizon))


def is_candidate(node: int, request_cuts: Sequence[int], horizon: int) -> bool:
    """v ∈ I_max: v and all of its strict ancestors are expandable (App. C.1)."""
    cuts = check_request_cuts(request_cuts, horizon)
    return all(_expandable(v, cuts, int(horizon)) for v in path_from_root(check_node(node)))


def candidate_nodes(request_cuts: Sequence[int], horizon: int, max_depth: int | None = None) -> frozenset[int]:
    """I_max restricted to depth < max_depth (default K'); exponential in depth: small trees only."""
    cuts = check_request_cuts(request_cuts, horizon)
    cap = len(cuts) if max_depth is None else min(len(cuts), max_depth)
    out: set[int] = set()
    stack = [(0, int(horizon))]
    while stack:
        node, kappa = stack.pop()
        d = node_depth(node)
        if d >= cap or not is_feasible(cuts[d], kappa):
            continue
        out.add(node)
        stack.append((accept_child(node), cuts[d]))
        stack.append((reject_child(node), kappa))
    return frozenset(out)


# -- one round's requests -----------------------------------------------------------------------------
@dataclass(frozen=True)
class PrefetchRequest:
    """One suffix-resampling request (v+, c): the proposal at `node` = accept_child(parent)."""

    node: int
    """Heap index of the acceptance child v+ that holds the proposal."""
    parent: int
    """Heap index of v (the node whose decision this proposal serves)."""
    depth: int
    """Depth of v: the decision is transition k + depth of the block."""
    cut: int
    """Cut c_j of the request; the prefix is root_state[:cut]."""
    parent_cut: int
    """κ(v), the known cut of the parent (Condition 1: cut ≤ parent_cut)."""


@dataclass(frozen=True)
class PrefetchPlan:
    """The requests of one round, the deferred acceptance children and κ of every visited node."""

    requests: tuple[PrefetchRequest, ...]
    deferred: frozenset[int] = frozenset()
    known_cut: dict[int, int] = field(default_factory=dict)
    predicted_transitions: float | None = None
    """F̂_I(v0; ε) of the selection (Eq. 12 / 19) when the predictive rule chose it; None for BFS."""

    @property
    def expanded(self) -> frozenset[int]:
        """I: the expanded nodes v (one request each, for the proposal at v+)."""
        return frozenset(r.parent for r in self.requests)

    @property
    def depths(self) -> frozenset[int]:
        """The depths requested: one distinct request (PowerMH, EntropyCut; 2M − 1 for MultiTryMH) each."""
        return frozenset(r.depth for r in self.requests)

    @property
    def unreachable(self) -> frozenset[int]:
        """Expanded nodes below a node that was not expanded (BFS below a deferred request, §3.2): their
        requests are issued, but the walk of this round stops above them.  Empty for the predictive rule."""
        expanded = self.expanded
        return frozenset(v for v in expanded if not ancestors_in(v, expanded))


def bfs_collect(
    request_cuts: Sequence[int],
    horizon: int,
    budget: float,
    depth_cap: int,
    *,
    depth_costs: Sequence[float] | None = None,
    max_nodes: int | None = None,
) -> PrefetchPlan:
    """BFS collection of feasible requests (§3.2 step 1).

    Without `depth_costs` (the paper's count): at most N_pf = `budget` nodes.  With `depth_costs` (forerun's
    request unit, `call_cost`): a node at a depth already requested is free, the first node at depth d costs
    `depth_costs[d]`, BFS stops at the first depth the budget cannot pay (the root's depth is always paid, a
    depth of cost 0 always fits) and after `max_nodes` nodes.
    As in the paper's implementation, the rejection child is enqueued even when the node's own request (at
    its acceptance child) is deferred under Condition 1: requests placed below it are issued but the walk of
    this round stops at the deferred node and never reaches them (`PrefetchPlan.unreachable`).
    """
    if not budget >= 1:
        raise ValueError(f"budget N_pf must be >= 1, got {budget}")
    if depth_cap < 1:
        raise ValueError(f"depth_cap K-k must be >= 1, got {depth_cap}")
    per_node = depth_costs is None
    need = min(depth_cap, int(budget)) if per_node else min(depth_cap, 1)
    if len(request_cuts) < need:
        raise ValueError(f"need request cuts for depths 0..{need - 1}, got {len(request_cuts)}")
    cap = min(depth_cap, len(request_cuts))
    limit = int(budget) if per_node else (len(request_cuts) * 2**cap if max_nodes is None else max_nodes)
    queue: deque[tuple[int, int]] = deque([(0, horizon)])
    known: dict[int, int] = {0: horizon}
    requests: list[PrefetchRequest] = []
    deferred: set[int] = set()
    paid, spent = -1, 0.0
    while queue and len(requests) < limit:
        node, kappa = queue.popleft()
        depth = node_depth(node)
        if depth >= cap:
            continue
        cut = int(request_cuts[depth])
        plus, minus = accept_child(node), reject_child(node)
        if is_feasible(cut, kappa):
            if not per_node and depth > paid:  # BFS meets depths in order: depth == paid + 1
                if depth > 0 and depth_costs[depth] > 0 and spent + depth_costs[depth] > budget:
                    break  # deeper nodes all sit below this unpaid depth
                paid, spent = depth, spent + float(depth_costs[depth])
            requests.append(PrefetchRequest(node=plus, parent=node, depth=depth, cut=cut, parent_cut=kappa))
            known[plus] = cut
            queue.append((plus, cut))
        else:
            deferred.add(plus)
        known[minus] = kappa
        queue.append((minus, kappa))
    return PrefetchPlan(requests=tuple(requests), deferred=frozenset(deferred), known_cut=known)


def plan_from_selection(
    selected: Iterable[int], request_cuts: Sequence[int], horizon: int,
    *, predicted_transitions: float | None = None,
) -> PrefetchPlan:
    """Requests for an explicit selection ℐ of expanded nodes (e.g. the predictive DP's), in BFS order."""
    chosen = set(check_node(i) for i in selected)
    sel = sorted(chosen, key=lambda i: (node_depth(i), i))
    check_request_cuts(request_cuts, horizon)
    known = {0: int(horizon)}  # κ of each node is set by its parent, met earlier in BFS order: linear in |ℐ|
    requests = []
    for node in sel:
        if node != 0 and parent_of(node) not in chosen:
            raise ValueError(f"selection is not ancestor-closed: {node} without its parent")
        depth = node_depth(node)
        cut = int(request_cuts[depth])
        if not is_feasible(cut, known[node]):
            raise ValueError(f"selected node {node} violates Condition 1 (cut {cut} > κ {known[node]})")
        requests.append(PrefetchRequest(node=accept_child(node), parent=node, depth=depth, cut=cut,
                                        parent_cut=known[node]))
        known[accept_child(node)] = cut
        known[reject_child(node)] = known[node]
    return PrefetchPlan(requests=tuple(requests), known_cut=known, predicted_transitions=predicted_transitions)


# -- the walk -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WalkStep:
    node: int
    """Heap index of v, where the decision is taken."""
    accepted: bool


def mh_transition(
    decide: Callable[[int], bool | None], max_transitions: int
) -> tuple[int, tuple[WalkStep, ...]]:
    """MHTransition: follow the realized path from the root for at most K − k transitions.

    `decide(v)` returns the MH decision at v (accept/reject, from the scored proposal at v+ and the
    decision's uniform), or None when v+ was not generated this round (deferred or outside the
    selection): the walk stops there and the next round starts from v's state.
    """
    if max_transitions < 0:
        raise ValueError(f"max_transitions must be >= 0, got {max_transitions}")
    node = 0
    steps: list[WalkStep] = []
    for _ in range(max_transitions):
        decision = decide(node)
        if decision is None:
            break
        steps.append(WalkStep(node=node, accepted=bool(decision)))
        node = accept_child(node) if decision else reject_child(node)
    return node, tuple(steps)
