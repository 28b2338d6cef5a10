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


@pytest.mark.parametrize("dependent", [False, True])
def test_bfs_is_the_tree_modules_bfs(dependent):
    rng = random.Random(0)
    for _ in range(30):
        T, cap, budget = rng.randint(2, 30), rng.randint(1, 10), rng.randint(1, 15)
        cuts = [rng.randrange(T) for _ in range(cap)]
        plan = plan_prefetch(cuts, T, budget, cap, state_dependent_cut=dependent)
        assert plan == bfs_collect(cuts, T, budget, cap, state_dependent_cut=dependent)
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
        plan = plan_prefetch(cuts, T, budget, traversal="predictive", branch_prob=h)
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

        plan = plan_prefetch(cuts, T, budget, traversal="predictive", branch_prob=h, tree_position=True)
        ref = optimal_allocation_general(lambda v: is_expandable(v, cuts, T), by_heap_node, budget,
                                         max_depth=len(cuts))
        assert math.isclose(plan.predicted_transitions, ref.value, rel_tol=1e-9)
        assert math.isclose(expected_transitions(plan.expanded, by_heap_node), ref.value, rel_tol=1e-9)


def test_predictive_with_a_state_dependent_cut_expands_the_rejection_spine_only():
    cuts, T = [4, 3, 2, 1, 0], 5
    seen: list[CandidateNode] = []

    def h(node: CandidateNode) -> float:
        seen.append(node)
        return [0.3, 0.4, 0.5, 0.6, 0.7][node.depth]

    plan = plan_prefetch(cuts, T, 4, traversal="predictive", branch_prob=h, state_dependent_cut=True)
    assert plan.expanded == frozenset({0, 2, 6, 14})
    assert [r.cut for r in plan.requests] == cuts[:4]  # the real cuts, drawn from the root's law
    assert math.isclose(plan.predicted_transitions, 1 + 0.7 + 0.7 * 0.6 + 0.7 * 0.6 * 0.5)
    assert all(n.parent_cut == T and n.accepts_on_path == 0 for n in seen)


def test_depth_features_reach_the_node_and_bad_input_is_named():
    got = []
    plan_prefetch([3, 2], 5, 2, traversal="predictive", depth_features={"loglik": [0.5, -1.0]},
                  branch_prob=lambda n: got.append(n.values()) or 0.5)
    assert [v["loglik"] for v in got] == [0.5, -1.0] and got[0]["cut_fraction"] == 3 / 5
    with pytest.raises(ValueError, match="traversal"):
        plan_prefetch([3], 5, 1, traversal="dfs")
    with pytest.raises(ValueError, match="branch_prob"):
        plan_prefetch([3], 5, 1, traversal="predictive")
    with pytest.raises(ValueError, match="'loglik'"):
        plan_prefetch([3, 2], 5, 2, traversal="predictive", branch_prob=lambda n: 0.5, depth_features={"loglik": [1.0]})
    with pytest.raises(ValueError, match=r"request_cuts\[1\]"):
        plan_prefetch([3, 6], 5, 2, traversal="predictive", branch_prob=lambda n: 0.5)
