"""Evaluation prompts: the seven datasets of PreSTO Table 3, loaded offline.

    PreSTO Table 3          name (aliases)                  rows here   offline file (data dir)
    MATH500                 math500                         500         math500.jsonl
    AIME 24&25              aime (aime24+25, aime2425)      60          aime2024.jsonl + aime2025.jsonl
                            aime2024 / aime2025             30 / 30
    HumanEval               humaneval                       164         humaneval.jsonl
    MBPP                    mbpp                            500         mbpp.jsonl, task_id 11-510
    LCB V6                  lcb-v5 (lcb)                    279         lcb.jsonl (release_v5, NOT v6)
                            lcb-v6                          (yours)     lcb_v6.jsonl (not shipped; see below)
    GPQA Diamond            gpqa (gpqa-diamond)             198         gpqa_diamond.csv
    MMLU                    mmlu                            14,042      mmlu_test.jsonl (reordered as HF:
                                                                            subjects alphabetical, stable)

Differences from Table 3, on purpose and documented: AIME 24&25 is listed there with 45 instances; the
offline copies hold all 60 problems (AIME 2024 I+II, then AIME 2025 I+II), and `aime` uses all 60 in that
order (its first 20 prompts are the first 20 of AIME 2024 in the HF `Maxwell-Jia/AIME_2024` order).
MBPP is listed with 257 instances (the *sanitized* test split, whose prompts were rewritten); only the
original full set is available offline, so `mbpp` is its standard test split, task_id 11-510 (500).
LiveCodeBench v6 has no offline copy: `lcb-v5` is release_v5 (public tests only; label results "lcb-v5").
A release_v6 file with the same schema (`livecodebench/code_generation_lite` rows: question_content,
public_test_cases, starter_code) is accepted when given: as `lcb_v6.jsonl` in the data directory, or any path
through `load_prompts("lcb-v6", file=PATH)` (`forerun eval --dataset-file lcb-v6=PATH`); its results are
labelled "lcb-v6".

Where the files come from (`resolve_data_dir`): an explicit `data_dir` > env `FORERUN_DATA_DIR` >
`shared/datasets` found by walking up from this package's source folder (a checkout with `shared/`
beside or inside it) > the packaged 20-prompt slices in `forerun/eval/datasets/data/` (MATH500, HumanEval, MBPP,
MMLU, AIME 2024/2025 only; provenance in `data/PROVENANCE.md`).  GPQA and LCB are never packaged.
`hub=True` reads the Hugging Face datasets of Table 3 instead (`hub.py`), only when the `datasets`
package is importable (it is not a forerun dependency) and the hub is reachable.

GPQA answer choices are shuffled at load time, per question, with a `random.Random` seeded from
sha256(f"{seed}:{Record ID}") (default seed 10086, the paper's seed, Table 6): the order does not depend on
which rows or how many are loaded.  Malformed rows raise `DatasetError` naming the file and line; so does a file
that is not UTF-8 text (with the offset of its first bad byte).
"""


from __future__ import annotations

import contextlib
import csv
import hashlib
import importlib.resources
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ...programs.random_streams import PAPER_SEED
from .hub import read_hub
from .parsers import (MBPP_TEST_IDS, as_aime, parse_aime2024, parse_aime2025, parse_gpqa, parse_humaneval, parse_lcb,
                      parse_math500, parse_mbpp, parse_mmlu, require_field)
from .prompt import Prompt
from .registry import DATASETS, DatasetError, DatasetSpec, dataset_spec
from .utf8 import first_bad_byte

PACKAGED_SLICE_SIZE = 20
"""Prompts per packaged slice: the paper's evaluation slice, the first 20 prompts (Table 6)."""
GPQA_SHUFFLE_SEED = PAPER_SEED
"""Default seed of the per-question GPQA choice shuffle (the paper's seed, Table 6)."""
DATA_DIR_ENV = "FORERUN_DATA_DIR"


# -- data directory -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DataSource:
    """Where prompts are read from: a data directory, or the packaged slices (`packaged=True`)."""

    path: Path
    packaged: bool
    origin: str
    """How it was chosen: "argument", "env", "checkout", "packaged"."""


def packaged_data_dir() -> Path:
    """The folder holding the packaged 20-prompt slices (`forerun/eval/datasets/data`)."""
    return Path(str(importlib.resources.files("forerun.eval.datasets") / "data"))


def _checkout_data_dir(max_levels: int = 4) -> Path | None:
    here = Path(__file__).resolve().parent
    for parent in [here, *here.parents][: max_levels + 1]:
        cand = parent / "shared" / "datasets"
        if cand.is_dir():
            return cand
    return None


