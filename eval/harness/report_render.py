"""Markdown tables and PNG figures of `harness.report.summarize` (matplotlib, Agg backend)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from .intervals import NO_SPREAD


def _f(x: Any, fmt: str = ".2f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return format(x, fmt)


def _pct(x: float) -> str:
    return "–" if x is None or math.isnan(x) else f"{100 * x:.0f}"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|",
            *["| " + " | ".join(r) + " |" for r in rows]]


def sampler_table(summary: dict[str, Any]) -> list[str]:
    """The every-sampler table (`frontier`): per scope and method, pass@1 [interval], tokens and time per answer,
    and a mark where the method is on the accuracy / time Pareto frontier of its scope."""
    mark = {True: "yes", False: "", None: "–"}
    rows = [[r["scope"], r["method"], str(r["answers"]), f"{_pct(r['pass_at_1'])} [{_pct(r['ci95'][0])}, "
             f"{_pct(r['ci95'][1])}]", _f(r["tokens_decoded"], ".0f"), _f(r["wall_s"]), mark[r["frontier"]]]
            for r in summary["samplers"]]
    return _table(["dataset", "method", "answers", "pass@1 % [95 % CI]", "tokens decoded / answer",
                   "wall s / answer", "Pareto frontier"], rows)


def accuracy_table(summary: dict[str, Any]) -> list[str]:
    """Per dataset × method: pass@1 with its bootstrap interval over prompts, pass@k and maj@k, errors."""
    forced = bool(summary.get("forced_answer"))
    rows = []
    for c in summary["cells"]:
        lo, hi = c["ci95"]
        ks = [k for k in c["pass_at_k"] if k != "1"]
        rows.append([c["dataset"], c["method"], f"{c['correct']}/{c['n']}", str(c["samples"]),
                     f"{_pct(c['pass_at_k'].get('1', math.nan))} [{_pct(lo)}, {_pct(hi)}]",
                     *([forced_cell(c)] if forced else []),
                     ", ".join(f"@{k} {_pct(c['pass_at_k'][k])}" for k in ks) or "–",
                     ", ".join(f"@{k} {_pct(v)}" for k, v in c["maj_at_k"].items()) or "–",
                     _f(c["tokens_decoded"], ".0f"), *([_f(c.get("forced_tokens"), ".0f")] if forced else []),
                     str(c["errors"])])
    return _table(["dataset", "method", "correct/n", "samples", "pass@1 % [95 % CI]",
                   *(["forced answer % [95 % CI]"] if forced else []), "pass@k %", "maj@k %", "tokens decoded",
                   *(["forced-pass tokens"] if forced else []), "errors"], rows)


def forced_cell(cell: dict[str, Any]) -> str:
    """The forced-answer column of a cell: accuracy [interval] in %, or – (no forced pass: code)."""
    if cell.get("forced_accuracy") is None:
        return "–"
    lo, hi = cell["forced_ci95"]
    return f"{_pct(cell['forced_accuracy'])} [{_pct(lo)}, {_pct(hi)}]"


def comparison_table(summary: dict[str, Any]) -> list[str]:
    rows = [[c["dataset"], c["method"], c["baseline"], str(c["pairs"]), _f(100 * c["diff"], "+.1f"),
             f"[{_f(100 * c['diff_ci95'][0], '+.1f')}, {_f(100 * c['diff_ci95'][1], '+.1f')}]",
             f"{_f(c['p_value'], '.3g')} ({c['test']})"] for c in summary["comparisons"]]
    return _table(["dataset", "method", "baseline", "pairs", "Δ pass@1 (pts)", "paired bootstrap 95 %",
                   "p (test: exact McNemar; several seeds: sign test over prompts)"], rows)


def cost_table(summary: dict[str, Any]) -> list[str]:
    rows = [[c["dataset"], c["method"], str(c["n"]), _f(c["wall_s"]), _f(c["call_time_s"]), _f(c["calls"], ".1f"),
             _f(c["transitions_per_call"]), _f(c["response_tokens"], ".0f"), _f(c["log_likelihood"], ".3f"),
             _f(c["confidence"], ".3f"), str(c["errors"])] for c in summary["cells"]]
    return _table(["dataset", "method", "n", "wall (s)", "call time (s)", "calls", "transitions/call", "tokens",
                   "log-lik (Eq. 21)", "confidence (Eq. 22)", "errors"], rows)


def table7(summary: dict[str, Any]) -> list[str]:
    rows = []
    for r in summary["table7"]:
        tt, sd, tpc, tc = r["total_time_s"], r["total_time_std_s"], r["transitions_per_call"], r["time_per_call_s"]
        rows.append([r["dataset"], f"{r['sampler']} / {r['presto']}", str(r["pairs"]),
                     f"{_f(tt[0])}±{_f(sd[0])} / {_f(tt[1])}±{_f(sd[1])}", f"{_f(tpc[0])} / {_f(tpc[1])}",
                     f"{_f(tc[0], '.3f')} / {_f(tc[1], '.3f')}",
                     f"{_f(r['speedup_eq20'])}× [{_f(r['speedup_ci95'][0])}, {_f(r['speedup_ci95'][1])}]",
                     f"{_f(r['reduction_in_calls'])}×", f"{_f(r['increase_in_time_per_call'])}×",
                     f"{r['identical_chains']}/{r['pairs']}"])
    return _table(["dataset", "sampler / PreSTO", "pairs", "total time (s) ↓", "transitions per call ↑",
                   "time/call (s) ↓", "speedup (Eq. 20) [95 % CI]", "calls ÷", "time/call ×", "identical chains"], rows)


def tost_table(summary: dict[str, Any]) -> list[str]:
    rows = [[r["dataset"], r["presto"], r["statistic"], str(r["n"]), _f(r["mean_diff"], ".4f"), _f(r["delta"], ".4f"),
             _f(r["p_eq"], ".3g"), {True: "yes", False: "no", None: "n/a"}[r["equivalent"]], r.get("note", "")]
            for r in summary["tost"]]
    rows += [["pooled", r["presto"], r["statistic"], str(r["n"]), _f(r["mean_diff_sd"], ".4f") + " sd",
              "0.2 sd", _f(r["p_eq"], ".3g"), {True: "yes", False: "no", None: "n/a"}[r["equivalent"]],
              r.get("note", "")]
             for r in summary["tost_pooled"]]
    return _table(["dataset", "PreSTO vs sequential", "statistic", "prompts", "mean diff", "δ", "p_eq", "equivalent",
                   "note"], rows)


FORCED_NOTE = (" Forced answer (--forced-answer): after each response, cut at its first EOS, a forcing text "
               "(math: \"Final answer: $\\boxed{\", multiple choice: \"The answer is (\") and a short greedy "
               "continuation, graded like a response (math: the continuation up to the close of the box it opens; "
               "multiple choice: up to the end of its first line); errors count as wrong; code datasets get no "
               "forced pass (–); its tokens are apart from tokens decoded.")


def render_markdown(summary: dict[str, Any], header: Sequence[str], figures: Sequence[str]) -> str:
    lines = [*header, ""]
    if summary.get("selection_rules"):
        lines += ["Selection rules:", "", *[f"- {line}" for line in summary["selection_rules"].values()], ""]
    if summary.get("samplers"):
        common = summary.get("sampler_datasets") or []
        lines += ["## Every sampler: accuracy, tokens and wall time per answer", "",
                  f"Same prompts for every method; dataset \"all\": {', '.join(common) or 'none shared'} pooled "
                  "(its interval counts (dataset, prompt) clusters).  Pareto frontier: no other method on the same "
                  "dataset (or on \"all\") is at least as accurate and at least as fast per answer, one of the two "
                  "strictly; errors count as wrong answers.  Figure: accuracy_vs_latency.png.", "",
                  *sampler_table(summary), ""]
    lines += ["## Accuracy", "",
             "pass@k: unbiased estimator over each prompt's samples; interval: Wilson score interval of k of P "
             "prompts when every prompt's samples are all right or all wrong, else bootstrap over prompts (samples "
             "nested in their prompt); errors count as wrong answers; tokens decoded: every token the method "
             "decoded per answer, rejected proposals included." + (FORCED_NOTE if summary.get("forced_answer") else ""),
             "", *accuracy_table(summary), ""]
    if summary["comparisons"]:
        lines += ["## Each method against its baseline (paired, errors as wrong answers)", "",
                  f"An interval of –: {NO_SPREAD}; the test's p says what the pairs can.", "",
                  *comparison_table(summary), ""]
    lines += ["## Cost per item (means)", "",
              "wall = generation time of the item (every model call); call time = App. D.2 model-call time (MH: "
              "MH calls only, block extensions excluded); calls = model calls counted as in Table 7.", "",
              *cost_table(summary), ""]
    if summary["table7"]:
        lines += ["## PreSTO vs sequential (Table 7 layout; cells sequential / PreSTO)", "",
                  "speedup = Eq. 20 (ratio of mean cumulative model-call time); calls ÷ = reduction in calls; "
                  "time/call × = increase in time per call (speedup = calls ÷ / time/call ×).", "",
                  *table7(summary), "",
                  "## Paired TOST equivalence, PreSTO − sequential (Eq. 23; δ = 0.2 sd of the sequential "
                  "statistic; equivalent when p_eq < 0.05)", "", *tost_table(summary), ""]
    if summary["errors"]:
        lines += ["## Errors", "", *[f"- `{e['key']}`: {e['error']}" for e in summary["errors"]], ""]
    lines += ["## Figures", "", *[f"![{Path(f).stem}]({Path(f).name})" for f in figures], ""]
    return "\n".join(lines)


def accuracy_latency_figure(summary: dict[str, Any], path: Path) -> None:
    """The frontier plot: one panel per scope of the every-sampler table (all datasets first), each method one
    point (pass@1 with its interval against mean wall time per answer, log scale), labelled, filled where it is on
    the scope's Pareto frontier, drawn as a step line (the best accuracy reached within each time)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows = [r for r in summary["samplers"] if r["answers"] and r["frontier"] is not None]
    scopes = list(dict.fromkeys(r["scope"] for r in rows)) or ["(no answers)"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    cols = min(3, len(scopes))
    nrows = math.ceil(len(scopes) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.5 * cols, 4.2 * nrows), squeeze=False)
    colors = {m: plt.cm.tab20(i % 20) for i, m in enumerate(methods)}
    for ax, scope in zip(axes.flat, scopes):
        here = [r for r in rows if r["scope"] == scope]
        for r in here:
            acc, (lo, hi) = 100 * r["pass_at_1"], r["ci95"]
            ax.errorbar([r["wall_s"]], [acc], yerr=[[acc - 100 * lo], [100 * hi - acc]], fmt="o",
                        color=colors[r["method"]], capsize=2, ms=6 if r["frontier"] else 4,
                        mec="black" if r["frontier"] else colors[r["method"]],
                        mfc=colors[r["method"]] if r["frontier"] else "none")  # filled: on the frontier
            ax.annotate(r["method"], (r["wall_s"], acc), xytext=(2, 4), textcoords="offset points", fontsize=6,
                        rotation=60, rotation_mode="anchor")  # slanted: close times do not overwrite each other
        front = sorted((r["wall_s"], 100 * r["pass_at_1"]) for r in here if r["frontier"])
        if front:
            right = max(r["wall_s"] for r in here)
            xs, ys = [t for t, _ in front] + [right], [a for _, a in front] + [front[-1][1]]
            ax.step(xs, ys, where="post", color="black", lw=1, alpha=0.6, label="Pareto frontier")
            ax.legend(fontsize=7, loc="upper left")
        ax.set_xscale("log")
        ax.margins(x=0.25)  # room for the labels of the slowest methods
        ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # no overlapping minor labels
        ax.set_title("all datasets" if scope == "all" else scope)
        ax.set_xlabel("mean wall time per answer (s, log scale)")
        ax.set_ylabel("pass@1 (%)")
        ax.set_ylim(-5, 105)
    for ax in list(axes.flat)[len(scopes):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def speedup_figure(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = summary["table7"]
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    variants = list(dict.fromkeys(r["presto"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(datasets) + 2), 3.6))
    width = 0.8 / max(1, len(variants))
    x = np.arange(len(datasets))
    for i, v in enumerate(variants):
        vals = [next((r["speedup_eq20"] for r in rows if r["dataset"] == d and r["presto"] == v), np.nan)
                for d in datasets]
        ax.bar(x + i * width - 0.4 + width / 2, vals, width, label=f"{v} vs {v.removeprefix('presto-')}")
    ax.axhline(1.0, color="gray", lw=1, ls="--")
    ax.set_xticks(x, datasets, rotation=20)
    ax.set_ylabel("speedup (Eq. 20)")
    ax.set_title("PreSTO vs sequential: ratio of mean model-call time")
    if variants:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
