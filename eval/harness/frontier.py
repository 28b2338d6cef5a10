"""The one table of every sampler (issue 30): per dataset, and over every dataset all methods ran on, one row per
method with pass@1 and its 95 % interval, tokens decoded and wall time per answer, and whether the method
lies on the accuracy / time Pareto frontier of its scope.

    notion                          code
    answer                          one record (dataset, method, prompt, seed); an error counts as wrong
    pass@1, its 95 % interval       statistics.sample_statistics (intervals.prompt_interval over prompts)
    tokens decoded per answer       mean `tokens_decoded` (every sample, particle, proposal; rejected included)
    wall time per answer            mean `wall_s` (the item's whole generation: harness.methods)
    Pareto frontier                 pareto_front: no other method is at least as accurate AND at least as fast,
                                    and strictly better in one of the two
    items compared                  per dataset, the (prompt, seed) items every method ran on it (a cut run
                                    compares the same items)
    scope "all"                     the datasets every method of the run has: the same prompts for each
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Sequence

from ..presto.table7 import finite_mean
from .statistics import in_item_order, sample_statistics

ALL_SCOPE = "all"


def pareto_front(points: Sequence[tuple[float, float]]) -> list[bool | None]:
    """For each (accuracy, time): whether no other point dominates it (accuracy ≥ and time ≤, one strictly).
    A point with a non-finite coordinate is not compared (None) and dominates nothing."""
    ok = [math.isfinite(a) and math.isfinite(t) for a, t in points]
    out: list[bool | None] = []
    for i, (a, t) in enumerate(points):
        if not ok[i]:
            out.append(None)
            continue
        out.append(not any(ok[j] and b >= a and u <= t and (b > a or u < t)
                           for j, (b, u) in enumerate(points) if j != i))
    return out


def _row(scope: str, method: str, records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    records = in_item_order(records)  # the same means whatever order the items finished in
    graded = [r for r in records if not r.get("error")]
    stats = sample_statistics(records)
    return {"scope": scope, "method": method, "answers": len(records), "errors": len(records) - len(graded),
            "pass_at_1": stats["pass_at_k"].get("1", math.nan), "ci95": stats["ci95"],
            "tokens_decoded": finite_mean(r.get("tokens_decoded") for r in graded),
            "wall_s": finite_mean(r.get("wall_s") for r in graded)}


def common_datasets(records: Sequence[dict[str, Any]]) -> list[str]:
    """The datasets on which every method of the run has answers (in the order of `records`)."""
    ran: dict[str, set[str]] = defaultdict(set)
    for r in records:
        ran[r["method"]].add(r["dataset"])
    datasets = list(dict.fromkeys(r["dataset"] for r in records))
    return [d for d in datasets if all(d in sets for sets in ran.values())]


def sampler_rows(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The every-sampler rows of final records, over the (prompt, seed) items every method of a dataset has (a cut
    run compares the same items): scope "all" first (prompt ids namespaced by dataset, so the interval counts
    each (dataset, prompt) as one cluster), then each dataset; `frontier` per scope."""
    methods = list(dict.fromkeys(r["method"] for r in records))
    common = set(common_datasets(records))
    items: dict[str, list[set[tuple[str, Any]]]] = defaultdict(list)  # per dataset, each method's (prompt, seed)s
    for m in methods:
        by_ds: dict[str, set[tuple[str, Any]]] = defaultdict(set)
        for r in records:
            if r["method"] == m:
                by_ds[r["dataset"]].add((r["prompt_id"], r["seed"]))
        for ds, got in by_ds.items():
            items[ds].append(got)
    shared = {ds: set.intersection(*sets) for ds, sets in items.items()}
    scopes: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if (r["prompt_id"], r["seed"]) not in shared[r["dataset"]]:  # a cut run: only items every method of the
            continue                                                # dataset has are compared
        scopes[r["dataset"]][r["method"]].append(r)
        if r["dataset"] in common:
            scopes[ALL_SCOPE][r["method"]].append(dict(r, prompt_id=f"{r['dataset']}/{r['prompt_id']}"))
    order = [ALL_SCOPE] if common else []
    order += list(dict.fromkeys(r["dataset"] for r in records))
    rows = []
    for scope in order:
        scoped = [_row(scope, m, scopes[scope][m]) for m in methods if scopes[scope][m]]
        for row, front in zip(scoped, pareto_front([(r["pass_at_1"], r["wall_s"]) for r in scoped])):
            row["frontier"] = front
        rows += scoped
    return rows
