"""The one planner of a prefetch round: BFS, or the DP of Proposition 2 with ĥ from the candidate's features."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from forerun.programs.allocation import expected_transitions, optimal_allocation, optimal_allocation_general
from forerun.programs.prefetch_tree import (
    accepts_on_path,
    bfs_collect,
    is_expandable,
    known_cut,
    node_depth,
)
from forerun.programs.traversal import CandidateNode, plan_prefetch


@pytest.mark.parametrize("unit", ["node", "request"])
def test_bfs_is_the_tree_modules_bfs(unit):
    rng = random.Random(0)
    for _ in range(30):
        T, cap, budget = rng.randint(2, 30), rng.randint(1, 10), rng.randint(1, 15)
        cuts = [rng.randrange(T) for _ in range(cap)]
        if unit == "node":
            plan = plan_prefetch(cuts, T, budget, cap, budget_unit="node")
            assert plan == bfs_collect(cuts, T, budget, cap)
        else:
            costs = [rng.choice([0, 1, 2]) for _ in range(cap)]
            plan = plan_prefetch(cuts, T, budget, cap, depth_costs=costs, max_nodes=40)
            assert plan == bfs_collect(cuts, T, budget, cap, depth_costs=costs, max_nodes=40)
        assert plan.predicted_transitions is None


def test_predictive_per_depth_is_the_dp_with_the_nodes_cut_fraction():
    rng = np.random.default_rng(0)
    seen: list[CandidateNode] = []

    def h(node: CandidateNode) -> float:
        seen.append(node)
        return 0.1 + 0.8 * node.cut_fraction

    for _ in range(20):
        T = int(rng.integers(2, 40))
        cuts = [int(c) for c in rng.integers(0, T, size=int(rng.integers(1, 9)))]
        budget = int(rng.integers(1, 10))
        plan = plan_prefetch(cuts, T, budget, traversal="predictive", branch_prob=h, budget_unit="node")
        ref = optimal_allocation(cuts, T, [0.1 + 0.8 * (c / T) for c in cuts], budget)
        assert plan.expanded == ref.selected and plan.predicted_transitions == ref.value
        assert not plan.unreachable
        for r in plan.requests:
            assert r.cut == cuts[r.depth] <= r.parent_cut == known_cut(r.parent, cuts, T)
    assert all(n.parent_cut is None and n.accepts_on_path is None for n in seen)  # per depth: no position


def test_predictive_with_tree_position_equals_the_dp_over_heap_nodes():
    rng = np.random.default_rng(1)
    for _ in range(20):
        T = int(rng.integers(4, 30))
        cuts = sorted((int(c) for c in rng.integers(0, T, size=int(rng.integers(1, 6)))), reverse=True)
        budget = int(rng.integers(1, 7))

        def h(node: CandidateNode) -> float:
            return 1 / (1 + math.exp(node.cut_fraction - 0.1 * node.accepts_on_path + 0.02 * node.parent_cut))

        def by_heap_node(v: int) -> float:
            d = node_depth(v)
            return h(CandidateNode(d, cuts[d], T, known_cut(v, cuts, T), accepts_on_path(v)))

        plan = plan_prefetch(cuts, T, budget, traversal="predictive", branch_prob=h, tree_position=True,
                             budget_unit="node")
        ref = optimal_allocation_general(lambda v: is_expandable(v, cuts, T), by_heap_node, budget,
                                         max_depth=len(cuts))
        assert math.isclose(plan.predicted_transitions, ref.value, rel_tol=1e-9)
        assert math.isclose(expected_transitions(plan.expanded, by_heap_node), ref.value, rel_tol=1e-9)


def test_predictive_by_request_takes_whole_depths_and_sees_tree_positions():
    cuts, T = [4, 3, 2, 1, 0], 5  # decreasing cuts: every node is a candidate
    seen: list[CandidateNode] = []

    def h(node: CandidateNode) -> float:
        seen.append(node)
        return [0.3, 0.4, 0.5, 0.6, 0.7][node.depth]

    plan = plan_prefetch(cuts, T, 3, traversal="predictive", branch_prob=h)
    assert plan.depths == {0, 1, 2} and plan.expanded == frozenset(range(7))  # all 7 nodes above depth 3
    assert math.isclose(plan.predicted_transitions, 1 + 1 + 1)  # Σ R over full levels = depths
    assert {(n.depth, n.parent_cut, n.accepts_on_path) for n in seen} >= {(1, 4, 1), (1, 5, 0), (2, 3, 2)}
    # a call overhead κ0 trades depth for a cheaper call when deep nodes are unlikely to be reached
    unlikely = plan_prefetch(cuts, T, 5, traversal="predictive", branch_prob=lambda n: 0.999, max_nodes=3,
                             call_overhead=0.5)
    assert unlikely.depths == {0, 1, 2} and unlikely.expanded == {0, 1, 3}  # the accept spine only
    # increasing cuts: below an acceptance Condition 1 fails, F̂(m) = Σ_{d<m} 0.5^d = 2 (1 − 0.5^m);
    # F̂ / (κ0 + m) peaks at m = 1 for κ0 = 0.5 and at m = 3 for κ0 = 10 (1/11, 1.5/12, 1.75/13, 1.875/14)
    rising = [1, 2, 3, 4, 4]
    for kappa0, depths in ((0.5, {0}), (10.0, {0, 1, 2}), (None, {0, 1, 2, 3, 4})):
        plan = plan_prefetch(rising, T, 5, traversal="predictive", branch_prob=lambda n: 0.5, call_overhead=kappa0)
        assert plan.depths == depths, kappa0


def test_depth_features_reach_the_node_and_bad_input_is_named():
    got = []
    plan_prefetch([3, 2], 5, 2, traversal="predictive", depth_features={"loglik": [0.5, -1.0]},
                  branch_prob=lambda n: got.append(n.values()) or 0.5, budget_unit="node")
    assert [v["loglik"] for v in got] == [0.5, -1.0] and got[0]["cut_fraction"] == 3 / 5
    with pytest.raises(ValueError, match="traversal"):
        plan_prefetch([3], 5, 1, traversal="dfs")
    with pytest.raises(ValueError, match="budget_unit"):
        plan_prefetch([3], 5, 1, budget_unit="token")
    with pytest.raises(ValueError, match="branch_prob"):
        plan_prefetch([3], 5, 1, traversal="predictive")
    with pytest.raises(ValueError, match="'loglik'"):
        plan_prefetch([3, 2], 5, 2, traversal="predictive", branch_prob=lambda n: 0.5, depth_features={"loglik": [1.0]})
    with pytest.raises(ValueError, match=r"request_cuts\[1\]"):
        plan_prefetch([3, 6], 5, 2, traversal="predictive", branch_prob=lambda n: 0.5)
