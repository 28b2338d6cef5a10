"""`forerun eval report`: tables of a run file, with the statistics of PreSTO App. D.2.

    table                   what                                                    from
    every sampler           per dataset and over the datasets every method ran: pass@1 [95 % CI], tokens
                            decoded and wall time per answer, on the accuracy / time Pareto frontier  `frontier`
    selection rules         best-of-n's and power-smc's answer rule with its bias    `programs.selection_rules`
    accuracy                per dataset × method: correct / n (errors count in n, as wrong), pass@k for
                            k = 1..samples, maj@samples, bootstrap 95 % interval over prompts of pass@1,
                            tokens decoded per answer (rejected proposals included), errors   `statistics`
                            --forced-answer runs: the forced pass's accuracy and interval (forced_accuracy,
                            forced_ci95; None for code and runs without it), its tokens apart (forced_tokens)
    comparisons             each method against its baseline (PreSTO: its sequential sampler; the rest:
                            greedy, else low-temp): exact McNemar p on per-prompt correctness (several
                            seeds: a sign test over prompts), paired bootstrap interval of the
                            pass@1 difference over prompts                                    `statistics`
    cost                    mean wall time, model-call time, calls, transitions/call
    Table 7 (per sampler)   sequential / PreSTO: total call time (mean ± sd), transitions per call, time per
                            call, Eq. 20 speedup = mean call time (seq) / mean call time (PreSTO), the
                            reduction in calls and increase in time per call (ratios of means), identical chains,
                            and a paired bootstrap interval of the speedup
    TOST (Eq. 23)           paired two one-sided t-tests of PreSTO − sequential per prompt (its seeds' mean), margin
                            δ = 0.2 sd of the sequential statistic across prompts, equivalent when
                            p_eq < 0.05; for accuracy, log-likelihood (Eq. 21) and confidence (Eq. 22);
                            pooled per sampler over datasets on standardized differences     statsmodels ttost_paired

Error lines (a generation that still failed after its retries) are counted as wrong answers in their cell's
denominator, listed, and never graded; `forerun eval --resume` retries them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from statsmodels.stats.weightstats import ttost_paired

from ...programs.selection_rules import FINAL_RULES, SELECT_RULES, rule_line
from ..datasets.registry import DATASETS
from ..presto.table7 import ChainTiming, finite_mean, table7_columns
from .frontier import common_datasets, sampler_rows
from .runs import final_records
from .settings import METHODS, Method
from .statistics import compare, forced_statistics, in_item_order, item_order, sample_statistics, speedup_ci

NO_FORCED_PASS = "the run had no forced-answer pass (--forced-answer not given)"
"""Why a cell's forced_tokens is undefined (the JSON reason of its null)."""
TOST_MARGIN_SD = 0.2
TOST_LEVEL = 0.05
TOST_STATS = ("correct", "log_likelihood", "confidence")


@dataclass(frozen=True)
class Cell:
    """The records of one dataset × method (errors kept apart)."""

    dataset: str
    method: str
    records: tuple[dict[str, Any], ...]
    """The graded records (`statistics.item_order`: the plan's order, not the order they finished in)."""
    failed: tuple[dict[str, Any], ...] = ()
    """The error records (generation failed after its retries), in the same order."""

    @property
    def errors(self) -> int:
        return len(self.failed)

    @property
    def n(self) -> int:
        """Answers counted: graded records and errors (an error is a wrong answer)."""
        return len(self.records) + len(self.failed)

    @property
    def all_records(self) -> tuple[dict[str, Any], ...]:
        return self.records + self.failed

    @property
    def correct(self) -> int:
        return sum(bool(r.get("correct")) for r in self.records)

    def mean(self, field: str) -> float:
        return finite_mean(r.get(field) for r in self.records)


def cells(records: Sequence[dict[str, Any]]) -> dict[tuple[str, str], Cell]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    failed: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        key = (r["dataset"], r["method"])
        (failed if r.get("error") else groups)[key].append(r)
    keys = list(dict.fromkeys([(r["dataset"], r["method"]) for r in records]))
    return {k: Cell(k[0], k[1], tuple(in_item_order(groups[k])), tuple(in_item_order(failed[k]))) for k in keys}


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


