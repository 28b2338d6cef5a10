"""Eval runs: an append-only JSONL file, one line per (dataset, method, prompt, seed), resumable.

Durability.  Each finished item is ONE `os.write` of the whole line (JSON + "\\n") to a file descriptor
opened with O_APPEND, then `fsync`.  A kill (SIGINT, SIGKILL, power loss) therefore loses only the items
still running; the only damage it can leave is a trailing partial line (a write the kernel did not finish),
which `load_run` truncates away before resuming - only once every complete line has been read as a forerun
line: a file that is not a run is refused untouched.  A last line that is a whole record lacking only its newline
(a file edited by hand) is a record, kept, and the next write puts the newline first.  Lines are strict JSON
(NaN/inf become null).

The first line is the run's header (`{"forerun_run": 1, ...}`): model, dtype, concurrency and every setting;
`--resume` refuses a run whose header differs in a setting that defines an item's output of a method it runs or
holds (`header_differences`, `settings.settings_used_by`).  An item that
failed after its retries is a line with "error"; a resumed run retries it and appends the new line: the last
line of a key is the item's result (`final_records`).

    record field            meaning
    key                     "dataset|method|prompt_id|seed": what --resume skips
    prompt_sha              the prompt's row (`Prompt.fingerprint`): --resume refuses another under the same id
    messages_sha            the chat the model was shown (`Prompt.messages_fingerprint`): --resume refuses another
    input_sha               the prompt's token ids (`ids_fingerprint`): --resume refuses another tokenizer / template
    response_ids, response  generated token ids and their text
    grade, correct          the grader's verdict (eval.graders.Grade)
    wall_s, call_time_s     generation time; App. D.2 model-call time (see harness.methods)
    num_calls, transitions  model calls; realized MH transitions (MH samplers only)
    settings, model         what produced the line
    forced_*                --forced-answer only: forced_text, forced_correct, forced_tokens, ... (harness.forced)

Only the main thread grades and writes; generation runs in a thread pool of `concurrency` workers (the
embedded engine batches their concurrent requests together; a server spreads them over its workers).
"""

from __future__ import annotations

import errno
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


HEADER_MARK = "forerun_run"
HEADER_VERSION = 1
RESUME_KEYS = ("model", "dtype", "concurrency", "settings", "forced_answers")
"""Header entries a resumed run must share with the run file (settings: the EvalSettings fields its methods use,
`header_differences`;
forced_answers: the forcing texts and budgets of a --forced-answer run, `forced.forcing_header`)."""
HEADER_ADDED = ("forced_answers",)
"""Resume keys added after run files were written: compared only when both headers have one."""
SETTINGS_ADDED = {"forced_answer": False, "smc_final": "sample", "gpqa_shuffle_seed": 10086}
"""Settings added after run files were written: a header without one ran with this value (GPQA's choices were
always shuffled with 10086 before the seed was recorded: a literal, the history, not today's default)."""


def run_header(settings: dict[str, Any], model: str, dtype: str, concurrency: int, **info: Any) -> dict[str, Any]:
    """The first line of a new run file."""
    return {HEADER_MARK: HEADER_VERSION, "model": model, "dtype": dtype, "concurrency": int(concurrency),
            "settings": dict(settings), **info}


def _torn_header(data: bytes) -> bool:
    """One unterminated line that begins as every header line does (`encode_line` of `run_header`): a run killed
    while writing its header, before any item ran; resuming it starts the run afresh."""
    mark, torn = b'{"' + HEADER_MARK.encode() + b'":', data.strip()
    return torn.startswith(mark) or len(torn) > 2 and mark.startswith(torn)


def _whole_record(tail: bytes) -> dict[str, Any] | None:
    """The file's unterminated last line when it is a whole record that only lacks its newline (an edited file saved
    without one); None for a torn line (a header without its newline is a run that never started, `_torn_header`)."""
    try:
        rec = json.loads(tail)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return rec if isinstance(rec, dict) and "key" in rec and rec.get(HEADER_MARK) is None else None


