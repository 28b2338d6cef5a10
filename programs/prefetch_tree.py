"""The prefetching tree of PreSTO (§3.2, App. C.1): heap indexing, Condition 1, BFS collection, the walk.

Nodes use heap indexing: the round's root (current MH state after k transitions) is 0; node i's
acceptance child is 2i+1 (its state is a new proposal: expanding i costs one request) and its rejection
child is 2i+2 (keeps i's state; no request).  All nodes at depth d below the root decide the same MH
transition j = k + d and share its random inputs, in particular its request cut `request_cuts[d]`.

    paper                                   code
    v, v+, v−                               i, accept_child(i), reject_child(i)
    d(v)                                    node_depth(i)
    c_v ("cut index" of a node; root: T)    known_cut κ(i): κ(0) = T, κ(2i+1) = c of its request,
                                            κ(2i+2) = κ(i); positions [0, κ) equal the root state's
    Condition 1: c' ≤ c                     is_feasible(request_cut, known_cut)
    N_pf                                    budget
    K' = K − k (depth cap)                  depth_cap
    (v_i, c_i) request                      PrefetchRequest
    MHTransition                            mh_transition

Every feasible request's prefix is root_state[:c] (Condition 1 and the prefix identity of §3.2).
A request whose cut law depends on a state not yet generated (EntropyCut below an acceptance) is deferred
like an infeasible one; its inputs are a pure function of j, so deferral keeps them (Prop. 1, A2).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence


def accept_child(node: int) -> int:
    """Heap index of v+ (acceptance child)."""
    return 2 * node + 1


def reject_child(node: int) -> int:
    """Heap index of v− (rejection child)."""
    return 2 * node + 2


def parent_of(node: int) -> int:
    if node <= 0:
        raise ValueError(f"the root has no parent (node {node})")
    return (node - 1) // 2


def is_accept_child(node: int) -> bool:
    return node > 0 and node % 2 == 1


def node_depth(node: int) -> int:
    """Depth of a heap index (root 0)."""
    if node < 0:
        raise ValueError(f"node must be >= 0, got {node}")
    return (node + 1).bit_length() - 1


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


def is_feasible(request_cut: int, known_cut: int) -> bool:
    """Condition 1: the request at v's acceptance child (cut c') can be generated now iff c' ≤ κ(v)."""
    return request_cut <= known_cut


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


def known_cuts(nodes: Sequence[int], request_cuts: Sequence[int], horizon: int) -> dict[int, int]:
    """κ for the given nodes (and their ancestors) from the per-depth request cuts."""
    out: dict[int, int] = {0: horizon}
    for node in sorted(set(v for n in nodes for v in path_from_root(n))):
        if node == 0:
            continue
        par = parent_of(node)
        out[node] = request_cuts[node_depth(par)] if is_accept_child(node) else out[par]
    return out


def bfs_collect(
    request_cuts: Sequence[int],
    horizon: int,
    budget: int,
    depth_cap: int,
    *,
    state_dependent_cut: bool = False,
) -> PrefetchPlan:
    """BFS collection of at most N_pf feasible requests (§3.2 step 1, paper-faithful).

    `request_cuts[d]` is the cut of transition k + d; with `state_dependent_cut` (EntropyCut) it is the cut
    drawn from the ROOT state's law, valid only at nodes whose state is the root's (κ = T); elsewhere the
    request is deferred.  As in the paper's implementation, the rejection child is enqueued even when the
    node's own request (at its acceptance child) is deferred: requests placed below it are issued but the
    walk of this round stops at the deferred node and never reaches them.
    """
    if budget < 1:
        raise ValueError(f"budget N_pf must be >= 1, got {budget}")
    if depth_cap < 1:
        raise ValueError(f"depth_cap K-k must be >= 1, got {depth_cap}")
    if len(request_cuts) < min(depth_cap, budget):
        raise ValueError(f"need request cuts for depths 0..{min(depth_cap, budget) - 1}, got {len(request_cuts)}")
    queue: deque[tuple[int, int]] = deque([(0, horizon)])
    known: dict[int, int] = {0: horizon}
    requests: list[PrefetchRequest] = []
    deferred: set[int] = set()
    while queue and len(requests) < budget:
        node, kappa = queue.popleft()
        depth = node_depth(node)
        if depth >= depth_cap or depth >= len(request_cuts):
            continue
        cut = int(request_cuts[depth])
        plus, minus = accept_child(node), reject_child(node)
        computable = (not state_dependent_cut) or kappa == horizon
        if computable and is_feasible(cut, kappa):
            requests.append(PrefetchRequest(node=plus, parent=node, depth=depth, cut=cut, parent_cut=kappa))
            known[plus] = cut
            queue.append((plus, cut))
        else:
            deferred.add(plus)
        known[minus] = kappa
        queue.append((minus, kappa))
    return PrefetchPlan(requests=tuple(requests), deferred=frozenset(deferred), known_cut=known)


def plan_from_selection(
    selected: Sequence[int], request_cuts: Sequence[int], horizon: int
) -> PrefetchPlan:
    """Requests for an explicit selection ℐ of expanded nodes (e.g. the predictive DP's), in BFS order."""
    sel = sorted(set(int(i) for i in selected), key=lambda i: (node_depth(i), i))
    known = known_cuts(sel, request_cuts, horizon)
    requests = []
    for node in sel:
        if node != 0 and parent_of(node) not in sel:
            raise ValueError(f"selection is not ancestor-closed: {node} without its parent")
        depth = node_depth(node)
        cut = int(request_cuts[depth])
        if not is_feasible(cut, known[node]):
            raise ValueError(f"selected node {node} violates Condition 1 (cut {cut} > κ {known[node]})")
        requests.append(PrefetchRequest(node=accept_child(node), parent=node, depth=depth, cut=cut,
                                        parent_cut=known[node]))
        known[accept_child(node)] = cut
        known[reject_child(node)] = known[node]
    return PrefetchPlan(requests=tuple(requests), known_cut=known)


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
