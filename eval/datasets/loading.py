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
beside or inside it) > the packaged 20-prompt slices in `forerun/eval/data/` (MATH500, HumanEval, MBPP,
MMLU, AIME 2024/2025 only; provenance in `data/PROVENANCE.md`).  GPQA and LCB are never packaged.
`hub=True` reads the Hugging Face datasets of Table 3 instead (`datasets_hub.py`), only when the `datasets`
package is importable (it is not a forerun dependency) and the hub is reachable.

GPQA answer choices are shuffled at load time, per question, with a `random.Random` seeded from
sha256(f"{seed}:{Record ID}") (default seed 10086, the paper's seed, Table 6): the order does not depend on
which rows or how many are loaded.  Malformed rows raise `DatasetError` naming the file and line.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import importlib.resources
import json
import os
import random
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

PACKAGED_SLICE_SIZE = 20
"""Prompts per packaged slice: the paper's evaluation slice, the first 20 prompts (Table 6)."""
GPQA_SHUFFLE_SEED = 10086
"""Default seed of the per-question GPQA choice shuffle (the paper's seed, Table 6)."""
DATA_DIR_ENV = "FORERUN_DATA_DIR"
LETTERS = "ABCDEFGHIJ"


class DatasetError(ValueError):
    """A dataset file or row is missing or malformed (the message names the file and line)."""


@dataclass(frozen=True)
class Prompt:
    """One evaluation prompt."""

    dataset: str
    """Registry name of the dataset (e.g. "math500", "lcb-v5")."""
    id: str
    """Upstream identifier (unique_id, ID, task_id, Record ID, ...)."""
    question: str
    """The problem text as upstream wrote it (for code: the function stub / task description)."""
    answer: str | None
    """Gold answer for graders: math answer string, MC letter, or reference code; None when there is none."""
    choices: tuple[str, ...] | None = None
    """Answer options in presentation order (multiple-choice only)."""
    extra: dict[str, Any] = field(default_factory=dict, hash=False, compare=True)
    """Dataset-specific fields graders need (tests, entry_point, subject, answer_index, ...)."""

    @property
    def category(self) -> str:
        """"math", "code" or "mc"."""
        return DATASETS[self.dataset].category

    @property
    def text(self) -> str:
        """The problem text (alias of `question`)."""
        return self.question

    def user_message(self) -> str:
        """The instruction text sent as the user turn (see the module docstring for the formats)."""
        return _USER_MESSAGE[self.category](self)

    def messages(self) -> list[dict[str, str]]:
        """Chat messages: one user turn holding `user_message()`."""
        return [{"role": "user", "content": self.user_message()}]

    def chat_prompt(self, tokenizer: Any) -> str:
        """The user turn rendered with the tokenizer's chat template, ready for the assistant's answer."""
        return tokenizer.apply_chat_template(self.messages(), tokenize=False, add_generation_prompt=True)


def _math_message(p: Prompt) -> str:
    return f"{p.question.strip()}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."


def _mc_message(p: Prompt) -> str:
    if not p.choices:
        raise DatasetError(f"{p.dataset} prompt {p.id} has no choices")
    options = "\n".join(f"{LETTERS[i]}) {c.strip()}" for i, c in enumerate(p.choices))
    return (f"Answer the following multiple-choice question.\n\n{p.question.strip()}\n\n{options}\n\n"
            f"Think step by step, then give the letter of the correct option within \\boxed{{}}, "
            f"for example \\boxed{{A}}.")


def _code_message(p: Prompt) -> str:
    if p.dataset == "humaneval":
        return ("Complete the following Python function. Give the whole function, including its signature, "
                f"in one ```python code block.\n\n```python\n{p.question}```")
    if p.dataset == "mbpp":
        tests = "\n".join(p.extra.get("test_list", ()))
        return (f"{p.question.strip()}\nYour code should pass these tests:\n\n{tests}\n\n"
                "Write the Python solution in one ```python code block.")
    starter = p.extra.get("starter_code") or ""
    if starter.strip():
        how = ("Complete the following starter code; your solution must define it exactly as given:\n\n"
               f"```python\n{starter.rstrip()}\n```")
    else:
        how = "Your program must read the input from standard input and write the answer to standard output."
    return (f"Solve the following programming problem in Python.\n\n{p.question.strip()}\n\n{how}\n\n"
            "Give the complete solution in one ```python code block.")


_USER_MESSAGE: dict[str, Callable[[Prompt], str]] = {"math": _math_message, "mc": _mc_message, "code": _code_message}


# -- rows -> prompts ---------------------------------------------------------------------------------
def _need(row: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if key not in row or row[key] is None:
        raise DatasetError(f"{where}: missing field {key!r}")
    val = row[key]
    if not isinstance(val, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise DatasetError(f"{where}: field {key!r} must be {names}, got {type(val).__name__}")
    return val


def _math500(row: dict, where: str) -> Prompt:
    uid = _need(row, "unique_id", str, where)
    return Prompt("math500", uid, _need(row, "problem", str, where), str(_need(row, "answer", (str, int), where)),
                  extra={"subject": uid.split("/")[1] if uid.count("/") >= 2 else None})


def _aime2024(row: dict, where: str) -> Prompt:
    return Prompt("aime2024", _need(row, "ID", str, where), _need(row, "Problem", str, where),
                  str(_need(row, "Answer", (int, str), where)), extra={"year": 2024})


def _aime2025(row: dict, where: str) -> Prompt:
    return Prompt("aime2025", _need(row, "id", str, where), _need(row, "problem", str, where),
                  str(_need(row, "answer", (str, int), where)), extra={"year": 2025})


def _humaneval(row: dict, where: str) -> Prompt:
    prompt = _need(row, "prompt", str, where)
    return Prompt("humaneval", _need(row, "task_id", str, where), prompt,
                  _need(row, "canonical_solution", str, where),
                  extra={"prompt": prompt, "entry_point": _need(row, "entry_point", str, where),
                         "test": _need(row, "test", str, where)})


def _mbpp(row: dict, where: str) -> Prompt:
    tid = _need(row, "task_id", int, where)
    tests = _need(row, "test_list", list, where)
    return Prompt("mbpp", str(tid), _need(row, "text", str, where), _need(row, "code", str, where),
                  extra={"task_id": tid, "test_list": list(tests), "test_setup_code": row.get("test_setup_code") or "",
                         "challenge_test_list": list(row.get("challenge_test_list") or [])})


_FUNC_NAME = re.compile(r"^\s*def\s+([A-Za-z_]\w*)\s*\(", re.MULTILINE)


def _lcb(row: dict, where: str, index: int, name: str = "lcb-v5") -> Prompt:
    """One LiveCodeBench row; `name` is "lcb-v5" or "lcb-v6" (the release the file holds)."""
    raw = _need(row, "public_test_cases", (str, list), where)
    try:
        tests = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as e:
        raise DatasetError(f"{where}: public_test_cases is not valid JSON ({e})") from e
    if not isinstance(tests, list) or not all(isinstance(t, dict) and {"input", "output"} <= set(t) for t in tests):
        raise DatasetError(f"{where}: public_test_cases must be a list of {{input, output, testtype}} objects")
    starter = row.get("starter_code") or ""
    m = _FUNC_NAME.search(starter)
    return Prompt(name, f"{name}-{index}", _need(row, "question_content", str, where), None,
                  extra={"tests": tests, "starter_code": starter, "func_name": m.group(1) if m else None,
                         "testtype": tests[0].get("testtype") if tests else None,
                         "release": "release_" + name.rsplit("-", 1)[1]})


def _mmlu(row: dict, where: str, index: int) -> Prompt:
    choices = _need(row, "choices", list, where)
    ans = _need(row, "answer", int, where)
    if not 0 <= ans < len(choices):
        raise DatasetError(f"{where}: answer index {ans} outside the {len(choices)} choices")
    subject = _need(row, "subject", str, where)
    return Prompt("mmlu", f"mmlu-{index}", _need(row, "question", str, where), LETTERS[ans],
                  choices=tuple(str(c) for c in choices), extra={"subject": subject, "answer_index": ans})


def _gpqa(row: dict, where: str, seed: int) -> Prompt:
    rid = _need(row, "Record ID", str, where)
    correct = _need(row, "Correct Answer", str, where).strip()
    options = [correct] + [_need(row, f"Incorrect Answer {k}", str, where).strip() for k in (1, 2, 3)]
    order = list(range(4))
    digest = hashlib.sha256(f"{seed}:{rid}".encode()).digest()
    random.Random(int.from_bytes(digest[:8], "big")).shuffle(order)
    choices = tuple(options[i] for i in order)
    ans = order.index(0)
    return Prompt("gpqa", rid, _need(row, "Question", str, where).strip(), LETTERS[ans], choices=choices,
                  extra={"answer_index": ans, "subdomain": row.get("Subdomain"),
                         "domain": row.get("High-level domain"), "shuffle_seed": seed})


# -- registry ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DatasetSpec:
    """One entry of `DATASETS`."""

    name: str
    category: str
    files: tuple[str, ...]
    """File names in the data directory."""
    packaged: tuple[str, ...]
    """File names of the packaged slices (empty: never packaged)."""
    size: int
    """Rows of the full offline copy (0: no offline copy ships; the user supplies the file)."""
    hf: str
    """Hugging Face source (Table 3), for `hub=True`."""
    aliases: tuple[str, ...] = ()
    note: str = ""


DATASETS: dict[str, DatasetSpec] = {
    s.name: s
    for s in (
        DatasetSpec("math500", "math", ("math500.jsonl",), ("math500.jsonl",), 500, "HuggingFaceH4/MATH-500"),
        DatasetSpec("aime", "math", ("aime2024.jsonl", "aime2025.jsonl"), ("aime2024.jsonl", "aime2025.jsonl"), 60,
                    "Maxwell-Jia/AIME_2024 + MathArena/aime_2025", aliases=("aime24+25", "aime2425", "aime24&25"),
                    note="Table 3 lists 45 instances; all 60 are used (2024 I+II, then 2025 I+II)"),
        DatasetSpec("aime2024", "math", ("aime2024.jsonl",), ("aime2024.jsonl",), 30, "Maxwell-Jia/AIME_2024"),
        DatasetSpec("aime2025", "math", ("aime2025.jsonl",), ("aime2025.jsonl",), 30, "MathArena/aime_2025"),
        DatasetSpec("humaneval", "code", ("humaneval.jsonl",), ("humaneval.jsonl",), 164, "openai/openai_humaneval"),
        DatasetSpec("mbpp", "code", ("mbpp.jsonl",), ("mbpp.jsonl",), 500, "google-research-datasets/mbpp",
                    note="standard test split of the full set (task_id 11-510); Table 3's 257 is the sanitized split"),
        DatasetSpec("lcb-v5", "code", ("lcb.jsonl",), (), 279, "livecodebench/code_generation_lite (release_v5)",
                    aliases=("lcb", "livecodebench"), note="release_v5, public tests only; not LCB v6"),
        DatasetSpec("lcb-v6", "code", ("lcb_v6.jsonl",), (), 0, "livecodebench/code_generation_lite (release_v6)",
                    aliases=("livecodebench-v6",),
                    note="not shipped: release_v6 rows in lcb.jsonl's schema, given as a file"),
        DatasetSpec("gpqa", "mc", ("gpqa_diamond.csv",), (), 198, "Idavidrein/gpqa (gpqa_diamond)",
                    aliases=("gpqa-diamond", "gpqa_diamond"), note="choices shuffled per question at load time"),
        DatasetSpec("mmlu", "mc", ("mmlu_test.jsonl",), ("mmlu.jsonl",), 14042, "cais/mmlu (all, test)"),
    )
}
_ALIASES = {alias: spec.name for spec in DATASETS.values() for alias in (spec.name, *spec.aliases)}


def dataset_spec(name: str) -> DatasetSpec:
    """The registry entry for `name` or one of its aliases (case-insensitive)."""
    key = name.strip().lower()
    if key not in _ALIASES:
        raise KeyError(f"unknown dataset {name!r}; known: {', '.join(sorted(DATASETS))} "
                       f"(aliases: {', '.join(sorted(a for a in _ALIASES if a not in DATASETS))})")
    return DATASETS[_ALIASES[key]]


# -- data directory -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DataSource:
    """Where prompts are read from: a data directory, or the packaged slices (`packaged=True`)."""

    path: Path
    packaged: bool
    origin: str
    """How it was chosen: "argument", "env", "checkout", "packaged"."""


def packaged_data_dir() -> Path:
    """The folder holding the packaged 20-prompt slices (`forerun/eval/data`)."""
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
def _iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        fh = open(path, encoding="utf-8")
    except FileNotFoundError as e:
        raise DatasetError(f"dataset file {path} not found") from e
    with fh:
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
        fh = open(path, encoding="utf-8", newline="")
    except FileNotFoundError as e:
        raise DatasetError(f"dataset file {path} not found") from e
    with fh:
        reader = csv.DictReader(fh)
        try:
            for row in reader:
                if None in row or any(v is None for v in row.values()):
                    raise DatasetError(f"{path}:{reader.line_num}: row has a different number of fields "
                                       "than the header")
                yield reader.line_num, row
        except csv.Error as e:
            raise DatasetError(f"{path}:{reader.line_num}: bad CSV ({e})") from e


def _read_dir(spec: DatasetSpec, folder: Path, names: tuple[str, ...], gpqa_seed: int) -> list[Prompt]:
    out: list[Prompt] = []
    for fname in names:
        path = folder / fname
        if not path.is_file():
            hint = f" ({spec.note})" if not spec.size else ""
            raise DatasetError(f"dataset {spec.name!r}: file {path} not found{hint}")
        if spec.name == "gpqa":
            out.extend(_gpqa(row, f"{path}:{ln}", gpqa_seed) for ln, row in _iter_csv(path))
            continue
        rows = _iter_jsonl(path)
        if spec.name in ("lcb-v5", "lcb-v6"):
            out.extend(_lcb(row, f"{path}:{ln}", i, spec.name) for i, (ln, row) in enumerate(rows))
        elif spec.name == "mmlu":
            # HF cais/mmlu "all" order: subjects alphabetical, source order within a subject (stable sort)
            parsed = [(row, ln) for ln, row in rows]
            for ln_row in parsed:
                _need(ln_row[0], "subject", str, f"{path}:{ln_row[1]}")
            parsed.sort(key=lambda rl: rl[0]["subject"])
            out.extend(_mmlu(row, f"{path}:{ln}", i) for i, (row, ln) in enumerate(parsed))
        elif spec.name == "mbpp":
            for ln, row in rows:
                p = _mbpp(row, f"{path}:{ln}")
                if 11 <= p.extra["task_id"] <= 510:
                    out.append(p)
        else:
            parse = {"math500": _math500, "humaneval": _humaneval}.get(spec.name) or (
                _aime2024 if fname.startswith("aime2024") else _aime2025)
            out.extend(parse(row, f"{path}:{ln}") for ln, row in rows)
    if spec.name == "aime":
        out = [Prompt("aime", p.id, p.question, p.answer, p.choices, p.extra) for p in out]
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
        from .hub import read_hub  # the online reader needs this module's row parsers

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


# -- CLI helpers (for the areas' commands) ----------------------------------------------------------------
def add_dataset_arguments(parser: argparse.ArgumentParser, *, default: str | None = "math500",
                          default_prompts: int | None = PACKAGED_SLICE_SIZE) -> None:
    """Add --dataset, --prompts, --data-dir and --hub to a command's parser."""
    names = sorted(_ALIASES)
    parser.add_argument("--dataset", default=default, choices=names, metavar="NAME",
                        help=f"dataset ({', '.join(sorted(DATASETS))}; default {default})")
    parser.add_argument("--prompts", type=int, default=default_prompts,
                        help=f"first N prompts (default {default_prompts}; the paper uses the first 20)")
    parser.add_argument("--data-dir", default=None,
                        help=f"offline datasets folder (default: ${DATA_DIR_ENV}, ../shared/datasets, packaged slices)")
    parser.add_argument("--hub", action="store_true",
                        help="read the Hugging Face datasets (needs the `datasets` package and network)")


def prompts_from_args(args: argparse.Namespace) -> list[Prompt]:
    """`load_prompts` for the arguments added by `add_dataset_arguments`."""
    return load_prompts(args.dataset, data_dir=args.data_dir, limit=args.prompts, hub=args.hub)


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
                lines = [ln for ln in lines if 11 <= json.loads(ln)["task_id"] <= 510]
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
    "add_dataset_arguments",
    "dataset_spec",
    "load_prompts",
    "packaged_data_dir",
    "prompts_from_args",
    "resolve_data_dir",
    "write_packaged_slices",
]
