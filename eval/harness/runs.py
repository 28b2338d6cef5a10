"""Eval runs: an append-only JSONL file, one line per (dataset, method, prompt, seed), resumable.

Durability.  Each finished item is ONE `os.write` of the whole line (JSON + "\\n") to a file descriptor
opened with O_APPEND, then `fsync`.  A kill (SIGINT, SIGKILL, power loss) therefore loses only the items
still running; the only damage it can leave is a trailing partial line (a write the kernel did not finish),
which `load_run` truncates away before resuming.  Lines are strict JSON (NaN/inf become null).

    record field            meaning
    key                     "dataset|method|prompt_id|seed": what --resume skips
    response_ids, response  generated token ids and their text
    grade, correct          the grader's verdict (eval.graders.Grade)
    wall_s, call_time_s     generation time; App. D.2 model-call time (see harness.methods)
    num_calls, transitions  model calls; realized MH transitions (MH samplers only)
    settings, model         what produced the line

Only the main thread grades and writes; generation runs in a thread pool of `concurrency` workers (the
embedded engine batches their concurrent requests together; a server spreads them over its workers).
"""

from __future__ import annotations

import json
import math
import os
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

TIMING_FIELDS = ("wall_s", "call_time_s", "time_per_call_s", "grade_s", "finished_at")
"""Fields that differ between two runs of the same items (everything else is reproducible)."""


class RunFileError(ValueError):
    """The run file cannot be resumed (corrupt line, not a run file)."""


def item_key(dataset: str, method: str, prompt_id: str, seed: int) -> str:
    return f"{dataset}|{method}|{prompt_id}|{seed}"


def strict_json(value: Any) -> Any:
    """NaN / inf -> None, recursively (tuples become lists), so `json.dumps(allow_nan=False)` succeeds."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return strict_json(value.item())
    return value


def encode_line(record: dict[str, Any]) -> bytes:
    return (json.dumps(strict_json(record), allow_nan=False, ensure_ascii=False) + "\n").encode("utf-8")


def load_run(path: str | os.PathLike[str], *, repair: bool = True) -> list[dict[str, Any]]:
    """The complete records of a run file; a trailing partial line (from a kill mid-write) is truncated
    away when `repair` (else ignored).  A corrupt complete line is an error naming its line number."""
    p = Path(path)
    if not p.exists():
        return []
    data = p.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data) and repair:
        os.truncate(p, end)
    records = []
    for lineno, line in enumerate(data[:end].split(b"\n")[:-1], 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RunFileError(f"{p}:{lineno}: not a JSON line ({e})") from None
        if not isinstance(rec, dict) or "key" not in rec:
            raise RunFileError(f"{p}:{lineno}: not an eval record (no 'key')")
        records.append(rec)
    return records


class RunWriter:
    """Appends records to a run file: one os.write of the full line on an O_APPEND fd, then fsync."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        data = encode_line(record)
        n = os.write(self.fd, data)
        if n != len(data):  # regular files: only on a full disk; the partial line is repaired on resume
            raise OSError(f"short write to {self.path} ({n} of {len(data)} bytes)")
        os.fsync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "RunWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass(frozen=True)
class WorkItem:
    """One (dataset, method, prompt, seed) to generate and grade."""

    dataset: str
    method: str
    prompt: Any
    """eval.datasets.Prompt."""
    prompt_index: int
    seed: int

    @property
    def key(self) -> str:
        return item_key(self.dataset, self.method, self.prompt.id, self.seed)


def plan_items(prompts_by_dataset: dict[str, list[Any]], methods: Iterable[str], seeds: Iterable[int]
               ) -> list[WorkItem]:
    """Every item, in a fixed order: dataset, method, prompt, seed."""
    methods, seeds = list(methods), list(seeds)
    return [WorkItem(ds, m, p, i, s) for ds, prompts in prompts_by_dataset.items() for m in methods
            for i, p in enumerate(prompts) for s in seeds]


def run_items(items: list[WorkItem], generate: Callable[[WorkItem], dict[str, Any]],
              finish: Callable[[WorkItem, dict[str, Any]], dict[str, Any]], writer: RunWriter, *,
              concurrency: int = 1, progress: Any = None) -> int:
    """Generate items in a pool (at most `concurrency` in flight), finish (grade) and write each in this
    thread as it completes; returns the number written.  A KeyboardInterrupt propagates after the pool is
    told to stop: lines already written stay, items in flight are lost (resume re-runs them)."""
    pending = iter(items)
    in_flight: dict[Future, WorkItem] = {}
    written = 0
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="forerun-eval")
    try:
        while True:
            while len(in_flight) < concurrency:
                item = next(pending, None)
                if item is None:
                    break
                in_flight[pool.submit(generate, item)] = item
            if not in_flight:
                break
            done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
            for fut in done:
                item = in_flight.pop(fut)
                record = finish(item, fut.result())
                record["finished_at"] = time.time()
                writer.write(record)
                written += 1
                if progress is not None:
                    progress.set_postfix_str(f"{item.dataset} {item.method}", refresh=False)
                    progress.update(1)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return written
