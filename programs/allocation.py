"""The predictive traversal rule of PreSTO (§3.3, App. C): Eq. 14, Lemma 1/2, the DP of Proposition 2.

Given the transitions of the current block (one request cut per depth) and a predicted branch
probability per node, choose at most ``N_pf`` requests (expanded nodes) that maximise the predicted
number of completed MH transitions (Eq. 17), by the dynamic program of Proposition 2 (Eq. 19).
The tree itself - heap indexing, κ, Condition 1, I_max, BFS, the walk - is ``prefetch_tree``; the
round's planner that chooses between BFS and this rule is ``traversal``.  This is the paper's per-node
budget (``budget_unit="node"``); under forerun's default budget of distinct requests, where nodes of an
already-requested depth are free, the selection is ``call_cost.request_budget_allocation``.

    paper                       code
    v0, v, v+, v-               root 0, node i, accept_child(i), reject_child(i)      (prefetch_tree)
    d(v)                        node_depth(i)                                          (prefetch_tree)
    c_i (known cut of v_i)      known_cut(i, request_cuts, horizon) = κ(i)             (prefetch_tree)
    c_j (cut of request at v+)  request_cuts[node_depth(i)]
    T                           horizon
    K'                          len(request_cuts)  (depth cap)
    I_max                       candidate_nodes(...), is_candidate(...)               (prefetch_tree)
    I (selection)               Allocation.selected
    N_pf, b                     budget
    P̂_rej, P̂_acc                p_reject, p_accept
    ĥ(v+; ε), ĥ(v-; ε)          branch_prob_accept(...), 1 - branch_prob_accept(...)  (Eq. 14)
    R(v; ε)                     reaching_weight / reaching_weights          (Eq. 11)
    F_I(v0; ε)                  expected_transitions                        (Eq. 12, Lemma 1)
    F_I(v; ε) recursive         expected_transitions_recursive              (Eq. 13, Lemma 2)
    V(v, b; ε)                  optimal_allocation(...).value               (Eq. 18-19, Prop. 2)
    (d(v), c_i, #accepts)       NodeState(depth, known_cut, accepts_on_path)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Mapping, NamedTuple, Protocol, Sequence

import numpy as np

from .prefetch_tree import (
    accept_child,
    ancestors_in,
    check_node,
    check_request_cuts,
    is_accept_child,
    node_depth,
    parent_of,
    reject_child,
)

__all__ = [
    "Allocation",
    "branch_prob_accept",
    "depth_accept_probs",
    "reaching_weight",
    "reaching_weights",
    "expected_transitions",
    "expected_transitions_recursive",
    "optimal_allocation",
    "optimal_allocation_by_state",
    "optimal_allocation_general",
    "NodeState",
]

# Relative tolerance when comparing predicted transition counts (sums of products of probabilities).
_VALUE_TOL = 1e-12

AcceptProbByNode = Mapping[int, float] | Callable[[int], float]


# --------------------------------------------------------------------------------------------------
# Branch probabilities, reaching weights, expected transition count
# --------------------------------------------------------------------------------------------------


def _check_prob(name: str, p: float) -> float:
    p = float(p)
    if not (0.0 <= p <= 1.0) or math.isnan(p):
        raise ValueError(f"{name} must be a probability in [0, 1], got {p!r}")
    return p


def branch_prob_accept(p_reject: float | np.ndarray, p_accept: float | np.ndarray) -> float | np.ndarray:
    """Predicted branch probability ĥ(v+; ε) = ½(1 + P̂_acc − P̂_rej) (Eq. 14; midpoint of Lemma 3).

    ``p_reject`` and ``p_accept`` are the predicted probabilities of the ε-certain reject and
    ε-certain accept classes; the ε-uncertain class gets the rest and counts ½.  Scalars give a float,
    arrays (one entry per candidate node) an array.
    """
    pr = np.asarray(p_reject, dtype=float)
    pa = np.asarray(p_accept, dtype=float)
    for name, p in (("p_reject", pr), ("p_accept", pa)):
        if not np.all((p >= 0.0) & (p <= 1.0)):
            raise ValueError(f"{name} must be a probability in [0, 1], got {p.tolist()!r}")
    if np.any(pr + pa > 1.0 + 1e-9):
        raise ValueError(f"p_reject + p_accept must be at most 1, got {pr.tolist()} + {pa.tolist()}")
    h = np.clip(0.5 * (1.0 + pa - pr), 0.0, 1.0)
    return float(h) if h.ndim == 0 else h


def depth_accept_probs(accept_prob: Sequence[float]) -> Callable[[int], float]:
    """Per-node ĥ(v+) from per-depth values: node i gets ``accept_prob[node_depth(i)]``."""
    probs = tuple(_check_prob(f"accept_prob[{d}]", p) for d, p in enumerate(accept_prob))

    def by_node(node: int) -> float:
        d = node_depth(node)
        if d >= len(probs):
            raise ValueError(f"no accept_prob for node {node} at depth {d} (only {len(probs)} depths given)")
        return probs[d]

    return by_node


def _lookup(accept_prob_by_node: AcceptProbByNode) -> Callable[[int], float]:
    if callable(accept_prob_by_node):
        fn = accept_prob_by_node
    else:
        table = accept_prob_by_node

        def fn(node: int) -> float:
            if node not in table:
                raise ValueError(f"no accept probability given for node {node}")
            return table[node]

    return lambda node: _check_prob(f"accept probability of node {node}", fn(node))


def reaching_weight(node: int, accept_prob_by_node: AcceptProbByNode) -> float:
    """R(v; ε): product of the branch probabilities on the path from the root to v (Eq. 11)."""
    node = check_node(node)
    h = _lookup(accept_prob_by_node)
    weight = 1.0
    while node != 0:
        up = parent_of(node)
        weight *= h(up) if is_accept_child(node) else 1.0 - h(up)
        node = up
    return weight


def _reachable_part(selected: Iterable[int]) -> list[int]:
    """Nodes of ``selected`` whose strict ancestors are all selected (the ones a traversal can reach),
    in breadth-first (= heap index) order."""
    chosen = {check_node(v) for v in selected}
    reachable: set[int] = set()
    for v in sorted(chosen):
        if v == 0 or parent_of(v) in reachable:
            reachable.add(v)
    return sorted(reachable)


def reaching_weights(selected: Iterable[int], accept_prob_by_node: AcceptProbByNode) -> dict[int, float]:
    """R(v; ε) for every node of ``selected`` that a traversal can reach (Eq. 11).

    For an ancestor-closed selection that is every node. A node below an unselected one (as BFS
    produces below a deferred request) is never visited and is left out.
    """
    h = _lookup(accept_prob_by_node)
    weights: dict[int, float] = {}
    for v in _reachable_part(selected):
        if v == 0:
            weights[v] = 1.0
        else:
            up = parent_of(v)
            weights[v] = weights[up] * (h(up) if is_accept_child(v) else 1.0 - h(up))
    return weights


def expected_transitions(selected: Iterable[int], accept_prob_by_node: AcceptProbByNode) -> float:
    """F_I(v0; ε) = Σ_{v ∈ I} R(v; ε) (Lemma 1, Eq. 12).

    For a set that is not ancestor-closed this is the traversal count of Definition 1: the traversal
    stops at the first unselected node, so nodes below it contribute nothing.
    """
    return float(math.fsum(reaching_weights(selected, accept_prob_by_node).values()))


def expected_transitions_recursive(
    selected: Iterable[int], accept_prob_by_node: AcceptProbByNode, node: int = 0
) -> float:
    """F_I(v; ε) by the recursion of Lemma 2 (Eq. 13): 0 for v ∉ I, else
    1 + ĥ(v+) F_I(v+) + ĥ(v-) F_I(v-)."""
    chosen = frozenset(check_node(v) for v in selected)
    h = _lookup(accept_prob_by_node)

    def f(v: int) -> float:
        if v not in chosen:
            return 0.0
        p = h(v)
        return 1.0 + p * f(accept_child(v)) + (1.0 - p) * f(reject_child(v))

    return f(check_node(node))


# --------------------------------------------------------------------------------------------------
# Allocation result
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Allocation:
    """A set of expanded nodes (one request each) and its predicted expected transition count."""

    selected: frozenset[int]
    """I: heap indices of the expanded nodes; each issues one request, for the proposal at v+."""
    value: float
    """F̂_I(v0; ε): predicted expected number of completed MH transitions (Eq. 12 / Eq. 19)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "selected", frozenset(check_node(v) for v in self.selected))
        if not (self.value >= 0.0) or math.isinf(self.value):
            raise ValueError(f"value must be a finite non-negative number, got {self.value!r}")

    @property
    def requests(self) -> int:
        """Number of requests issued, |I| (Remark in App. C.2)."""
        return len(self.selected)

    @property
    def unreachable(self) -> frozenset[int]:
        """Selected nodes below an unselected one, which no traversal reaches (always empty for the DP's
        ancestor-closed selections)."""
        return frozenset(v for v in self.selected if not ancestors_in(v, self.selected))

    @property
    def nodes(self) -> tuple[int, ...]:
        """Selected heap indices in breadth-first order."""
        return tuple(sorted(self.selected))