def _prompt_times(paired: list[tuple[dict[str, Any], dict[str, Any]]]) -> tuple[list[float], list[float]]:
    """Per prompt, the mean call time of its (sequential, PreSTO) seeds where both are finite: the clusters the
    speedup interval resamples (a prompt's seeds are not independent pairs)."""
    groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for a, b in paired:
        s, p = ChainTiming.of_record(a).call_time_s, ChainTiming.of_record(b).call_time_s
        if math.isfinite(s) and math.isfinite(p):
            groups[a["prompt_id"]].append((s, p))
    return [float(np.mean([s for s, _ in g])) for g in groups.values()], [float(np.mean([p for _, p in g]))
                                                                         for g in groups.values()]


def table7_row(seq: Cell, pre: Cell) -> dict[str, Any]:
    """Table 7 columns (`presto.table7`) of one sampler on one dataset, over its paired items; the speedup's
    interval resamples prompts (their seeds' mean call times)."""
    paired = _paired(seq, pre)
    pp = [(ChainTiming.of_record(a), ChainTiming.of_record(b)) for a, b in paired]
    return {"dataset": seq.dataset, "sampler": seq.method, "presto": pre.method, **table7_columns(pp),
            "speedup_ci95": speedup_ci(*_prompt_times(paired))}


def baseline_of(method: str, ran: set[str]) -> str | None:
    """What `method` is compared against: a PreSTO method's sequential sampler; any other method greedy, else
    low-temp (the decoding baselines of App. E.8), when that ran."""
    seq = Method.parse(method).sequential
    if seq is not None:
        return seq if seq in ran else None
    for base in ("greedy", "low-temp"):
        if base in ran and base != method:
            return base if method != "greedy" else None
    return None


def comparisons(table: dict[tuple[str, str], Cell]) -> list[dict[str, Any]]:
    """Every method against its baseline, per dataset (`statistics.compare`, errors as wrong answers)."""
    rows = []
    for (ds, m), cell in table.items():
        base = baseline_of(m, {mm for (d, mm) in table if d == ds})
        if base is not None:
            rows.append({"dataset": ds, "method": m, "baseline": base,
                         **compare(cell.all_records, table[(ds, base)].all_records)})
    return rows


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


def _prompt_values(pp: list[tuple[dict[str, Any], dict[str, Any]]], stat: str) -> list[tuple[float, float]]:
    """Per prompt, the (sequential, PreSTO) means of `stat` over its seeds where both are finite: TOST's units (a
    prompt's seeds are not independent pairs; δ is an sd across prompts)."""
    get = (lambda r: float(bool(r["correct"]))) if stat == "correct" else (lambda r: r.get(stat))
    groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for a, b in pp:
        x, y = get(a), get(b)
        if x is not None and y is not None and math.isfinite(float(x)) and math.isfinite(float(y)):
            groups[a["prompt_id"]].append((float(x), float(y)))
    return [(float(np.mean([x for x, _ in g])), float(np.mean([y for _, y in g]))) for g in groups.values()]


def tost_rows(table: dict[tuple[str, str], Cell]) -> list[dict[str, Any]]:
    """Per dataset, PreSTO method and statistic: `tost` over prompts."""
    rows = []
    for ds, seq_m, pre_m in pairs(table):
        pp = _paired(table[(ds, seq_m)], table[(ds, pre_m)])
        for stat in TOST_STATS:
            vals = _prompt_values(pp, stat)
            res = tost([a for a, _ in vals], [b for _, b in vals])
            rows.append(dict(res, dataset=ds, sampler=seq_m, presto=pre_m, statistic=stat))
    return rows


