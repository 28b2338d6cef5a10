"""The tree of streaming PreSTO (`stream_tree.walk_tree`): reach, decision paths and the value cut-off
P·(1 + ĥ·D) ≥ λ, against an enumeration of decision sequences written here."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from forerun.programs.stream_tree import StateRef, walk_tree
from forerun.programs.transitions import ChainState


def root() -> StateRef:
    z = np.zeros(4)
    return StateRef.root(ChainState(np.zeros(4, dtype=np.int64), z, z, z))


def reach_of(path: tuple[bool, ...], h: float) -> float:
    return math.prod(h if a else 1.0 - h for a in path)


def value_of(path: tuple[bool, ...], h: float, depth_cap: int) -> float:
    return reach_of(path, h) * (1.0 + h * (depth_cap - len(path) - 1))


@pytest.mark.parametrize("h,min_value", [(0.3, 0.0), (0.3, 0.05), (0.7, 0.1), (0.5, 0.2), (0.5, 1.0), (0.4, 7.0)])
def test_best_first_by_reach_down_to_min_value(h, min_value):
    depth_cap = 6
    nodes = list(walk_tree(root(), 0, depth_cap, 10_000, lambda node: None, hhat=lambda node: h,
                           min_value=min_value))
    # the oracle: every decision sequence shorter than depth_cap whose prefixes are all worth their row:
    # reach × (1 + h × levels below) >= min_value
    want = {p for d in range(depth_cap) for p in itertools.product((True, False), repeat=d)
            if all(value_of(p[:i], h, depth_cap) >= min_value for i in range(1, d + 1))}
    assert {n.path for n in nodes} == want
    assert len(nodes) == len(want)
    for n in nodes:
        assert n.depth == len(n.path) and n.transition == n.depth
        assert n.accepts == sum(n.path)
        assert n.reach == pytest.approx(reach_of(n.path, h))
        assert n.heap == int("1" + "".join("0" if a else "1" for a in n.path), 2) - 1  # heap numbering of the path
    reaches = [n.reach for n in nodes]
    assert reaches == sorted(reaches, reverse=True)  # best first


def test_a_constant_half_keeps_depth_order_and_min_value():
    # h = 0.5, depth_cap 5: depth 1 is worth 0.5 · (1 + 0.5 · 3) = 1.25, depth 2 0.25 · 2 = 0.5, depth 3 0.125 · 1.5
    nodes = list(walk_tree(root(), 3, 5, 10_000, lambda node: None, hhat=lambda node: 0.5, min_value=0.4))
    assert [n.depth for n in nodes] == sorted(n.depth for n in nodes)
    assert {n.path for n in nodes} == {p for d in range(3) for p in itertools.product((True, False), repeat=d)}
    assert all(n.transition == 3 + n.depth for n in nodes)
