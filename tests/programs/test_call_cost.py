"""The allocation under the request budget (`call_cost`) against brute force on random small trees.

Brute force: every ancestor-closed selection of candidate nodes (Condition 1, depth cap) that contains the
root; its cost is the summed cost of its distinct depths (a node at an already-requested depth is free); it
is feasible when it costs at most the budget (or only its root depth's) and has at most max_nodes nodes;
its value is F̂ = Σ R(v) (Eq. 12) with ĥ depending on the node's tree position, and the objective is F̂, or
F̂ / (κ0 + cost) with a call overhead κ0.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest

from forerun.programs.allocation import NodeState, expected_transitions
from forerun.programs.call_cost import (
    affordable_depths,
    best_first_selection,
    request_budget_allocation,
    selection_cost,
)
from forerun.programs.prefetch_tree import (
    accept_child,
    accepts_on_path,
    candidate_nodes,
    known_cut,
    node_depth,
    reject_child,
)


def closed_selections(node: int, cands: frozenset[int]) -> list[frozenset[int]]:
    """Every ancestor-closed subset of the candidate subtree at `node` that contains `node`."""
    if node not in cands:
        return []
    below = [[frozenset()] + closed_selections(child, cands) for child in (accept_child(node), reject_child(node))]
    return [frozenset({node}) | a | b for a, b in itertools.product(*below)]


def brute_force(cuts, T, h_state, budget, costs, max_nodes, kappa0):
    cands = candidate_nodes(cuts, T)
    by_node = lambda v: h_state(NodeState(node_depth(v), known_cut(v, cuts, T), accepts_on_path(v)))  # noqa: E731
    best = -1.0
    for sel in closed_selections(0, cands):
        cost = sum(costs[d] for d in {node_depth(v) for v in sel})
        if len(sel) > max_nodes or not (cost <= budget or cost == costs[0]):
            continue
        value = expected_transitions(sel, by_node)
        best = max(best, value if kappa0 is None else value / (kappa0 + cost))
    return best, by_node


@pytest.mark.parametrize("seed", range(300))
def test_request_budget_allocation_matches_brute_force(seed):
    rng = random.Random(seed)
    T = rng.randint(2, 9)
    cuts = [rng.randrange(T) for _ in range(rng.randint(1, 4))]
    costs = [rng.choice([0, 1, 1, 2, 7]) for _ in cuts]
    budget = rng.randint(1, 8)
    max_nodes = rng.choice([1, 2, 3, 5, 8, 100])
    kappa0 = rng.choice([None, None, 0.5, 3.0, 10.0])
    table = {}

    def h_state(state: NodeState) -> float:  # ĥ by tree position; some exact 0 / 1
        if state not in table:
            table[state] = rng.choice([0.0, 1.0, rng.random(), rng.random(), rng.random()])
        return table[state]

    for s in itertools.product(range(len(cuts) + 1), range(T + 1), range(len(cuts) + 1)):
        h_state(NodeState(*s))
    best, by_node = brute_force(cuts, T, h_state, budget, costs, max_nodes, kappa0)
    alloc, cost = request_budget_allocation(cuts, T, h_state, budget, costs, max_nodes=max_nodes,
                                            call_overhead=kappa0)
    sel = alloc.selected
    assert 0 in sel and len(sel) <= max_nodes and sel <= candidate_nodes(cuts, T)
    assert all(v == 0 or (v - 1) // 2 in sel for v in sel)  # ancestor-closed
    assert cost == selection_cost(sel, costs) and (cost <= budget or cost == costs[0])
    assert math.isclose(alloc.value, expected_transitions(sel, by_node), rel_tol=1e-12, abs_tol=1e-12)
    got = alloc.value if kappa0 is None else alloc.value / (kappa0 + cost)
    assert math.isclose(got, best, rel_tol=1e-9, abs_tol=1e-12), (got, best)


def test_without_a_node_cap_the_optimum_is_every_candidate_above_the_affordable_depth():
    rng = random.Random(7)
    for _ in range(50):
        T = rng.randint(3, 12)
        cuts = [rng.randrange(T) for _ in range(rng.randint(1, 6))]
        costs = [1] * len(cuts)
        budget = rng.randint(1, 6)
        alloc, cost = request_budget_allocation(cuts, T, lambda s: 0.3, budget, costs)
        m = affordable_depths(costs, budget)
        assert alloc.selected == {v for v in candidate_nodes(cuts, T) if node_depth(v) < m}
        assert cost == min(m, len(cuts))


def test_best_first_takes_the_largest_reaching_weights():
    cuts, T = [3, 2, 1], 4  # decreasing: every node is a candidate
    chosen = best_first_selection(cuts, T, lambda s: 0.9, max_nodes=3, depth_cap=3)
    assert chosen == {0: 1.0, 1: 0.9, 3: 0.81}  # the accept spine beats the reject children (0.1)
    assert best_first_selection(cuts, T, lambda s: 1.0, 10, 3) == {0: 1.0, 1: 1.0, 3: 1.0}  # R = 0 left out


def test_affordable_depths_and_bad_input():
    assert affordable_depths([1, 1, 1], 2) == 2
    assert affordable_depths([7, 0, 1], 1) == 2  # the root's is always made; a free depth always fits
    assert affordable_depths([1, 0, 0, 3], 3) == 3
    with pytest.raises(ValueError, match="max_nodes"):
        request_budget_allocation([1], 2, lambda s: 0.5, 1, [1], max_nodes=0)
    with pytest.raises(ValueError, match="call_overhead"):
        request_budget_allocation([1], 2, lambda s: 0.5, 1, [1], call_overhead=0.0)
    with pytest.raises(ValueError, match="a cost for each"):
        request_budget_allocation([1, 1], 2, lambda s: 0.5, 1, [1])
    with pytest.raises(ValueError, match="probability"):
        request_budget_allocation([1], 2, lambda s: 1.5, 1, [1])
