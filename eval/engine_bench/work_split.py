"""`forerun bench work-split`: how the native kernels' threads share a matrix product, measured side by side.

Each linear call splits its weight panels between the threads.  The static split gives every thread an equal
contiguous share, so a thread that runs slower for a moment (a vCPU shared with another tenant, a burst of
memory traffic) holds the other at the barrier that ends every call, ~120 times per decode step.  Work stealing
(the default, `kernels.set_work_stealing`) starts from the same shares and lets a thread that is done take the
back half of what another has not started.  The bits never depend on the split (every output is one chain).

    what is measured                     code
    a decode step of r rows              roofline.time_rows: `tokens` tokens per row from one cached prompt
    static vs stealing, paired           each repetition times both splits back to back (order alternating), so a
                                         drift of the machine's speed hits both alike
    a busy neighbour                     a process spinning `duty` of every 10 ms on the last CPU (none at 0)
    the result per (duty, rows)          medians of each split, the median of the paired differences, the ratio
                                         static / stealing of the medians, and how many pairs stealing won
"""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator

from ...programs.prompts import chat_prompt_ids
from ...runtime_ext.engine import EngineConfig
from ...runtime_ext.protocol import check_parallel_sequences
from ...runtime_ext.runtime import open_runtime
from .bench import BENCH_PROMPT
from .roofline import native_kernels, time_rows

_NEIGHBOUR = """
import os, sys, time
duty, period, parent = float(sys.argv[1]), 0.01, int(sys.argv[2])
while os.getppid() == parent:
    t = time.perf_counter()
    while time.perf_counter() - t < duty * period:
        pass
    time.sleep((1 - duty) * period)
"""
"""The neighbour process: busy `duty` of every 10 ms period, asleep the rest; it ends when its parent does (even a
parent killed without its `finally`)."""


@dataclass(frozen=True)
class WorkSplitConfig:
    """Settings of `forerun bench work-split`."""

    model: str = "default"
    dtype: str | None = None
    rows: tuple[int, ...] = (1, 6, 20)
    """Decode rows per step."""
    repeats: int = 21
    """Pairs (static, stealing) per row count and neighbour duty."""
    tokens: int = 8
    """Tokens each row decodes per timing: short timings, many pairs (the machine's speed drifts)."""
    neighbour_duties: tuple[float, ...] = (0.0, 0.3)
    """Busy fraction of the neighbour on the last CPU; 0 runs without one."""

    def __post_init__(self) -> None:
        if not self.rows or min(self.rows) < 1 or self.repeats < 1 or self.tokens < 1:
            raise ValueError("rows, repeats and tokens must be >= 1")
        for r in self.rows:  # each row is a request of one batch: --rows 1e14 hung building them
            check_parallel_sequences("rows", r)
        if not self.neighbour_duties or any(not 0.0 <= d < 1.0 for d in self.neighbour_duties):
            raise ValueError(f"neighbour_duties must be in [0, 1), got {list(self.neighbour_duties)}")


@contextmanager
def neighbour(duty: float) -> Iterator[str]:
    """A process busy `duty` of the time on the last CPU while the block runs; yields what ran ("none" at 0)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if duty <= 0.0 or len(cpus) < 2:
        yield "none" if duty <= 0.0 else "none (fewer than 2 CPUs)"
        return
    proc = subprocess.Popen([sys.executable, "-c", _NEIGHBOUR, repr(duty), str(os.getpid())], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        os.sched_setaffinity(proc.pid, {cpus[-1]})
        yield f"busy {100 * duty:.0f} % of the time on CPU {cpus[-1]}"
    finally:
        proc.kill()
        proc.wait()


def paired_summary(static: list[float], stealing: list[float]) -> dict[str, Any]:
    """Seconds per step of each split (same repetitions, in order) -> the medians and the paired comparison."""
    diffs = [b - a for a, b in zip(static, stealing)]
    med_static, med_stealing = statistics.median(static), statistics.median(stealing)
    return {"static_step_s": med_static, "stealing_step_s": med_stealing,
            "median_paired_difference_s": statistics.median(diffs),
            "static_over_stealing": med_static / med_stealing if med_stealing > 0 else math.nan,
            "stealing_faster_in": sum(d < 0 for d in diffs), "pairs": len(diffs)}


def run_work_split(config: WorkSplitConfig = WorkSplitConfig(),
                   progress: Callable[[], None] | None = None) -> dict[str, Any]:
    """Every (neighbour duty, rows) of `config`, static against stealing (see module docstring)."""
    runtime = open_runtime(config.model, config.dtype, engine_config=EngineConfig(max_total_tokens=32768))
    with runtime:
        engine = runtime.engine
        kernels = native_kernels(engine)
        if kernels is None:
            raise ValueError("bench work-split needs the native kernels (this model runs on the transformers path)")
        prompt = chat_prompt_ids(runtime.loaded.tokenizer, BENCH_PROMPT)
        longest, limit = len(prompt) + config.tokens, runtime.loaded.max_context
        if longest > limit:  # bad input, before any timing (the engine refused each request: exit 1, no option named)
            raise ValueError(f"--tokens {config.tokens}: prompt ({len(prompt)} tokens) + response ({config.tokens} "
                             f"tokens) = {longest} exceeds the model context {limit}")
        before = bool(kernels.work_stealing())
        table = []
        try:
            for duty in config.neighbour_duties:
                with neighbour(duty) as what:
                    for rows in config.rows:
                        times: dict[bool, list[float]] = {False: [], True: []}
                        for on in (False, True):  # warm-up of this batch size
                            kernels.set_work_stealing(on)
                            time_rows(engine, prompt, rows, config.tokens, 0)
                        for rep in range(1, config.repeats + 1):
                            for on in ((False, True) if rep % 2 else (True, False)):
                                kernels.set_work_stealing(on)
                                times[on].append(time_rows(engine, prompt, rows, config.tokens, rep))
                            if progress is not None:
                                progress()
                        table.append({"neighbour_duty": duty, "neighbour": what, "rows": rows,
                                      **paired_summary(times[False], times[True])})
        finally:
            kernels.set_work_stealing(before)
    return {"model": runtime.loaded.name, "dtype": str(runtime.loaded.dtype).replace("torch.", ""),
            "config": asdict(config), "default_work_stealing": before, "rows": table}


def format_work_split(r: dict[str, Any]) -> str:
    lines = [f"linear work split, {r['model']} ({r['dtype']}), {r['config']['tokens']} tokens per row and timing, "
             f"{r['config']['repeats']} pairs (static, stealing) each; default: "
             f"{'work stealing' if r['default_work_stealing'] else 'static'}",
             f"  {'neighbour':<34} {'rows':>4} {'static ms':>9} {'stealing ms':>11} {'paired diff':>11} "
             f"{'static/stealing':>15} {'stealing won':>12}"]
    for row in r["rows"]:
        lines.append(f"  {row['neighbour']:<34} {row['rows']:>4} {1e3 * row['static_step_s']:>9.2f} "
                     f"{1e3 * row['stealing_step_s']:>11.2f} {1e3 * row['median_paired_difference_s']:>+10.2f} "
                     f"{row['static_over_stealing']:>14.3f}x {row['stealing_faster_in']:>7}/{row['pairs']}")
    return "\n".join(lines)
