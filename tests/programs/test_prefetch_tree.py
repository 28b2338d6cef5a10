from __future__ import annotations

import itertools
import random

import pytest

from forerun.programs.prefetch_tree import (
    accept_child,
    accepts_on_path,
    bfs_collect,
    is_feasible,
    known_cuts,
    mh_transition,
    node_depth,
    parent_of,
    path_from_root,
    plan_from_selection,
    reject_child,
)


def test_heap_indexing():
    assert accept_child(0) == 1 and reject_child(0) == 2 and accept_child(1) == 3 and reject_child(1) == 4
    for i in range(1, 200):
        assert i in (accept_child(parent_of(i)), reject_child(parent_of(i)))
        assert node_depth(i) == node_depth(parent_of(i)) + 1
    assert path_from_root(9) == [0, 1, 4, 9]
    assert accepts_on_path(9) == 2 and accepts_on_path(2) == 0  # 0->1 accept, 1->4 reject, 4->9 accept
    assert is_feasible(3, 3) and not is_feasible(4, 3)


def naive_bfs(cuts, horizon, budget, cap, costs=None, max_nodes=None):
    """Reference: the paper's BFS written with explicit node dictionaries; with `costs` a node costs its
    depth's cost the first time the depth is requested and nothing after (forerun's request unit)."""
    queue = [{"id": 0, "kappa": horizon}]
    out, paid = [], {}
    limit = budget if costs is None else max_nodes
    while queue and len(out) < limit:
        v = queue.pop(0)
        d = node_depth(v["id"])
        if d >= cap:
            continue
        c = cuts[d]
        if c <= v["kappa"]:
            if costs is not None and d not in paid:
                if d > 0 and costs[d] > 0 and sum(paid.values()) + costs[d] > budget:
                    break
                paid[d] = costs[d]
            out.append((2 * v["id"] + 1, c))
            queue.append({"id": 2 * v["id"] + 1, "kappa": c})
        queue.append({"id": 2 * v["id"] + 2, "kappa": v["kappa"]})
    return out


@pytest.mark.parametrize("seed", range(30))
def test_bfs_matches_reference_and_condition_1(seed):
    rng = random.Random(seed)
    horizon = rng.randint(2, 30)
    cap = rng.randint(1, 12)
    budget = rng.randint(1, 20)
    cuts = [rng.randrange(horizon) for _ in range(cap)]
    by_request = seed % 2 == 1
    costs = [rng.choice([0, 1, 1, 3]) for _ in range(cap)] if by_request else None
    max_nodes = rng.randint(1, 60) if by_request else None
    plan = bfs_collect(cuts, horizon, budget, cap, depth_costs=costs, max_nodes=max_nodes)
    assert [(r.node, r.cut) for r in plan.requests] == naive_bfs(cuts, horizon, budget, cap, costs, max_nodes)
    if by_request:
        assert len(plan.requests) <= max_nodes
        spent = sum(costs[d] for d in plan.depths)
        assert (spent <= budget or spent == costs[0]) and plan.depths == set(range(len(plan.depths)))
    else:
        assert len(plan.requests) <= budget
    kappa = known_cuts([r.node for r in plan.requests], cuts, horizon)
    for r in plan.requests:
        assert r.cut <= r.parent_cut == kappa[r.parent]  # Condition 1
        assert r.depth == node_depth(r.parent) < cap
    assert plan.requests[0].node == 1  # the root's request is always feasible


def test_bfs_by_request_takes_every_feasible_node_of_a_paid_depth():
    cuts, horizon = [5, 3, 4, 1], 10
    plan = bfs_collect(cuts, horizon, budget=3, depth_cap=4, depth_costs=[1, 1, 1, 1])
    assert plan.depths == {0, 1, 2}  # the 4th depth does not fit
    by_node = bfs_collect(cuts, horizon, budget=3, depth_cap=4)
    assert len(by_node.requests) == 3 < len(plan.requests)
    # every candidate node of depth < 3 (Condition 1 along its path) is in
    from forerun.programs.prefetch_tree import candidate_nodes
    assert plan.expanded == {v for v in candidate_nodes(cuts, horizon) if node_depth(v) < 3}
    # a free (already generated) depth costs nothing; the root's depth is paid even above the budget
    assert bfs_collect(cuts, horizon, 1, 4, depth_costs=[1, 0, 0, 5]).depths == {0, 1, 2}
    assert bfs_collect(cuts, horizon, 1, 4, depth_costs=[7, 0, 1, 0]).depths == {0, 1}


def test_bfs_enqueues_rejection_child_of_deferred_node():
    # depth 0 cut 5, depth 1 cut 7 (> 5: infeasible under node 1), depth 2 cut 1
    plan = bfs_collect([5, 7, 1], horizon=10, budget=10, depth_cap=3)
    nodes = [r.node for r in plan.requests]
    assert 3 in plan.deferred  # request at v3 (under v1, κ=5) deferred
    assert 9 in nodes  # the rejection child v4 of v1 was still enqueued and expanded: request at v9