def read_run(path: str | os.PathLike[str], *, repair: bool = True) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(header or None, records) of a run file.  Every complete line must be a forerun line (the header first,
    then records with a 'key'), else `RunFileError` and the file is left untouched; then a trailing partial
    line (from a kill mid-write, the header's included) is truncated away when `repair` (else ignored).  A last
    line that is a whole record without its newline is read as one and kept (`RunWriter` adds the newline before
    it appends): it used to be truncated away as torn, a finished result deleted (and left out of a report)."""
    p = Path(path)
    if not p.exists():
        return None, []
    data = p.read_bytes()
    end = data.rfind(b"\n") + 1
    header, records, first = None, [], True
    for lineno, line in enumerate(data[:end].split(b"\n")[:-1], 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RunFileError(f"{p}:{lineno}: not a forerun run file (not a JSON line: {e})") from None
        if isinstance(rec, dict) and rec.get(HEADER_MARK) is not None and first:  # the first line that is not blank
            header = rec
        elif isinstance(rec, dict) and "key" in rec:
            records.append(rec)
        else:
            raise RunFileError(f"{p}:{lineno}: not a forerun run file (not an eval record)")
        first = False
    whole = _whole_record(data[end:]) if data[end:].strip() else None
    if whole is not None:
        records.append(whole)
    elif end < len(data) and repair:
        if end == 0 and data.strip() and not _torn_header(data):
            raise RunFileError(f"{p}: not a forerun run file (one unterminated line)")
        os.truncate(p, end)  # a torn record, or the torn header of a run killed as it started: nothing was run
    return header, records


def load_run(path: str | os.PathLike[str], *, repair: bool = True) -> list[dict[str, Any]]:
    """The records of a run file (`read_run` without its header)."""
    return read_run(path, repair=repair)[1]


def final_records(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last line of each key, in first-seen key order (a resumed error is replaced by its retry)."""
    records = list(records)
    last = {rec["key"]: rec for rec in records}
    return [last[k] for k in dict.fromkeys(r["key"] for r in records)]


def header_differences(old: dict[str, Any], new: dict[str, Any], settings: Iterable[str] | None = None) -> list[str]:
    """'name (old -> new)' for every resume key, and every setting (those named in `settings` only, when given: the
    ones the run's methods use), on which two headers differ."""
    out = []
    for key in RESUME_KEYS:
        if key == "settings":
            a = {**SETTINGS_ADDED, **(old.get("settings") or {})}
            b = {**SETTINGS_ADDED, **(new.get("settings") or {})}
            names = set(a) | set(b) if settings is None else set(settings)
            out += [f"{k} ({a.get(k)!r} -> {b.get(k)!r})" for k in sorted(names) if a.get(k) != b.get(k)]
        elif key in HEADER_ADDED and (key not in old or key not in new):
            continue
        elif old.get(key) != new.get(key):
            out.append(f"{key} ({old.get(key)!r} -> {new.get(key)!r})")
    return out


def _ends_unterminated(path: Path) -> bool:
    """Whether the regular file `path` is not empty and its last byte is not a newline."""
    try:
        with open(path, "rb") as fh:
            if not fh.seek(0, os.SEEK_END):
                return False
            fh.seek(-1, os.SEEK_END)
            return fh.read(1) != b"\n"
    except OSError:
        return False


class RunWriter:
    """Appends records to a run file: one os.write of the full line on an O_APPEND fd, then fsync."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._newline_first = _ends_unterminated(self.path)  # a whole record without its newline (`read_run`)

    def write(self, record: dict[str, Any]) -> None:
        data = (b"\n" if self._newline_first else b"") + encode_line(record)  # else glued to that line, both lost
        self._newline_first = False
        try:
            n = os.write(self.fd, data)
            os.fsync(self.fd)
        except OSError as exc:  # a full disk, a failing device: the error names the file
            raise OSError(exc.errno, exc.strerror, str(self.path)) from exc
        if n != len(data):  # regular files: only on a full disk; the partial line is repaired on resume
            raise OSError(errno.ENOSPC, f"short write ({n} of {len(data)} bytes)", str(self.path))

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
