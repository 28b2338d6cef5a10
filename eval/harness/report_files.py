"""Write a report folder: report.md (header + tables), summary.json, accuracy_vs_latency.png (the accuracy / time
frontier of every method), speedup.png."""

from __future__ import annotations

import json
import math
import platform
import time
from pathlib import Path
from typing import Any, Sequence

from .report import report_order, summarize
from .report_render import accuracy_latency_figure, render_markdown, speedup_figure
from .runs import strict_json


def _distinct(records: Sequence[dict[str, Any]], field: str) -> list[Any]:
    return list(dict.fromkeys(json.dumps(r.get(field), sort_keys=True) for r in records if r.get(field) is not None))


def header(records: Sequence[dict[str, Any]], run_path: str, command: str) -> list[str]:
    """Provenance: the commands, model, settings, machine load, sandbox mode, timings."""
    loads = [r["load_avg"] for r in records if r.get("load_avg") is not None]
    walls = [r["wall_s"] for r in records if r.get("wall_s") is not None]
    ends = [r["finished_at"] for r in records if r.get("finished_at")]
    span = (max(ends) - min(ends) + (walls[0] if walls else 0)) if ends else math.nan
    listed = report_order(records)  # the tables' order, not the order the lines were written in
    settings = {}
    for r in listed:
        settings.setdefault(r["method"], r.get("settings"))
    lines = [
        "# forerun eval report", "",
        f"Made by: `{command}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
        f"Run file `{run_path}`, written by:", "",
        *[f"- `{json.loads(c)}`" for c in _distinct(records, "command")], "",
        f"- model: {', '.join(json.loads(m) for m in _distinct(records, 'model'))} "
        f"({', '.join(json.loads(d) for d in _distinct(records, 'dtype'))}); backend: "
        f"{', '.join(json.loads(b) for b in _distinct(records, 'backend'))}; machine: {platform.machine()}, "
        f"{platform.python_implementation()} {platform.python_version()}",
        f"- items: {len(records)}; datasets: {', '.join(dict.fromkeys(r['dataset'] for r in listed))}; seeds: "
        f"{', '.join(str(s) for s in sorted(dict.fromkeys(r['seed'] for r in listed)))}",
        f"- generation time, all items: {sum(walls):.1f} s; first to last line: {span:.1f} s",
        f"- machine load (1-min load average when each line was written): mean {sum(loads) / len(loads):.2f}, "
        f"max {max(loads):.2f}" if loads else "- machine load: not recorded",
        *[f"- code sandbox: {json.loads(s)}" for s in _distinct(records, "sandbox")],
        *_gpqa_shuffle_line(records),
        "", "Settings per method:", "",
        *[f"- {m}: `{json.dumps(s)}`" for m, s in settings.items()],
    ]
    return lines


REPORT_FILES = ("report.md", "summary.json", "accuracy_vs_latency.png", "speedup.png")
"""The files `write_report` may write in its folder (each replaced when it is there)."""


def _gpqa_shuffle_line(records: Sequence[dict[str, Any]]) -> list[str]:
    """The seed(s) GPQA's answer choices were shuffled with, where the run has GPQA lines."""
    gpqa = [r for r in records if r.get("dataset") == "gpqa"]
    if not gpqa:
        return []
    seeds = [json.loads(s) for s in _distinct(gpqa, "gpqa_shuffle_seed")]
    if any(r.get("gpqa_shuffle_seed") is None for r in gpqa):  # lines written before forerun recorded it
        seeds.append("not recorded (older lines; forerun eval then always shuffled with 10086)")
    return [f"- GPQA answer-choice shuffle seed: {', '.join(str(s) for s in seeds)}"]


def write_report(records: Sequence[dict[str, Any]], out_dir: Path, *, run_path: str, command: str
                 ) -> tuple[dict[str, Any], list[Path]]:
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(records)
    figures = [out_dir / "accuracy_vs_latency.png"]
    accuracy_latency_figure(summary, figures[0])
    if summary["table7"]:
        figures.append(out_dir / "speedup.png")
        speedup_figure(summary, figures[1])
    md = out_dir / "report.md"
    md.write_text(render_markdown(summary, header(records, run_path, command), [str(f) for f in figures]) + "\n")
    js = out_dir / "summary.json"
    js.write_text(json.dumps(strict_json(summary), allow_nan=False, indent=1) + "\n")
    return summary, [md, js, *figures]