def resolve_data_dir(data_dir: str | os.PathLike[str] | None = None) -> DataSource:
    """explicit `data_dir` > env FORERUN_DATA_DIR > `shared/datasets` near the checkout > packaged slices."""
    if data_dir is not None:
        path = Path(data_dir).expanduser()
        if not path.is_dir():
            raise DatasetError(f"data_dir {str(path)!r} is not a directory")
        return DataSource(path, False, "argument")
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise DatasetError(f"{DATA_DIR_ENV}={env!r} is not a directory")
        return DataSource(path, False, "env")
    found = _checkout_data_dir()
    if found is not None:
        return DataSource(found, False, "checkout")
    return DataSource(packaged_data_dir(), True, "packaged")


# -- readers ----------------------------------------------------------------------------------------------
def _not_utf8(path: Path) -> DatasetError:
    """The error for a file the text reader could not decode: its first byte that is not UTF-8, by offset and line
    (the reader's own UnicodeDecodeError names neither the file nor where in it; a text reader decodes ahead of the
    line it returns, so its line count cannot say either).  Read only when that happens."""
    bad = first_bad_byte(path)
    if bad is None:  # pragma: no cover - the file changed since it was read
        return DatasetError(f"{path}: not UTF-8 text")
    return DatasetError(f"{path}: not UTF-8 text ({bad.describe(with_line=True)})")


@contextlib.contextmanager
def _decoding(path: Path) -> Iterator[None]:
    try:
        yield
    except UnicodeDecodeError:
        raise _not_utf8(path) from None


def _iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        fh = open(path, encoding="utf-8-sig")  # -sig: a byte-order mark at the start (an editor's "UTF-8 with BOM")
    except FileNotFoundError as e:
        raise DatasetError(f"dataset file {path} not found") from e
    with fh, _decoding(path):
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}:{lineno}: bad JSON ({e.msg} at column {e.colno})") from e
            if not isinstance(row, dict):
                raise DatasetError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row