def pooled_tost_rows(table: dict[tuple[str, str], Cell]) -> list[dict[str, Any]]:
    """Per PreSTO method and statistic: TOST of the standardized differences pooled over datasets.  A dataset with
    no spread under the sequential sampler cannot be standardized: left out when PreSTO matches it there, else the
    pooled row cannot decide (equivalent None, the dataset named in its note)."""
    pooled: dict[tuple[str, str, str], list[tuple[float, float]]] = defaultdict(list)
    unpooled: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for ds, seq_m, pre_m in pairs(table):
        pp = _paired(table[(ds, seq_m)], table[(ds, pre_m)])
        for stat in TOST_STATS:
            vals = _prompt_values(pp, stat)
            sd = float(np.std([a for a, _ in vals], ddof=1)) if len(vals) > 1 else 0.0
            if sd > 0:
                pooled[(seq_m, pre_m, stat)] += [(a / sd, b / sd) for a, b in vals]
            elif vals and not np.allclose([b - a for a, b in vals], 0):
                unpooled[(seq_m, pre_m, stat)].append(ds)
    rows = []
    for key in dict.fromkeys([*pooled, *unpooled]):
        (seq_m, pre_m, stat), vals = key, pooled.get(key, [])
        diffs = np.array([b - a for a, b in vals])
        row = {"sampler": seq_m, "presto": pre_m, "statistic": stat, "n": len(vals),
               "mean_diff_sd": float(diffs.mean()) if len(diffs) else math.nan, "delta_sd": TOST_MARGIN_SD,
               "note": ""}
        if unpooled.get(key):
            row.update(p_eq=math.nan, equivalent=None, note=f"not pooled, no spread under the sequential sampler "
                       f"but PreSTO differs: {', '.join(unpooled[key])}")
        elif len(vals) > 1 and not np.allclose(diffs, 0):
            p, _, _ = ttost_paired(np.array([b for _, b in vals]), np.array([a for a, _ in vals]),
                                   -TOST_MARGIN_SD, TOST_MARGIN_SD)
            row.update(p_eq=float(p), equivalent=bool(p < TOST_LEVEL))
        else:
            row.update(p_eq=math.nan, equivalent=True if len(vals) > 1 else None)
        rows.append(row)
    return rows


RULE_SETTINGS = {"best-of-n": ("select", SELECT_RULES), "power-smc": ("final", FINAL_RULES)}
"""The methods that pick one answer among several candidates: the record setting naming the rule, the rules."""


def selection_rules(records: Sequence[dict[str, Any]]) -> dict[str, str]:
    """'<method> selects by <rule>: <what it returns, its bias>' for best-of-n and power-smc, from the rule their
    records' settings name."""
    out: dict[str, str] = {}
    for r in records:
        key, rules = RULE_SETTINGS.get(r["method"], (None, {}))
        rule = (r.get("settings") or {}).get(key)
        if rule in rules:
            out.setdefault(r["method"], rule_line(r["method"], rule))
    return out


def report_order(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records as the tables list them: datasets in the registry's order, methods in the methods table's
    (`settings.METHODS`), then `statistics.item_order` - never the order the lines were written in, which under
    --concurrency is the order the items finished (a fast method's first line before a slow one's)."""
    datasets = {name: i for i, name in enumerate(DATASETS)}
    methods = {name: i for i, name in enumerate(METHODS)}
    return sorted(records, key=lambda r: (datasets.get(r["dataset"], len(datasets)), r["dataset"],
                                          methods.get(r["method"], len(methods)), r["method"], item_order(r)))


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Every table of the report as plain data (the last line of each item: a retried error is replaced), rows in
    `report_order`."""
    records = report_order(final_records(records))
    table = cells(records)
    acc = []
    for (ds, m), c in table.items():
        stats = sample_statistics(c.all_records)
        acc.append({"dataset": ds, "method": m, "n": c.n, "correct": c.correct, "errors": c.errors,
                    "accuracy": c.correct / c.n if c.n else math.nan, **stats,
                    **forced_statistics(c.all_records), "forced_tokens": c.mean("forced_tokens"),
                    "tokens_decoded": c.mean("tokens_decoded"),
                    "wall_s": c.mean("wall_s"), "call_time_s": c.mean("call_time_s"), "calls": c.mean("num_calls"),
                    "all_calls": c.mean("all_calls"), "transitions_per_call": c.mean("transitions_per_call"),
                    "response_tokens": finite_mean(len(r["response_ids"]) for r in c.records),
                    "log_likelihood": c.mean("log_likelihood"), "confidence": c.mean("confidence")})
    return {"samplers": sampler_rows(records), "sampler_datasets": common_datasets(records),
            "selection_rules": selection_rules(records), "cells": acc, "forced_answer": any("forced_correct" in r for r in records),
            "comparisons": comparisons(table),
            "table7": [table7_row(table[(d, s)], table[(d, p)]) for d, s, p in pairs(table)],
            "tost": tost_rows(table), "tost_pooled": pooled_tost_rows(table),
            "errors": [{"key": r["key"], "error": r["error"]} for r in records if r.get("error")]}
