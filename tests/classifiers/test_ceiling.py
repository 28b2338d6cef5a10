"""The ceiling of the predictive rule on recorded rounds: F (Lemma 1) of each rule's selection under the recorded A,
checked against hand computation and a brute force over every subtree (independent of the code under test)."""

from __future__ import annotations

import itertools
import json

import pytest

from forerun.classifiers.ceiling import ceiling, expected_transitions, recorded_rounds
from forerun.cli.main import main
from forerun.programs.acceptance import epsilon_class
from forerun.programs.records import NodeRecord

T, CUTS = 32, (20, 10, 5)  # decreasing cuts: every node of the depth-3 tree is feasible (Condition 1)
A = {0: 0.9, 1: 0.3, 2: 0.6, 3: 0.95, 4: 0.1, 5: 0.5, 6: 0.8}  # expanded node v -> A of its request


def depth_of(v: int) -> int:
    return (v + 1).bit_length() - 1


def kappa(v: int) -> int:
    """κ(v): the accept child of u takes the cut of u's depth, the reject child keeps κ(u)."""
    if v == 0:
        return T
    parent = (v - 1) // 2
    return CUTS[depth_of(parent)] if v % 2 == 1 else kappa(parent)


def node_records(accept=A, prompt="p", call=1):
    out = []
    for v, a in accept.items():
        d = depth_of(v)
        out.append(NodeRecord(prompt_id=prompt, sampler="presto-power-mh", call_index=call, node_id=2 * v + 1,
                              depth=d, cut=CUTS[d], parent_cut=kappa(v), cut_fraction=CUTS[d] / T,
                              accepts_on_path=0, accept_prob=a, certainty_class=epsilon_class(a), realized=False,
                              extra={"logz_suffix_sum": -float(d)}))
    return out


def path_reach(v: int) -> float:
    """reach(v) by walking up to the root: the product of A (accept edges) and 1 - A (reject edges)."""
    p = 1.0
    while v:
        parent = (v - 1) // 2
        p *= A[parent] if v % 2 == 1 else 1 - A[parent]
        v = parent
    return p


def brute_force_best(budget: int) -> float:
    best = 0.0
    for size in range(1, budget + 1):
        for sel in itertools.combinations(sorted(A), size):
            if 0 in sel and all((v - 1) // 2 in sel for v in sel if v):
                best = max(best, sum(path_reach(v) for v in sel))
    return best


def test_a_round_is_its_tree_cuts_and_horizon():
    (rnd,) = recorded_rounds(node_records())
    assert rnd.accept == A and rnd.request_cuts == CUTS and rnd.horizon == T
    assert rnd.depth_features == {"logz_suffix_sum": (0.0, -1.0, -2.0)}


@pytest.mark.parametrize("budget", [1, 2, 3, 4, 7])
def test_the_oracle_is_the_best_subtree(budget):
    r = ceiling(recorded_rounds(node_records()), budget)
    assert r["rules"]["oracle"]["expected_transitions"] == pytest.approx(brute_force_best(budget))


def test_bfs_and_a_predictive_rule_are_valued_under_the_recorded_a():
    rounds = recorded_rounds(node_records())
    # BFS at 3 nodes: the root and both children, 1 + 0.9 + 0.1
    assert ceiling(rounds, 3)["rules"]["bfs"]["expected_transitions"] == pytest.approx(2.0)
    # ĥ = 0.1 everywhere: the rule follows the reject spine 0, 2, 6 -> 1 + 0.1 + 0.1 * 0.4
    r = ceiling(rounds, 3, lambda node: 0.1)
    assert r["rules"]["predictive"]["expected_transitions"] == pytest.approx(1.14)
    assert r["rules"]["predictive"]["over_bfs"] == pytest.approx(1.14 / 2.0)
    assert r["rules"]["oracle"]["over_bfs"] == pytest.approx(brute_force_best(3) / 2.0)


def test_nodes_the_records_lack_are_counted_and_add_nothing():
    partial = {v: a for v, a in A.items() if v != 2}
    (rnd,) = recorded_rounds(node_records(partial))
    # node 2 unrecorded: counted, adds 0; node 5 (below it) is recorded but its reach is unknown: adds 0
    assert expected_transitions([0, 1, 2, 5], rnd.accept) == (pytest.approx(1.9), 1)
    assert ceiling([rnd], 3)["rules"]["bfs"]["unrecorded_nodes"] == 1


def test_malformed_rounds_are_refused():
    with pytest.raises(ValueError, match="root request"):
        recorded_rounds(node_records({1: 0.5}))
    bad = node_records()
    bad[1] = NodeRecord(**{**bad[1].__dict__, "cut": 7})  # depth 1 with two cuts
    with pytest.raises(ValueError, match="cuts"):
        recorded_rounds(bad)
    with pytest.raises(ValueError):
        ceiling([], 20)


def test_the_command_prints_strict_json(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in node_records() + node_records(call=2)))
    assert main(["classifier", "ceiling", "--records", str(path), "--npf", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rounds"] == 2 and out["rules"]["bfs"]["expected_transitions"] == pytest.approx(2.0)
    assert out["rules"]["oracle"]["expected_transitions"] == pytest.approx(brute_force_best(3))
    with path.open("a") as fh:  # a torn last line (an append cut short): skipped with one warning naming it
        fh.write('{"prompt_id": "p", "sampler": "pres')
    capsys.readouterr()
    assert main(["classifier", "ceiling", "--records", str(path), "--npf", "3", "--json"]) == 0
    torn = capsys.readouterr()
    assert json.loads(torn.out) == out and f"warning: {path}:15: skipped a torn line" in torn.err
    assert main(["classifier", "ceiling", "--records", str(path), "--sampler", "presto-multitry-mh"]) == 2
    assert "no records with sampler 'presto-multitry-mh'" in capsys.readouterr().err
    assert main(["classifier", "ceiling", "--records", str(path), "--sampler", "power-mh"]) == 2
    assert "round-based PreSTO" in capsys.readouterr().err


def test_a_node_recorded_twice_with_other_a_or_an_even_node_id_is_refused():
    """Two runs' records of one round (say a second run appended to the file) disagree on A at a node: refused,
    not the last line's A silently taking the node; an identical duplicate (one file passed twice) is fine."""
    recs = node_records()
    again = NodeRecord(**{**recs[0].__dict__, "accept_prob": 0.5, "certainty_class": epsilon_class(0.5)})
    with pytest.raises(ValueError, match="recorded with A = 0.9 and 0.5"):
        recorded_rounds(recs + [again])
    (rnd,) = recorded_rounds(recs + recs)
    assert rnd.accept == A
    even = NodeRecord(**{**recs[-1].__dict__, "node_id": 2})  # would read as node 0's request
    with pytest.raises(ValueError, match="node_id 2 is even"):
        recorded_rounds(recs + [even])
