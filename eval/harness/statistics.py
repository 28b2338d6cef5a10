"""The statistics of `forerun eval report`: per-prompt accuracy with k samples, intervals over prompts, and
paired comparisons of a method against its baseline.

Samples of one prompt (seeds) are not independent draws of the benchmark: every statistic first reduces a
prompt's samples to one number, then resamples PROMPTS (a cluster bootstrap, seeds nested inside a prompt).

    statistic            definition                                                       from
    pass@k               mean over prompts of 1 − C(n−c, k) / C(n, k), n samples, c correct  Chen et al. 2021
                         (the unbiased estimator, as lighteval and the HumanEval harness)
    maj@k                mean over prompts: the most frequent extracted answer among the first k
                         samples (ties: the earliest; correct answers vote as one, being equal
                         to the gold) is a correct one                                     lighteval maj@n
    ci95                 95 % interval over prompts of pass@1 (`prompt_interval`): the     scipy.stats.binomtest
                         Wilson score interval of k of P prompts when every prompt's       (Wilson), else
                         value is 0 or 1 (one seed, or seeds that agree), else the         scipy.stats.bootstrap
                         percentile bootstrap over prompts of the per-prompt values
    forced_ci95          the same, of the forced-answer pass's accuracy (--forced-answer)
    p (test)             one seed per prompt: exact McNemar test on per-prompt correctness,
                         method vs baseline (the EntropyCut reference's test)              statsmodels mcnemar
                         several seeds: exact sign test over prompts of the per-prompt
                         accuracy difference (seeds are not independent pairs)             statsmodels sign_test
    diff_ci95            paired bootstrap over prompts of pass@1(method) − pass@1(baseline) scipy.stats.bootstrap
                         (undefined, NaN, when every prompt's difference is the same)
    speedup_ci95         paired bootstrap over prompts (each its seeds' mean call times) of
                         Eq. 20's ratio of mean call times                                 scipy.stats.bootstrap
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any, Callable, Sequence

import numpy as np
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.descriptivestats import sign_test

from ..graders.math_answers import vote_key
from .intervals import paired_ci, percentile_ci, prompt_interval

def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt with `c` correct among `n` samples (k ≤ n)."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_correct(samples: Sequence[tuple[str | None, bool]]) -> bool:
    """Whether the most frequent extracted answer (ties: the earliest) of (answer, correct) samples is correct;
    samples with no answer do not vote (all without one: False).  Equal answers vote together: the correct ones
    as ONE answer (each equals the gold, so they equal one another: "\\frac12" and "1/2"), the others by
    `graders.math_answers.vote_key` (the integer written, "042" = "42", else the normalized text)."""
    votes = [(("correct",) if ok else ("wrong", vote_key(a)), ok) for a, ok in samples if a is not None]
    if not votes:
        return False
    counts = Counter(a for a, _ in votes)
    top = max(counts.values())
    winner = next(a for a, _ in votes if counts[a] == top)
    return next(ok for a, ok in votes if a == winner)


def item_order(r: dict[str, Any]) -> tuple[int, str, int]:
    """Where a record sorts among a cell's: its prompt's index in the dataset (`prompt_index`; none: first), the
    prompt's id, its seed - the plan's order, whatever order the items finished and were written in (completion
    order under `--concurrency`).  The bootstrap's resamples are indices into the values in this order, so its
    intervals and every mean are those of the same order in every run of the same items."""
    index = r.get("prompt_index")
    return (index if isinstance(index, int) else -1, str(r["prompt_id"]), int(r["seed"]))


def in_item_order(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(records, key=item_order)


def by_prompt(records: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """A cell's records grouped by prompt, the prompts and each prompt's seeds in `item_order`."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in in_item_order(records):
        groups[r["prompt_id"]].append(r)
    return dict(groups)


def _answer(r: dict[str, Any]) -> str | None:
    g = r.get("grade") or {}
    if g.get("grader") == "code":
        return None
    a = g.get("extracted")
    return " ".join(str(a).split()) if a is not None else None


