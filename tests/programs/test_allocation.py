"""Tests for the predictive traversal rule: Lemma 1/2, Eq. 14, the DP of Proposition 2, BFS (prefetch_tree)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from forerun.programs.allocation import (
    Allocation,
    branch_prob_accept,
    depth_accept_probs,
    expected_transitions,
    expected_transitions_recursive,
    NodeState,
    optimal_allocation,
    optimal_allocation_by_state,
    optimal_allocation_general,
    reaching_weight,
    reaching_weights,
)
from forerun.programs.prefetch_tree import (
    accept_child,
    bfs_collect,
    candidate_nodes,
    is_candidate,
    is_expandable,
    known_cut,
    node_depth,
    parent_of,
    reject_child,
)


# ------------------------------------------------------------------------------------------------
# oracles
# ------------------------------------------------------------------------------------------------


def ancestor_closed_sets(candidates: frozenset[int], max_size: int) -> set[frozenset[int]]:
    """All ancestor-closed subsets of ``candidates`` with at most ``max_size`` nodes, by growing
    sets one node at a time (a node may join once its parent is in the set)."""
    found: set[frozenset[int]] = {frozenset()}
    layer: set[frozenset[int]] = {frozenset()}
    for _ in range(max_size):
        nxt: set[frozenset[int]] = set()
        for s in layer:
            for v in candidates:
                if v in s:
                    continue
                if v == 0 or parent_of(v) in s:
                    nxt.add(s | {v})
        nxt -= found
        found |= nxt
        layer = nxt
    return found


def brute_force_best(cuts, horizon, probs, budget) -> float:
    cands = candidate_nodes(cuts, horizon)
    h = depth_accept_probs(probs)
    return max(expected_transitions(s, h) for s in ancestor_closed_sets(cands, budget))


def random_instance(rng: np.random.Generator, max_depth: int = 5, max_budget: int = 6):
    depth = int(rng.integers(1, max_depth + 1))
    horizon = int(rng.integers(2, 12))
    cuts = [int(c) for c in rng.integers(0, horizon, size=depth)]
    probs = [float(p) for p in rng.random(depth)]
    # occasionally exact 0 / 1 branch probabilities (rounded certain decisions)
    for d in range(depth):
        if rng.random() < 0.15:
            probs[d] = float(rng.integers(0, 2))
    budget = int(rng.integers(0, max_budget + 1))
    return cuts, horizon, probs, budget


# ------------------------------------------------------------------------------------------------
# tree helpers and Condition 1
# ------------------------------------------------------------------------------------------------


def test_heap_helpers():
    assert [node_depth(i) for i in range(8)] == [0, 1, 1, 2, 2, 2, 2, 3]
    assert accept_child(0) == 1 and reject_child(0) == 2 and accept_child(2) == 5
    assert parent_of(5) == 2 and parent_of(1) == 0
    with pytest.raises(ValueError, match="root"):
        parent_of(0)
    with pytest.raises(ValueError, match="node"):
        node_depth(-1)


def test_known_cut_follows_convention():
    cuts, T = [5, 3, 4], 10
    assert known_cut(0, cuts, T) == T
    assert known_cut(1, cuts, T) == 5  # accept child of root: request_cuts[0]
    assert known_cut(2, cuts, T) == T  # reject child keeps the root's κ
    assert known_cut(3, cuts, T) == 3  # accept child of node 1 (depth 1)
    assert known_cut(4, cuts, T) == 5  # reject child of node 1 keeps κ(1)
    assert known_cut(6, cuts, T) == T
    assert known_cut(10, cuts, T) == 5  # 10 = reject child of 4


def test_condition_1_and_candidates_are_ancestor_closed():
    cuts, T = [5, 6, 2], 10
    # depth 1 request cut 6 > κ(1) = 5: node 1 is not expandable; node 2 (κ = T) is.
    assert is_expandable(0, cuts, T)
    assert not is_expandable(1, cuts, T)
    assert is_expandable(2, cuts, T)
    # node 3 (below the non-candidate 1) is expandable on its own (2 <= κ(3) = 6) but no candidate
    assert is_expandable(3, cuts, T) and not is_candidate(3, cuts, T)
    cands = candidate_nodes(cuts, T)
    assert cands == frozenset({0, 2, 5, 6})
    for v in cands:
        assert v == 0 or parent_of(v) in cands
    # depth cap K' = len(request_cuts)
    assert all(node_depth(v) < len(cuts) for v in cands)
    assert not is_expandable(7, cuts, T)


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match=r"request_cuts\[1\]"):
        optimal_allocation([1, 11], 10, [0.5, 0.5], 3)
    with pytest.raises(ValueError, match=r"request_cuts\[0\]"):
        optimal_allocation([-1], 10, [0.5], 3)
    with pytest.raises(ValueError, match="horizon"):
        optimal_allocation([1], 0, [0.5], 3)
    with pytest.raises(ValueError, match="budget"):
        optimal_allocation([1], 5, [0.5], -1)
    with pytest.raises(ValueError, match=r"accept_prob\[0\]"):
        optimal_allocation([1], 5, [1.5], 2)
    with pytest.raises(ValueError, match="one ĥ per depth"):
        optimal_allocation([1, 1], 5, [0.5], 2)
    with pytest.raises(ValueError, match="value"):
        Allocation(selected=frozenset({0}), value=-1.0)


# ------------------------------------------------------------------------------------------------
# Eq. 14
# ------------------------------------------------------------------------------------------------


def test_branch_prob_accept_midpoint():
    assert branch_prob_accept(0.0, 1.0) == 1.0
    assert branch_prob_accept(1.0, 0.0) == 0.0
    assert branch_prob_accept(0.0, 0.0) == 0.5  # all mass uncertain -> midpoint
    assert math.isclose(branch_prob_accept(0.2, 0.3), 0.5 * (1 + 0.3 - 0.2))
    with pytest.raises(ValueError, match="at most 1"):
        branch_prob_accept(0.7, 0.6)
    with pytest.raises(ValueError, match="p_accept"):
        branch_prob_accept(0.1, -0.1)


def test_branch_prob_accept_is_lemma3_midpoint():
    """ĥ is the midpoint of the Lemma 3 interval [P_acc + ε P_unc, P_acc + (1-ε) P_unc]."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        p = rng.dirichlet([1, 1, 1])
        p_rej, p_acc, p_unc = p
        eps = float(rng.uniform(0, 0.5))
        lo, hi = p_acc + eps * p_unc, p_acc + (1 - eps) * p_unc
        assert math.isclose(branch_prob_accept(p_rej, p_acc), 0.5 * (lo + hi), abs_tol=1e-12)