# --------------------------------------------------------------------------------------------------
# Proposition 2: the dynamic program (Eq. 19)
# --------------------------------------------------------------------------------------------------


def _check_budget(budget: int) -> int:
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 0:
        raise ValueError(f"budget must be a non-negative integer (N_pf), got {budget!r}")
    return int(budget)


class _TreeView(Protocol):
    """What the DP needs to know about a node, addressed by a hashable key that determines the whole
    subtree below it (so equal keys share one memo entry)."""

    def expandable(self, key: Any) -> bool: ...

    def accept_prob(self, key: Any) -> float: ...

    def children(self, key: Any) -> tuple[Any, Any]: ...


class NodeState(NamedTuple):
    """What determines the subtree below a node when inputs are per depth: (d(v), κ(v), accepts)."""

    depth: int
    """d(v)."""
    known_cut: int
    """κ(v) = c_i, the cut of v's own state (T at the root)."""
    accepts_on_path: int
    """Number of acceptance edges from the root to v."""


class _DepthCutView:
    """Per-depth transitions: the subtree below a node depends only on (depth, κ)."""

    def __init__(self, cuts: tuple[int, ...], probs: tuple[float, ...]) -> None:
        self.cuts, self.probs = cuts, probs

    def expandable(self, key: tuple[int, int]) -> bool:
        d, kappa = key
        return d < len(self.cuts) and self.cuts[d] <= kappa

    def accept_prob(self, key: tuple[int, int]) -> float:
        return self.probs[key[0]]

    def children(self, key: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
        d, kappa = key
        return (d + 1, self.cuts[d]), (d + 1, kappa)


class _StateView:
    """Per-depth cuts with ĥ depending on the whole NodeState (e.g. a classifier with tree-position
    features); ĥ is computed once per state."""

    def __init__(
        self,
        cuts: tuple[int, ...],
        accept_prob: Callable[[NodeState], float],
        extra_condition: Callable[[NodeState], bool] | None = None,
    ) -> None:
        self.cuts, self._accept_prob, self._extra = cuts, accept_prob, extra_condition
        self._cache: dict[NodeState, float] = {}

    def expandable(self, key: NodeState) -> bool:
        if not (key.depth < len(self.cuts) and self.cuts[key.depth] <= key.known_cut):
            return False
        return self._extra is None or bool(self._extra(key))

    def accept_prob(self, key: NodeState) -> float:
        if key not in self._cache:
            self._cache[key] = _check_prob(f"accept_prob({key})", self._accept_prob(key))
        return self._cache[key]

    def children(self, key: NodeState) -> tuple[NodeState, NodeState]:
        d, kappa, a = key
        return NodeState(d + 1, self.cuts[d], a + 1), NodeState(d + 1, kappa, a)


class _CallbackView:
    """Explicit heap indices with user callbacks (small trees: no sharing between nodes)."""

    def __init__(self, expandable: Callable[[int], bool], accept_prob: Callable[[int], float], max_depth: int | None):
        self._expandable, self._accept_prob, self.max_depth = expandable, accept_prob, max_depth

    def expandable(self, key: int) -> bool:
        if self.max_depth is not None and node_depth(key) >= self.max_depth:
            return False
        return bool(self._expandable(key))

    def accept_prob(self, key: int) -> float:
        return _check_prob(f"accept_prob({key})", self._accept_prob(key))

    def children(self, key: int) -> tuple[int, int]:
        return accept_child(key), reject_child(key)


class _Solver:
    """V(v, b; ε) for b = 0..budget-depth, memoised per key (Eq. 19), with argmax reconstruction."""

    def __init__(self, view: _TreeView, budget: int) -> None:
        self.view, self.budget = view, budget
        self.memo: dict[tuple[Hashable, int], np.ndarray] = {}

    def values(self, key: Hashable, depth: int) -> np.ndarray:
        """V(key, b) for b = 0..budget - depth (a selection of b nodes below depth d can reach depth
        d + b - 1 only, so deeper budgets are never needed)."""
        size = max(0, self.budget - depth) + 1
        memo_key = (key, depth)
        cached = self.memo.get(memo_key)
        if cached is not None:
            return cached
        out = np.zeros(size)
        if size > 1 and self.view.expandable(key):
            h = self.view.accept_prob(key)
            acc_key, rej_key = self.view.children(key)
            acc = h * self.values(acc_key, depth + 1)  # length size - 1: budgets 0..size-2
            rej = (1.0 - h) * self.values(rej_key, depth + 1)
            # out[b] = 1 + max_{0<=m<=b-1} acc[m] + rej[b-1-m]  (a (max, +) convolution)
            out[1:] = 1.0 + np.max(acc[None, :] + _shifted(rej), axis=1)
        self.memo[memo_key] = out
        return out

    def reconstruct(self, key: Hashable, node: int, budget: int, into: set[int]) -> None:
        """Add to ``into`` a smallest selection below ``node`` that attains V(key, budget)."""
        depth = node_depth(node)
        vals = self.values(key, depth)
        budget = min(budget, len(vals) - 1)
        if budget <= 0 or vals[budget] <= 0.0:
            return
        budget = _smallest_budget(vals, budget)
        into.add(node)
        h = self.view.accept_prob(key)
        acc_key, rej_key = self.view.children(key)
        acc = h * self.values(acc_key, depth + 1)
        rej = (1.0 - h) * self.values(rej_key, depth + 1)
        target = vals[budget] - 1.0
        best: tuple[int, int] | None = None
        for m in range(budget):
            total = acc[m] + rej[budget - 1 - m]
            if total >= target - _VALUE_TOL * max(1.0, abs(target)):
                m_min = _smallest_budget(acc, m)
                r_min = _smallest_budget(rej, budget - 1 - m)
                if best is None or m_min + r_min < best[0] + best[1]:
                    best = (m_min, r_min)
        assert best is not None  # the maximiser of Eq. 19 always qualifies
        self.reconstruct(acc_key, accept_child(node), best[0], into)
        self.reconstruct(rej_key, reject_child(node), best[1], into)


def _feasible_nodes(view: _TreeView, root: Hashable, limit: int) -> int:
    """How many nodes below `root` can be expanded, at most `limit`.  No selection holds more, so V(root, b) is
    flat beyond it: the DP's tables need no larger budget (an N_pf of 10^5 asked for 10^5 x 10^5 matrices on a
    tree of 2^10 - 1 nodes, a MemoryError or the machine's memory)."""
    memo: dict[Hashable, int] = {}

    def count(key: Hashable) -> int:
        if key not in memo:
            memo[key] = 0
            if view.expandable(key):
                acc, rej = view.children(key)
                memo[key] = min(limit, 1 + count(acc) + count(rej))
        return memo[key]

    return count(root)


def _shifted(rej: np.ndarray) -> np.ndarray:
    """Matrix S with S[b-1, m] = rej[b-1-m] for m <= b-1 and -inf above the diagonal."""
    n = len(rej)
    idx = np.arange(n)[:, None] - np.arange(n)[None, :]
    return np.where(idx >= 0, rej[np.clip(idx, 0, None)], -np.inf)


def _smallest_budget(vals: np.ndarray, budget: int) -> int:
    """Smallest b' <= budget with vals[b'] equal (within tolerance) to vals[budget]."""
    target = vals[budget]
    tol = _VALUE_TOL * max(1.0, abs(float(target)))
    for b in range(budget + 1):
        if vals[b] >= target - tol:
            return b
    return budget


def optimal_allocation(
    request_cuts: Sequence[int], horizon: int, accept_prob: Sequence[float], budget: int
) -> Allocation:
    """Predictive traversal rule: the selection maximising Eq. 17, by the DP of Proposition 2 (Eq. 19).

    ``request_cuts[d]`` is the cut c_j of the request made when expanding a node at depth d (all
    nodes at depth d share the transition), in [0, T]; ``len(request_cuts)`` is the depth cap K'.
    ``accept_prob[d]`` is ĥ(v+; ε) (Eq. 14) for a node at depth d; ``budget`` is N_pf.

    Because cuts and ĥ depend only on depth, V depends on a node only through (depth, κ), and κ at
    depth d is T or one of request_cuts[:d]; memoising over (depth, κ, b) makes the DP
    O(min(K', N_pf)^2 · N_pf^2) instead of exponential in K'. Among optimal selections the returned
    one issues the fewest requests (no request is spent where it adds no predicted transition).
    """
    cuts = check_request_cuts(request_cuts, horizon)
    budget = _check_budget(budget)
    if len(accept_prob) < len(cuts):
        raise ValueError(
            f"accept_prob has {len(accept_prob)} entries but request_cuts has {len(cuts)}: one ĥ per depth is needed"
        )
    probs = tuple(_check_prob(f"accept_prob[{d}]", p) for d, p in enumerate(accept_prob[: len(cuts)]))
    view, root = _DepthCutView(cuts, probs), (0, int(horizon))
    budget = _feasible_nodes(view, root, budget)
    solver = _Solver(view, budget)
    value = float(solver.values(root, 0)[budget])
    selected: set[int] = set()
    solver.reconstruct(root, 0, budget, selected)
    return Allocation(selected=frozenset(selected), value=value)


def optimal_allocation_by_state(
    request_cuts: Sequence[int],
    horizon: int,
    accept_prob: Callable[[NodeState], float],
    budget: int,
    *,
    expandable: Callable[[NodeState], bool] | None = None,
) -> Allocation:
    """Proposition 2 (Eq. 19) with per-depth request cuts and ĥ(v+; ε) = ``accept_prob(state)``
    depending on the node only through ``NodeState(depth, known_cut, accepts_on_path)``.

    This is the DP for a classifier whose features include tree position (App. E.7, Feature 2);
    it memoises over the states, O(min(K', N_pf)^3) of them, instead of the 2^K' heap nodes.
    ``expandable`` adds a condition to Condition 1 and the depth cap, e.g. for a cut law that
    depends on the state (EntropyCut), where only nodes still holding the root's state can be
    expanded now: ``expandable=lambda s: s.accepts_on_path == 0``.
    """
    cuts = check_request_cuts(request_cuts, horizon)
    budget = _check_budget(budget)
    view, root = _StateView(cuts, accept_prob, expandable), NodeState(0, int(horizon), 0)
    budget = _feasible_nodes(view, root, budget)
    solver = _Solver(view, budget)
    value = float(solver.values(root, 0)[budget])
    selected: set[int] = set()
    solver.reconstruct(root, 0, budget, selected)
    return Allocation(selected=frozenset(selected), value=value)


def optimal_allocation_general(
    is_candidate: Callable[[int], bool],
    accept_prob: Callable[[int], float],
    budget: int,
    max_depth: int | None = None,
) -> Allocation:
    """Proposition 2 (Eq. 19) over explicit heap indices, for trees whose inputs vary per node.

    ``is_candidate(i)`` says whether node i may be expanded (Condition 1 and the depth cap; the DP only
    asks about nodes whose ancestors are expandable, so "expandable" suffices); ``accept_prob(i)`` is
    ĥ(v+; ε) at node i. ``max_depth`` optionally caps the depth (K'). The work grows like 2^budget:
    use it for small trees only.
    """
    budget = _check_budget(budget)
    solver = _Solver(_CallbackView(is_candidate, accept_prob, max_depth), budget)
    value = float(solver.values(0, 0)[budget])
    selected: set[int] = set()
    solver.reconstruct(0, 0, budget, selected)
    return Allocation(selected=frozenset(selected), value=value)