def test_plan_from_selection_validates():
    plan = plan_from_selection([0, 1, 2], [3, 2], horizon=5)
    assert [r.node for r in plan.requests] == [1, 3, 5]
    with pytest.raises(ValueError, match="ancestor-closed"):
        plan_from_selection([0, 3], [3, 2, 1], horizon=5)
    with pytest.raises(ValueError, match="Condition 1"):
        plan_from_selection([0, 1], [3, 4], horizon=5)


def test_walk_follows_decisions_and_stops_at_unscored():
    table = {0: True, 1: False, 4: True}
    final, steps = mh_transition(lambda v: table.get(v), 10)
    assert [s.node for s in steps] == [0, 1, 4] and final == 9
    final, steps = mh_transition(lambda v: table.get(v), 2)
    assert final == 4 and len(steps) == 2


def test_walk_equals_sequential_decisions_on_random_trees():
    rng = random.Random(1)
    for _ in range(50):
        decisions = [rng.random() < 0.5 for _ in range(8)]
        scored = {v for v in range(255) if rng.random() < 0.8}
        final, steps = mh_transition(lambda v: decisions[node_depth(v)] if v in scored else None, 8)
        node = 0
        for d, s in enumerate(steps):
            assert s.node == node and s.accepted == decisions[d]
            node = accept_child(node) if s.accepted else reject_child(node)
        assert final == node and (len(steps) == 8 or node not in scored)


def test_bad_input():
    with pytest.raises(ValueError, match="budget"):
        bfs_collect([1], 4, 0, 1)
    with pytest.raises(ValueError, match="depth_cap"):
        bfs_collect([1], 4, 1, 0)
    with pytest.raises(ValueError, match="root"):
        parent_of(0)


def naive_selection_plan(selected, cuts, horizon):
    """Reference: each selected node's κ found by walking down from the root edge by edge (an accept edge sets the
    transition's cut, a reject edge keeps κ); (node+, parent, depth, cut, κ) in BFS order, or None if infeasible."""
    out = []
    for node in sorted(set(selected), key=lambda v: (len(bin(v + 1)), v)):
        kappa, v, edges = horizon, node, []
        while v:
            edges.append(v % 2 == 1)
            v = (v - 1) // 2
        for depth, accepted in enumerate(reversed(edges)):
            if accepted:
                kappa = cuts[depth]
        depth = len(edges)
        if cuts[depth] > kappa:
            return None
        out.append((2 * node + 1, node, depth, cuts[depth], kappa))
    return out


def random_closed_selection(rng, size, max_depth):
    chosen, frontier = {0}, [1, 2]
    while len(chosen) < size and frontier:
        v = frontier.pop(rng.randrange(len(frontier)))
        if node_depth(v) < max_depth:
            chosen.add(v)
            frontier += [2 * v + 1, 2 * v + 2]
    return chosen


def test_plan_from_selection_matches_the_reference_in_linear_work(monkeypatch):
    """The requests and κ of random ancestor-closed selections (≤ 256 nodes, up to 255 deep) are the reference's;
    the tree work is linear in the selection (κ was found by walking every node's path to the root: a 256-deep
    chain took ~65k parent steps)."""
    from forerun.programs import prefetch_tree

    rng = random.Random(4)
    for trial in range(60):
        depth = rng.choice([3, 8, 40, 255])
        sel = random_closed_selection(rng, rng.randint(1, 256), depth)
        horizon = rng.randint(1, 30)
        cuts = [rng.randint(0, horizon) for _ in range(depth + 1)]
        if trial % 2:  # feasible everywhere: cuts that never grow
            cuts = sorted(cuts, reverse=True)
        want = naive_selection_plan(sel, cuts, horizon)
        if want is None:
            with pytest.raises(ValueError, match="Condition 1"):
                plan_from_selection(sel, cuts, horizon)
            continue
        plan = plan_from_selection(sel, cuts, horizon)
        assert [(r.node, r.parent, r.depth, r.cut, r.parent_cut) for r in plan.requests] == want
        for node, parent, _, cut, kappa in want:
            assert plan.known_cut[parent] == kappa and plan.known_cut[node] == cut
            assert plan.known_cut[2 * parent + 2] == kappa
    steps = []
    original = prefetch_tree.parent_of
    monkeypatch.setattr(prefetch_tree, "parent_of", lambda v: steps.append(v) or original(v))
    chain = [0] + [2 ** d - 2 for d in range(2, 257)]  # 0, 2, 6, 14, ...: 256 nodes down the reject edges
    plan_from_selection(chain, [0] * 257, horizon=10)
    assert len(steps) <= 2 * len(chain), len(steps)