# ------------------------------------------------------------------------------------------------
# Lemma 1 / Lemma 2
# ------------------------------------------------------------------------------------------------


def test_reaching_weights_product_of_branches():
    h = {0: 0.8, 1: 0.3, 2: 0.6, 4: 0.5}
    assert reaching_weight(0, h) == 1.0
    assert math.isclose(reaching_weight(4, h), 0.8 * 0.7)
    assert math.isclose(reaching_weight(10, h), 0.8 * 0.7 * 0.5)
    w = reaching_weights({0, 1, 4}, h)
    assert w == pytest.approx({0: 1.0, 1: 0.8, 4: 0.8 * 0.7})


def test_lemma1_equals_lemma2_on_random_sets():
    rng = np.random.default_rng(1)
    for _ in range(200):
        depth = int(rng.integers(1, 6))
        nodes = range(2**depth - 1)
        probs = {v: float(rng.random()) for v in nodes}
        # random subset: not necessarily ancestor-closed (Lemma 2 holds for any set)
        subset = {v for v in nodes if rng.random() < 0.6}
        f1 = expected_transitions(subset, probs)
        f2 = expected_transitions_recursive(subset, probs)
        assert math.isclose(f1, f2, rel_tol=1e-12, abs_tol=1e-12)


def test_expected_transitions_matches_monte_carlo_traversal():
    """Definition 1 directly: simulate traversals and count the selected nodes they visit."""
    rng = np.random.default_rng(2)
    probs = {v: float(rng.random()) for v in range(15)}
    selected = {0, 1, 2, 3, 5, 7, 12, 13}  # 13 = accept child of the unselected 6: never visited
    exact = expected_transitions(selected, probs)
    counts = []
    for _ in range(20000):
        v, c = 0, 0
        while v in selected:
            c += 1
            v = accept_child(v) if rng.random() < probs[v] else reject_child(v)
        counts.append(c)
    assert abs(np.mean(counts) - exact) < 4 * np.std(counts) / math.sqrt(len(counts)) + 1e-9