def sample_statistics(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """pass@k for k = 1..k_max and maj@k_max (k_max: the fewest samples any prompt has; errors count as wrong
    samples), the interval of pass@1 over prompts (`prompt_interval`), and the prompts."""
    groups = by_prompt(records)
    if not groups:
        return {"prompts": 0, "samples": 0, "pass_at_k": {}, "maj_at_k": {}, "ci95": [math.nan, math.nan]}
    k_max = min(len(rs) for rs in groups.values())
    per_prompt = [(len(rs), sum(bool(r.get("correct")) for r in rs)) for rs in groups.values()]
    pass_k = {str(k): float(np.mean([pass_at_k(n, c, k) for n, c in per_prompt])) for k in range(1, k_max + 1)}
    code = any((r.get("grade") or {}).get("grader") == "code" for r in records)
    maj = {} if code else {str(k_max): float(np.mean(
        [majority_correct([(_answer(r), bool(r.get("correct"))) for r in rs[:k_max]]) for rs in groups.values()]))}
    return {"prompts": len(groups), "samples": k_max, "pass_at_k": pass_k, "maj_at_k": maj,
            "ci95": prompt_interval([c / n for n, c in per_prompt])}


def forced_statistics(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy of the forced-answer pass (`harness.forced`) over a cell's records (errors: wrong) and its
    interval over prompts, as `ci95` is for pass@1; None for both where the cell had no forced pass
    (a run without --forced-answer, a code dataset)."""
    if not any(r.get("forced_correct") is not None for r in records):
        return {"forced_correct": None, "forced_accuracy": None, "forced_ci95": None}
    hits = [bool(r.get("forced_correct")) for r in records]
    per_prompt = [float(np.mean([bool(r.get("forced_correct")) for r in rs])) for rs in by_prompt(records).values()]
    return {"forced_correct": sum(hits), "forced_accuracy": sum(hits) / len(hits),
            "forced_ci95": prompt_interval(per_prompt)}


def paired_p(pairs_by_prompt: dict[str, list[tuple[bool, bool]]]) -> tuple[float, str]:
    """(two-sided p, test) of method vs baseline from each prompt's (baseline, method) correctness pairs.  One pair
    per prompt: the exact McNemar test.  Several (seeds): the seeds of a prompt are not independent pairs, so the
    test is the exact sign test over prompts of the per-prompt accuracy difference (with one pair per prompt it
    is the exact McNemar test: the same binomial on the prompts that differ)."""
    groups = [g for g in pairs_by_prompt.values() if g]
    if not groups:
        return math.nan, "none"
    if all(len(g) == 1 for g in groups):
        table = [[sum(a and b for (a, b), in groups), sum(a and not b for (a, b), in groups)],
                 [sum(b and not a for (a, b), in groups), sum(not a and not b for (a, b), in groups)]]
        return float(mcnemar(table, exact=True).pvalue), "exact McNemar"
    d = np.array([np.mean([float(b) - float(a) for a, b in g]) for g in groups])
    if np.all(d == 0):  # no prompt differs: nothing against the null
        return 1.0, "sign test over prompts"
    return float(sign_test(d, 0.0)[1]), "sign test over prompts"


def compare(method: Sequence[dict[str, Any]], baseline: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A method against its baseline on the (prompt, seed) items both have: the McNemar table, the p-value of
    `paired_p` (exact McNemar with one seed per prompt; several seeds: a sign test over prompts) and the
    paired bootstrap interval over prompts of the pass@1 difference (method − baseline)."""
    base = {(r["prompt_id"], r["seed"]): bool(r.get("correct")) for r in baseline}
    pairs = [(base[(r["prompt_id"], r["seed"])], bool(r.get("correct"))) for r in method
             if (r["prompt_id"], r["seed"]) in base]
    per_prompt: dict[str, list[tuple[bool, bool]]] = defaultdict(list)
    for r in method:
        if (r["prompt_id"], r["seed"]) in base:
            per_prompt[r["prompt_id"]].append((base[(r["prompt_id"], r["seed"])], bool(r.get("correct"))))
    table = [[sum(a and b for a, b in pairs), sum(a and not b for a, b in pairs)],
             [sum(b and not a for a, b in pairs), sum(not a and not b for a, b in pairs)]]
    p_value, test = paired_p(per_prompt)
    m_groups, b_groups = by_prompt(method), by_prompt(baseline)
    shared = [p for p in m_groups if p in b_groups]
    acc = lambda rs: float(np.mean([bool(r.get("correct")) for r in rs]))  # noqa: E731
    a = [acc(b_groups[p]) for p in shared]
    b = [acc(m_groups[p]) for p in shared]
    return {"pairs": len(pairs), "prompts": len(shared), "mcnemar_table": table, "p_value": p_value, "test": test,
            "mcnemar_p": p_value if test == "exact McNemar" else None,
            "diff": float(np.mean(b) - np.mean(a)) if shared else math.nan,
            "diff_ci95": paired_ci(a, b, lambda x, y: float(np.mean(y) - np.mean(x)))}


def speedup_ci(seq_times: Sequence[float], presto_times: Sequence[float]) -> list[float]:
    """Paired bootstrap 95 % interval of Eq. 20's speedup, mean(sequential) ÷ mean(PreSTO)."""
    pairs = [(s, p) for s, p in zip(seq_times, presto_times) if math.isfinite(s) and math.isfinite(p)]
    if not pairs or sum(p for _, p in pairs) <= 0:
        return [math.nan, math.nan]
    return paired_ci([s for s, _ in pairs], [p for _, p in pairs],
                     lambda x, y: float(np.mean(x) / np.mean(y)) if np.mean(y) > 0 else math.nan)
