"""How far any traversal rule could lead BFS on recorded prefetch rounds: the ceiling of the predictive rule.

The expected number of transitions one call completes with a selection ℐ of expanded nodes is
F_ℐ = Σ_{v ∈ ℐ} reach(v) (Lemma 1), reach(v) the product of the branch probabilities on the root → v path.  BFS
records in forerun's request unit (`forerun bench presto --traversals bfs --records FILE`, K ≤ 20) hold every
feasible node of each round's tree with its true A(v+, v), so F can be computed there for any N_pf-node selection:
BFS's (the paper's node unit), the predictive rule's with a classifier's ĥ, and an oracle's that knows every A
before generation (the N_pf nodes of largest reach: reach never grows down the tree, so they form a subtree).  No
rule that decides before generation can expect more than the oracle: oracle ÷ BFS bounds what any classifier
could gain at that budget on those chains.

    paper                                   code
    v; v+ = 2v + 1 (accept), 2v + 2 (reject) heap indices; a record's node_id is v+, its expanded node (id - 1) // 2
    A(v+, v)                                NodeRecord.accept_prob
    reach(v)                                reach_probabilities
    F_ℐ (Lemma 1)                           expected_transitions
    c_j per depth, T                        RecordedRound.request_cuts, .horizon (κ of the root: node 1's parent_cut)
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..programs.records import NodeRecord
from ..programs.traversal import CandidateNode, plan_prefetch

__all__ = ["RecordedRound", "recorded_rounds", "reach_probabilities", "expected_transitions", "ceiling",
           "format_ceiling"]


@dataclass(frozen=True)
class RecordedRound:
    """One prefetch round's scored tree: A of each expanded node's request, the cut per depth, the horizon T."""

    key: tuple[str, str | None, int | None, int]
    """(prompt_id, traversal, block, call_index)."""
    accept: Mapping[int, float]
    """Expanded node v -> A(v+, v)."""
    request_cuts: tuple[int, ...]
    horizon: int
    depth_features: Mapping[str, tuple[float, ...]]
    """Per depth, the numeric record fields every depth has (Features 3/4: statistics of the root state at c_j),
    for a classifier that reads them."""


def recorded_rounds(records: Iterable[NodeRecord]) -> list[RecordedRound]:
    """The rounds of scored-node records, in file order (a round needs its root request, node_id 1)."""
    groups: dict[tuple[str, str | None, int | None, int], list[NodeRecord]] = defaultdict(list)
    for r in records:
        groups[(r.prompt_id, r.traversal, r.block, r.call_index)].append(r)
    rounds = []
    for key, recs in groups.items():
        root = next((r for r in recs if r.node_id == 1), None)
        if root is None:
            raise ValueError(f"round {key}: no record of the root request (node_id 1)")
        cuts: dict[int, int] = {}
        for r in recs:
            if cuts.setdefault(r.depth, r.cut) != r.cut:
                raise ValueError(f"round {key}: depth {r.depth} has cuts {cuts[r.depth]} and {r.cut}")
        if sorted(cuts) != list(range(len(cuts))):
            raise ValueError(f"round {key}: depths {sorted(cuts)} are not 0, 1, ...")
        accept: dict[int, float] = {}
        for r in recs:
            if r.node_id % 2 == 0:
                raise ValueError(f"round {key}: node_id {r.node_id} is even; a record's node_id is the accept child "
                                 "v+ = 2v + 1 of its expanded node")
            if accept.setdefault((r.node_id - 1) // 2, r.accept_prob) != r.accept_prob:
                raise ValueError(f"round {key}: node_id {r.node_id} recorded with A = {accept[(r.node_id - 1) // 2]} "
                                 f"and {r.accept_prob}: records of different runs mixed in one file? pass one run's")
        first: dict[int, NodeRecord] = {}  # per depth, its first node's record (the features are the root state's)
        for r in sorted(recs, key=lambda r: r.node_id):
            first.setdefault(r.depth, r)
        names = set.intersection(*({k for k, v in first[d].extra.items() if isinstance(v, (int, float))
                                    and not isinstance(v, bool)} for d in range(len(cuts))))
        rounds.append(RecordedRound(key, {v: float(a) for v, a in sorted(accept.items())},
                                    tuple(cuts[d] for d in range(len(cuts))), int(root.parent_cut),
                                    {k: tuple(float(first[d].extra[k]) for d in range(len(cuts))) for k in sorted(names)}))
    return rounds


def reach_probabilities(accept: Mapping[int, float]) -> dict[int, float]:
    """reach(v) of the root (1) and of both children of every expanded node reachable from it."""
    reach = {0: 1.0}
    for v in sorted(accept):  # heap order: a parent before its children
        if v in reach:
            reach[2 * v + 1] = reach[v] * accept[v]
            reach[2 * v + 2] = reach[v] * (1.0 - accept[v])
    return reach


def expected_transitions(selection: Iterable[int], accept: Mapping[int, float],
                         reach: Mapping[int, float] | None = None) -> tuple[float, int]:
    """(F of the expanded nodes `selection` under the recorded A, how many of them the records do not hold: they
    count 0).  `reach`: reach_probabilities(accept), when the caller has it already."""
    reach = reach_probabilities(accept) if reach is None else reach
    chosen = list(selection)
    return sum(reach.get(v, 0.0) for v in chosen if v in accept), sum(v not in accept for v in chosen)


def ceiling(rounds: Sequence[RecordedRound], budget: int,
            branch_prob: Callable[[CandidateNode], float] | None = None, *, tree_position: bool = False
            ) -> dict[str, Any]:
    """Mean F per round of BFS's, the predictive rule's (with `branch_prob`; `tree_position` when ĥ reads κ(v) or the
    accepts on the path) and the oracle's `budget`-node selections, each ÷ BFS's; nodes a rule selects that the
    records lack are counted (and add 0)."""
    if budget < 1:
        raise ValueError(f"budget N_pf must be >= 1, got {budget}")
    if not rounds:
        raise ValueError("no prefetch rounds in the records")
    rules = ["bfs"] + (["predictive"] if branch_prob is not None else []) + ["oracle"]
    total = {rule: 0.0 for rule in rules}
    unknown = {rule: 0 for rule in rules}
    for rnd in rounds:
        cap = len(rnd.request_cuts)
        reach = reach_probabilities(rnd.accept)  # once per round, for every rule
        for rule in rules:
            if rule == "oracle":
                chosen = sorted(rnd.accept, key=lambda v: -reach.get(v, 0.0))[:budget]
            else:
                plan = plan_prefetch(rnd.request_cuts, rnd.horizon, budget, cap, traversal=rule,
                                     branch_prob=branch_prob, tree_position=tree_position, budget_unit="node",
                                     depth_features=rnd.depth_features)
                chosen = [(q.node - 1) // 2 for q in plan.requests]
            value, missing = expected_transitions(chosen, rnd.accept, reach)
            total[rule] += value
            unknown[rule] += missing
    n = len(rounds)
    return {"budget": budget, "rounds": n, "mean_scored_nodes": sum(len(r.accept) for r in rounds) / n,
            "rules": {rule: {"expected_transitions": total[rule] / n, "over_bfs": total[rule] / total["bfs"]
                             if total["bfs"] > 0 else float("nan"), "unrecorded_nodes": unknown[rule]}
                      for rule in rules}}


def format_ceiling(r: dict[str, Any]) -> str:
    lines = [f"{r['rounds']} recorded rounds ({r['mean_scored_nodes']:.1f} scored nodes each), N_pf = {r['budget']} "
             "nodes: expected transitions per call (Lemma 1, under the recorded A)",
             f"  {'rule':<11} {'per call':>8} {'÷ BFS':>7} {'unrecorded nodes':>17}"]
    for rule, v in r["rules"].items():
        lines.append(f"  {rule:<11} {v['expected_transitions']:>8.2f} {v['over_bfs']:>6.2f}x {v['unrecorded_nodes']:>17}")
    if any(v["unrecorded_nodes"] for v in r["rules"].values()):
        lines.append("  (a rule selected nodes the records lack, counted as 0: record with --traversals bfs at K <= 20 "
                     "so that every feasible node is scored)")
    return "\n".join(lines)