def test_empty_selection_has_zero_value():
    assert expected_transitions(set(), {}) == 0.0
    assert expected_transitions_recursive(set(), {}) == 0.0


# ------------------------------------------------------------------------------------------------
# Proposition 2: the DP
# ------------------------------------------------------------------------------------------------


def test_dp_equals_brute_force_on_random_instances():
    rng = np.random.default_rng(3)
    for _ in range(150):
        cuts, T, probs, budget = random_instance(rng)
        alloc = optimal_allocation(cuts, T, probs, budget)
        best = brute_force_best(cuts, T, probs, budget)
        assert math.isclose(alloc.value, best, rel_tol=1e-9, abs_tol=1e-12), (cuts, T, probs, budget)


def test_dp_selection_is_feasible_and_attains_its_value():
    rng = np.random.default_rng(4)
    for _ in range(150):
        cuts, T, probs, budget = random_instance(rng)
        alloc = optimal_allocation(cuts, T, probs, budget)
        assert alloc.requests <= budget
        assert not alloc.unreachable
        for v in alloc.selected:
            assert is_candidate(v, cuts, T), "Condition 1 / depth cap violated"
            assert v == 0 or parent_of(v) in alloc.selected, "not ancestor-closed"
        h = depth_accept_probs(probs)
        assert math.isclose(expected_transitions(alloc.selected, h), alloc.value, rel_tol=1e-9, abs_tol=1e-12)
        assert math.isclose(
            expected_transitions_recursive(alloc.selected, h), alloc.value, rel_tol=1e-9, abs_tol=1e-12
        )


def test_dp_budget_monotone():
    rng = np.random.default_rng(5)
    for _ in range(40):
        cuts, T, probs, _ = random_instance(rng, max_depth=7)
        values = [optimal_allocation(cuts, T, probs, b).value for b in range(0, 10)]
        assert values[0] == 0.0
        assert all(b >= a - 1e-12 for a, b in zip(values, values[1:]))


def test_dp_spends_no_request_without_value():
    # ĥ = 1 at the root: the rejection subtree (node 2 and below) is never reached, so the DP must not
    # spend requests there even though the budget would allow it.
    alloc = optimal_allocation([3, 2, 1, 0], 10, [1.0, 0.5, 0.5, 0.5], 10)
    assert alloc.selected == frozenset({0, 1, 3, 4, 7, 8, 9, 10})
    assert math.isclose(alloc.value, 1 + 1 + 2 * 0.5 + 4 * 0.25)


def test_general_variant_matches_depth_variant():
    rng = np.random.default_rng(6)
    for _ in range(60):
        cuts, T, probs, budget = random_instance(rng)
        fast = optimal_allocation(cuts, T, probs, budget)
        h = depth_accept_probs(probs)
        general = optimal_allocation_general(
            lambda i: is_expandable(i, cuts, T), h, budget, max_depth=len(cuts)
        )
        assert math.isclose(fast.value, general.value, rel_tol=1e-12, abs_tol=1e-12)
        assert math.isclose(expected_transitions(general.selected, h), general.value, rel_tol=1e-9, abs_tol=1e-12)