def _iter_csv(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        fh = open(path, encoding="utf-8-sig", newline="")  # a BOM would otherwise join the first column's name
    except FileNotFoundError as e:
        raise DatasetError(f"dataset file {path} not found") from e
    with fh, _decoding(path):  # records named by their first line: a quoted field may run over many lines (GPQA's)
        reader = csv.reader(fh)
        start = 1
        try:
            header = next(reader, None)
            while header is not None:
                start = reader.line_num + 1
                fields = next(reader, None)
                if fields is None:
                    return
                if not fields:  # a blank line
                    continue
                if len(fields) != len(header):
                    raise DatasetError(f"{path}:{start}: row has {len(fields)} fields, the header {len(header)}")
                # a CRLF file's line end inside a quoted field is the file's, not text: read as the LF file is
                yield start, {name: value.replace("\r\n", "\n") for name, value in zip(header, fields)}
        except csv.Error as e:
            raise DatasetError(f"{path}:{start}: bad CSV ({e})") from e


def _parsed(spec: DatasetSpec, path: Path, gpqa_seed: int) -> Iterator[tuple[Prompt, str]]:
    """(prompt, "file:line") of every row of one file, in the order the dataset uses."""
    if spec.name == "gpqa":
        yield from ((parse_gpqa(row, f"{path}:{ln}", gpqa_seed), f"{path}:{ln}") for ln, row in _iter_csv(path))
        return
    rows = _iter_jsonl(path)
    if spec.name in ("lcb-v5", "lcb-v6"):
        yield from ((parse_lcb(row, f"{path}:{ln}", i, spec.name), f"{path}:{ln}") for i, (ln, row) in enumerate(rows))
    elif spec.name == "mmlu":
        # HF cais/mmlu "all" order: subjects alphabetical, source order within a subject (stable sort)
        parsed = [(row, ln) for ln, row in rows]
        for ln_row in parsed:
            require_field(ln_row[0], "subject", str, f"{path}:{ln_row[1]}")
        parsed.sort(key=lambda rl: rl[0]["subject"])
        yield from ((parse_mmlu(row, f"{path}:{ln}", i), f"{path}:{ln}") for i, (row, ln) in enumerate(parsed))
    elif spec.name == "mbpp":
        for ln, row in rows:
            p = parse_mbpp(row, f"{path}:{ln}")
            if p.extra["task_id"] in MBPP_TEST_IDS:
                yield p, f"{path}:{ln}"
    else:
        year = spec.name if spec.name != "aime" else path.name.removesuffix(".jsonl")  # aime: its two files
        parse = {"math500": parse_math500, "humaneval": parse_humaneval, "aime2024": parse_aime2024,
                 "aime2025": parse_aime2025}[spec.name if spec.name != "aime" else year]
        yield from ((parse(row, f"{path}:{ln}"), f"{path}:{ln}") for ln, row in rows)


def _read_dir(spec: DatasetSpec, folder: Path, names: tuple[str, ...], gpqa_seed: int) -> list[Prompt]:
    out: list[Prompt] = []
    seen: dict[str, str] = {}
    for fname in names:
        path = folder / fname
        if not path.is_file():
            hint = f" ({spec.note})" if not spec.size else ""
            raise DatasetError(f"dataset {spec.name!r}: file {path} not found{hint}")
        for p, where in _parsed(spec, path, gpqa_seed):
            if p.id in seen:  # one key per (dataset, method, prompt, seed): a repeated id would overwrite a result
                raise DatasetError(f"{where}: prompt id {p.id!r} repeats the one at {seen[p.id]}")
            seen[p.id] = where
            out.append(p)
    if spec.name == "aime":
        out = [as_aime(p) for p in out]
    if not out:  # an empty (or truncated) copy: no run over it means anything
        raise DatasetError(f"dataset {spec.name!r}: {', '.join(str(folder / n) for n in names)} holds no prompts")
    return out


def load_prompts(name: str, *, data_dir: str | os.PathLike[str] | None = None, limit: int | None = None,
                 hub: bool = False, gpqa_seed: int = GPQA_SHUFFLE_SEED,
                 file: str | os.PathLike[str] | None = None) -> list[Prompt]:
    """The first `limit` prompts (all when None) of dataset `name`, in upstream order.

    Reads from `resolve_data_dir(data_dir)`; the packaged slices hold 20 prompts, so asking them for more
    (or for GPQA / LCB, never packaged) raises `DatasetError` naming FORERUN_DATA_DIR.  `file` reads that one
    file instead, in the dataset's schema (datasets stored as one file only; e.g. an LCB release_v6 copy).
    """
    spec = dataset_spec(name)
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if file is not None:
        path = Path(file)
        if len(spec.files) != 1:
            raise DatasetError(f"dataset {spec.name!r} is stored as {len(spec.files)} files "
                               f"({', '.join(spec.files)}): give a data directory instead of one file")
        prompts = _read_dir(spec, path.parent, (path.name,), gpqa_seed)
        return prompts if limit is None else prompts[:limit]
    if hub:
        prompts = read_hub(spec, gpqa_seed)
        return prompts if limit is None else prompts[:limit]
    source = resolve_data_dir(data_dir)
    if source.packaged:
        if not spec.packaged:
            raise DatasetError(f"dataset {spec.name!r} is not packaged (license) and no data directory was found: "
                               f"pass data_dir=... or set {DATA_DIR_ENV} to a folder holding {', '.join(spec.files)}")
        if limit is not None and limit > PACKAGED_SLICE_SIZE:
            raise DatasetError(f"only the first {PACKAGED_SLICE_SIZE} prompts of {spec.name!r} are packaged "
                               f"(asked for {limit}); set {DATA_DIR_ENV} to the full offline datasets")
        if limit is None:
            warnings.warn(f"no data directory found: using the packaged first-{PACKAGED_SLICE_SIZE} slice of "
                          f"{spec.name!r} (set {DATA_DIR_ENV} for the full dataset)", stacklevel=2)
        prompts = _read_dir(spec, source.path, spec.packaged, gpqa_seed)
        if spec.name == "aime":  # 2024's 20 then 2025's 20: keep the full dataset's order
            prompts = prompts[:PACKAGED_SLICE_SIZE]
    else:
        prompts = _read_dir(spec, source.path, spec.files, gpqa_seed)
    return prompts if limit is None else prompts[:limit]


def write_packaged_slices(source_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str],
                          n: int = PACKAGED_SLICE_SIZE) -> dict[str, str]:
    """Copy the first `n` prompts' raw rows of the packageable datasets; returns {file: sha256 of its source}.

    (How `eval/datasets/data/` was made; GPQA and LCB are never written.)
    """
    src, out = Path(source_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shas: dict[str, str] = {}
    for spec in DATASETS.values():
        if not spec.packaged or spec.name == "aime":
            continue
        for fname, pname in zip(spec.files, spec.packaged):
            path = src / fname
            lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
            if spec.name == "mbpp":
                lines = [ln for ln in lines if json.loads(ln)["task_id"] in MBPP_TEST_IDS]
            if spec.name == "mmlu":
                lines = sorted(lines, key=lambda ln: json.loads(ln)["subject"])
            (out / pname).write_text("".join(lines[:n]), encoding="utf-8")
            shas[pname] = hashlib.sha256(path.read_bytes()).hexdigest()
    return shas


__all__ = [
    "DATASETS",
    "DATA_DIR_ENV",
    "DataSource",
    "DatasetError",
    "DatasetSpec",
    "GPQA_SHUFFLE_SEED",
    "PACKAGED_SLICE_SIZE",
    "Prompt",
    "dataset_spec",
    "load_prompts",
    "packaged_data_dir",
    "resolve_data_dir",
    "write_packaged_slices",
]
