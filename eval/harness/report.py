"""`forerun eval report`: tables of a run file, with the statistics of PreSTO App. D.2.

    table                   what                                                    from
    accuracy                correct / n per dataset × method, Wilson 95 % interval statsmodels proportion_confint
    cost                    mean wall time, model-call time, calls, transitions/call
    Table 7 (per sampler)   sequential / PreSTO: total call time (mean ± sd), transitions per call, time per
                            call, Eq. 20 speedup = mean call time (seq) / mean call time (PreSTO), the
                            reduction in calls and increase in time per call (ratios of means), identical chains
    TOST (Eq. 23)           paired two one-sided t-tests of PreSTO − sequential per (prompt, seed), margin
                            δ = 0.2 sd of the sequential statistic across prompts, equivalent when
                            p_eq < 0.05; for accuracy, log-likelihood (Eq. 21) and confidence (Eq. 22);
                            pooled per sampler over datasets on standardized differences     statsmodels ttost_paired

Error lines (a generation that failed) are counted and listed, never graded.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from statsmodels.stats.proportion import proportion_confint
from statsmodels.stats.weightstats import ttost_paired

from ..presto.table7 import ChainTiming, finite_mean, table7_columns
from .settings import Method

TOST_MARGIN_SD = 0.2
TOST_LEVEL = 0.05
TOST_STATS = ("correct", "log_likelihood", "confidence")


def wilson(k: int, n: int) -> tuple[float, float]:
    """Wilson 95 % interval of k successes in n."""
    lo, hi = proportion_confint(k, n, alpha=0.05, method="wilson")
    return float(lo), float(hi)


@dataclass(frozen=True)
class Cell:
    """The records of one dataset × method (errors kept apart)."""

    dataset: str
    method: str
    records: tuple[dict[str, Any], ...]
    errors: int

    @property
    def n(self) -> int:
        return len(self.records)

    @property
    def correct(self) -> int:
        return sum(bool(r.get("correct")) for r in self.records)

    def mean(self, field: str) -> float:
        return finite_mean(r.get(field) for r in self.records)


def cells(records: Sequence[dict[str, Any]]) -> dict[tuple[str, str], Cell]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    errors: dict[tuple[str, str], int] = defaultdict(int)
    for r in records:
        key = (r["dataset"], r["method"])
        if r.get("error"):
            errors[key] += 1
        else:
            groups[key].append(r)
    keys = list(dict.fromkeys([(r["dataset"], r["method"]) for r in records]))
    return {k: Cell(k[0], k[1], tuple(groups[k]), errors[k]) for k in keys}


def pairs(table: dict[tuple[str, str], Cell]) -> list[tuple[str, str, str]]:
    """(dataset, sequential method, PreSTO method) for every PreSTO method whose sequential one ran."""
    out = []
    for (ds, m) in table:
        seq = Method.parse(m).sequential
        if seq is not None and (ds, seq) in table:
            out.append((ds, seq, m))
    return out


def _paired(seq: Cell, pre: Cell) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    by_item = {(r["prompt_id"], r["seed"]): r for r in seq.records}
    return [(by_item[(r["prompt_id"], r["seed"])], r) for r in pre.records if (r["prompt_id"], r["seed"]) in by_item]


def table7_row(seq: Cell, pre: Cell) -> dict[str, Any]:
    """Table 7 columns (`presto.table7`) of one sampler on one dataset, over its paired items."""
    pp = [(ChainTiming.of_record(a), ChainTiming.of_record(b)) for a, b in _paired(seq, pre)]
    return {"dataset": seq.dataset, "sampler": seq.method, "presto": pre.method, **table7_columns(pp)}


def tost(seq_values: Sequence[float], pre_values: Sequence[float]) -> dict[str, Any]:
    """Paired TOST (Eq. 23) of PreSTO − sequential with δ = 0.2 sd(sequential)."""
    x = np.asarray(pre_values, dtype=float)
    y = np.asarray(seq_values, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    n = len(x)
    out: dict[str, Any] = {"n": n, "mean_diff": float(np.mean(x - y)) if n else math.nan}
    sd = float(np.std(y, ddof=1)) if n > 1 else math.nan
    out["delta"] = TOST_MARGIN_SD * sd if n > 1 else math.nan
    if n < 2 or not sd > 0:
        out.update(p_eq=math.nan, equivalent=None, note="n < 2 or no spread under the sequential sampler")
        return out
    if np.allclose(x, y):
        out.update(p_eq=math.nan, equivalent=True, note="identical: every difference ≈ 0 (np.allclose), no test needed")
        return out
    p, _, _ = ttost_paired(x, y, -out["delta"], out["delta"])
    out.update(p_eq=float(p), equivalent=bool(p < TOST_LEVEL), note="")
    return out


def tost_rows(table: dict[tuple[str, str], Cell]) -> list[dict[str, Any]]:
    rows = []
    for ds, seq_m, pre_m in pairs(table):
        pp = _paired(table[(ds, seq_m)], table[(ds, pre_m)])
        for stat in TOST_STATS:
            vals = [(float(bool(a[stat])) if stat == "correct" else a.get(stat),
                     float(bool(b[stat])) if stat == "correct" else b.get(stat)) for a, b in pp]
            vals = [(float(a), float(b)) for a, b in vals if a is not None and b is not None]
            res = tost([a for a, _ in vals], [b for _, b in vals])
            rows.append(dict(res, dataset=ds, sampler=seq_m, presto=pre_m, statistic=stat))
    return rows


def pooled_tost_rows(table: dict[tuple[str, str], Cell]) -> list[dict[str, Any]]:
    """Per PreSTO method and statistic: TOST of the standardized differences pooled over datasets."""
    pooled: dict[tuple[str, str, str], list[tuple[float, float]]] = defaultdict(list)
    for ds, seq_m, pre_m in pairs(table):
        pp = _paired(table[(ds, seq_m)], table[(ds, pre_m)])
        for stat in TOST_STATS:
            get = (lambda r: float(bool(r["correct"]))) if stat == "correct" else (lambda r: r.get(stat))
            vals = [(get(a), get(b)) for a, b in pp if get(a) is not None and get(b) is not None]
            sd = float(np.std([a for a, _ in vals], ddof=1)) if len(vals) > 1 else 0.0
            if sd > 0:
                pooled[(seq_m, pre_m, stat)] += [(a / sd, b / sd) for a, b in vals]
    rows = []
    for (seq_m, pre_m, stat), vals in pooled.items():
        diffs = np.array([b - a for a, b in vals])
        row = {"sampler": seq_m, "presto": pre_m, "statistic": stat, "n": len(vals),
               "mean_diff_sd": float(diffs.mean()) if len(diffs) else math.nan, "delta_sd": TOST_MARGIN_SD}
        if len(vals) > 1 and not np.allclose(diffs, 0):
            p, _, _ = ttost_paired(np.array([b for _, b in vals]), np.array([a for a, _ in vals]),
                                   -TOST_MARGIN_SD, TOST_MARGIN_SD)
            row.update(p_eq=float(p), equivalent=bool(p < TOST_LEVEL))
        else:
            row.update(p_eq=math.nan, equivalent=True if len(vals) > 1 else None)
        rows.append(row)
    return rows


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Every table of the report as plain data."""
    table = cells(records)
    acc = []
    for (ds, m), c in table.items():
        lo, hi = wilson(c.correct, c.n) if c.n else (math.nan, math.nan)
        acc.append({"dataset": ds, "method": m, "n": c.n, "correct": c.correct, "errors": c.errors,
                    "accuracy": c.correct / c.n if c.n else math.nan, "wilson95": [lo, hi],
                    "wall_s": c.mean("wall_s"), "call_time_s": c.mean("call_time_s"), "calls": c.mean("num_calls"),
                    "all_calls": c.mean("all_calls"), "transitions_per_call": c.mean("transitions_per_call"),
                    "response_tokens": finite_mean(len(r["response_ids"]) for r in c.records),
                    "log_likelihood": c.mean("log_likelihood"), "confidence": c.mean("confidence")})
    return {"cells": acc, "table7": [table7_row(table[(d, s)], table[(d, p)]) for d, s, p in pairs(table)],
            "tost": tost_rows(table), "tost_pooled": pooled_tost_rows(table),
            "errors": [{"key": r["key"], "error": r["error"]} for r in records if r.get("error")]}