def test_general_variant_with_per_node_probabilities_equals_brute_force():
    rng = np.random.default_rng(7)
    for _ in range(60):
        depth = int(rng.integers(1, 5))
        nodes = list(range(2**depth - 1))
        probs = {v: float(rng.random()) for v in nodes}
        expandable = {v for v in nodes if rng.random() < 0.8}
        budget = int(rng.integers(0, 6))
        alloc = optimal_allocation_general(lambda i: i in expandable, lambda i: probs[i], budget, max_depth=depth)
        cands = frozenset(v for v in expandable if all(a in expandable for a in _ancestors(v)))
        best = max(expected_transitions(s, probs) for s in ancestor_closed_sets(cands, budget))
        assert math.isclose(alloc.value, best, rel_tol=1e-9, abs_tol=1e-12)
        assert alloc.selected <= cands


def node_state(v: int, cuts, T) -> NodeState:
    accepts, u = 0, v
    while u:
        accepts += u % 2
        u = parent_of(u)
    return NodeState(node_depth(v), known_cut(v, cuts, T), accepts)


def test_by_state_variant_equals_brute_force():
    rng = np.random.default_rng(10)
    for _ in range(80):
        cuts, T, _, budget = random_instance(rng)
        table: dict = {}

        def h(state: NodeState) -> float:
            if state not in table:
                table[state] = float(rng.random())
            return table[state]

        alloc = optimal_allocation_by_state(cuts, T, h, budget)
        per_node = lambda v: h(node_state(v, cuts, T))  # noqa: E731
        cands = candidate_nodes(cuts, T)
        best = max((expected_transitions(s, per_node) for s in ancestor_closed_sets(cands, budget)), default=0.0)
        assert math.isclose(alloc.value, best, rel_tol=1e-9, abs_tol=1e-12)
        assert alloc.selected <= cands
        assert math.isclose(expected_transitions(alloc.selected, per_node), alloc.value, rel_tol=1e-9, abs_tol=1e-12)


def test_by_state_with_depth_only_probabilities_equals_per_depth_dp():
    rng = np.random.default_rng(11)
    for _ in range(40):
        cuts, T, probs, budget = random_instance(rng, max_depth=8, max_budget=8)
        a = optimal_allocation(cuts, T, probs, budget)
        b = optimal_allocation_by_state(cuts, T, lambda s: probs[s.depth], budget)
        assert math.isclose(a.value, b.value, rel_tol=1e-12, abs_tol=1e-12)


def test_by_state_extra_condition_restricts_candidates():
    # a state-dependent cut law: only nodes still holding the root's state (no acceptance on the
    # path) can be expanded now -> the rejection spine 0, 2, 6, 14, ...
    cuts, T, probs = [4, 3, 2, 1, 0], 5, [0.3, 0.4, 0.5, 0.6, 0.7]
    alloc = optimal_allocation_by_state(
        cuts, T, lambda s: probs[s.depth], 4, expandable=lambda s: s.accepts_on_path == 0
    )
    assert alloc.selected == frozenset({0, 2, 6, 14})
    assert math.isclose(alloc.value, 1 + 0.7 + 0.7 * 0.6 + 0.7 * 0.6 * 0.5)


def test_cut_equal_to_horizon_is_feasible_only_where_kappa_is_T():
    # request cut T at depth 1 is feasible below the root's rejection child (κ = T), not below v+
    cands = candidate_nodes([3, 5], 5)
    assert cands == frozenset({0, 2})


def _ancestors(v: int) -> list[int]:
    out = []
    while v:
        v = parent_of(v)
        out.append(v)
    return out


def test_dp_is_polynomial_at_depth_cap_100_budget_20():
    rng = np.random.default_rng(8)
    T = 4096
    cuts = sorted((int(c) for c in rng.integers(0, T, size=100)), reverse=True)  # all feasible
    probs = [float(p) for p in rng.uniform(0.05, 0.95, size=100)]
    alloc = optimal_allocation(cuts, T, probs, 20)
    assert alloc.requests == 20
    assert math.isclose(expected_transitions(alloc.selected, depth_accept_probs(probs)), alloc.value, rel_tol=1e-9)
    # random cuts at depth 100 as well (many distinct κ)
    cuts2 = [int(c) for c in rng.integers(0, T, size=100)]
    alloc2 = optimal_allocation(cuts2, T, probs, 20)
    assert all(is_candidate(v, cuts2, T) for v in alloc2.selected)


# ------------------------------------------------------------------------------------------------
# BFS
# ------------------------------------------------------------------------------------------------


def bfs_expanded(cuts, horizon, budget) -> frozenset[int]:
    """The nodes the paper's BFS (prefetch_tree.bfs_collect, depth cap K' = len(cuts)) expands."""
    return bfs_collect(cuts, horizon, budget, len(cuts)).expanded if budget else frozenset()


def test_bfs_order_follows_paper():
    # all feasible: BFS takes heap indices 0, 1, 2, 3, ... (level order)
    plan = bfs_collect([9, 8, 7, 6], 10, 5, 4)
    assert sorted(plan.expanded) == [0, 1, 2, 3, 4]
    assert not plan.unreachable


def test_bfs_enqueues_reject_child_of_deferred_node():
    # depth-1 cut 6 > κ(1) = 5: node 1 defers; its rejection child 4 is still enqueued and expanded
    # at depth 2 (cut 2 <= κ(4) = 5), a request the walk never reaches.
    plan = bfs_collect([5, 6, 2], 10, 10, 3)
    assert 1 not in plan.expanded
    assert 4 in plan.expanded and 4 in plan.unreachable
    assert 3 not in plan.expanded  # accept child of a deferred node is not enqueued
    # predictive never selects below a deferred node
    pred = optimal_allocation([5, 6, 2], 10, [0.5, 0.5, 0.5], 10)
    assert not (pred.selected & plan.unreachable)


def test_predictive_beats_bfs_when_accepts_are_likely():
    # every request feasible, acceptance very likely: the DP goes deep along the acceptance chain,
    # BFS spreads its budget over rejection branches that are rarely reached.
    cuts, T, probs, budget = [9, 8, 7, 6, 5, 4, 3, 2], 10, [0.95] * 8, 6
    pred = optimal_allocation(cuts, T, probs, budget)
    bfs = expected_transitions(bfs_expanded(cuts, T, budget), depth_accept_probs(probs))
    assert pred.value > bfs + 1.0
    assert pred.nodes == (0, 1, 3, 7, 15, 31)


def test_predictive_never_worse_than_bfs():
    rng = np.random.default_rng(9)
    for _ in range(200):
        cuts, T, probs, budget = random_instance(rng, max_depth=6, max_budget=8)
        pred = optimal_allocation(cuts, T, probs, budget)
        bfs = bfs_expanded(cuts, T, budget)
        assert len(bfs) <= budget
        assert pred.value >= expected_transitions(bfs, depth_accept_probs(probs)) - 1e-12


@pytest.mark.parametrize("cuts,T", [((3, 5, 2, 6), 8), ((7, 6, 5, 4, 3, 2), 8)])
def test_a_budget_beyond_the_tree_selects_every_candidate_without_budget_sized_tables(cuts, T):
    """`sample --presto --traversal predictive --budget-unit node --npf 100000` (and `classifier ceiling --npf`)
    ended in a MemoryError (74.5 GiB for one 10^5 x 10^5 table) or used up the machine's memory: the DP sized its
    tables by N_pf, not by the few nodes the tree has.  With every ĥ in (0, 1) each candidate adds predicted
    transitions, so a budget that covers I_max selects all of it."""
    probs = [0.3, 0.6, 0.5, 0.8, 0.4, 0.7][:len(cuts)]
    everything = candidate_nodes(cuts, T)
    for alloc in (optimal_allocation(cuts, T, probs, 10**6),
                  optimal_allocation_by_state(cuts, T, lambda s: probs[s.depth], 10**6)):
        assert alloc.selected == everything
        assert alloc.value == pytest.approx(expected_transitions(everything, depth_accept_probs(probs)))
