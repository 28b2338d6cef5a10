"""`forerun eval --resume`: what a run file must agree on before it is resumed — its header's settings, and each
record's prompt (the dataset row, the chat wording, the prompt token ids) against the prompts loaded now, including
the prompts a smaller --limit or fewer --datasets leave out (their records stay in the file and in its report);
records that cannot be checked so are refused, not kept blind."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..eval.datasets.loading import load_prompts
from ..eval.datasets.prompt import ids_fingerprint
from ..eval.datasets.registry import DatasetError
from ..eval.harness.runs import header_differences, strict_json
from ..eval.harness.settings import settings_used_by

__all__ = ["check_resumable", "check_same_input_ids", "check_same_prompts", "prompts_named_by_records"]


def prompts_named_by_records(args: argparse.Namespace, plan: dict[str, Any], records: list[dict[str, Any]],
                             files: dict[str, str]) -> dict[str, list[Any]]:
    """The prompts loaded now, extended to every prompt the run file's records name: they stay in the file and in
    its report, so they are checked too.  In a dataset of --datasets, up to the last prompt a record names (a resume
    with a smaller --limit); a source that cannot give them (fewer rows than the run was made on) is refused, as
    such records would be kept unchecked.  A dataset the records name that is not among --datasets (a resume with fewer
    datasets) is loaded from this run's data source; one that cannot be loaded is refused (its records would be
    kept unchecked)."""
    prompts = dict(plan["prompts"])
    gpqa_seed = plan["settings"].gpqa_shuffle_seed
    for ds, rows in plan["prompts"].items():
        named = [r["prompt_index"] for r in records if r.get("dataset") == ds and isinstance(r.get("prompt_index"), int)]
        if named and max(named) >= len(rows) and args.limit is not None:
            try:
                prompts[ds] = load_prompts(ds, data_dir=args.data_dir, limit=max(named) + 1, file=files.get(ds),
                                           gpqa_seed=gpqa_seed)
            except (DatasetError, OSError):
                pass
            if max(named) >= len(prompts[ds]):
                raise ValueError(f"--resume: the run file holds results for {ds} prompts up to index {max(named)}, "
                                 f"but its data now has {len(prompts[ds])} rows, so they cannot be checked against "
                                 "the prompts they were made on; resume with the data the run was made on "
                                 "(--data-dir / --dataset-file), or start another run file")
    for ds in dict.fromkeys(r.get("dataset") for r in records):
        if ds is None or ds in prompts:
            continue
        indices = [r.get("prompt_index") for r in records if r.get("dataset") == ds]
        limit = max(indices) + 1 if all(isinstance(i, int) for i in indices) else None
        try:
            prompts[ds] = load_prompts(ds, data_dir=args.data_dir, limit=limit, gpqa_seed=gpqa_seed)
        except (KeyError, DatasetError, OSError) as exc:  # a file that is not UTF-8 is a DatasetError naming it
            reason = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            raise ValueError(f"--resume: the run file holds results for {ds}, which is not among --datasets; they "
                             f"stay in the file and its report, but cannot be checked against the prompts now "
                             f"({reason}); add {ds} to --datasets with the data it was run on, or start another run "
                             "file") from None
    return prompts


def check_resumable(header: dict[str, Any] | None, records: list[dict[str, Any]], new: dict[str, Any],
                    methods: list[str]) -> None:
    """A resumed run must have been made with the same model, dtype, concurrency and settings: the settings that the
    methods of this run or of the file's records use (`settings_used_by`; every setting when a record names a method
    this forerun does not know).  A setting none of them uses (greedy's α) cannot make a result differ."""
    if header is not None:
        in_file = {r.get("method") for r in records}
        try:
            used = {name for m in [*methods, *in_file] for name in settings_used_by(m)}
        except ValueError:  # a record of an unknown method: nothing says what it used
            used = None
        diff = header_differences(header, json.loads(json.dumps(strict_json(new))), used)
        if diff:
            raise ValueError(f"--resume: the run file was made with other settings: {', '.join(diff)}; resume "
                             "with the same flags, or start another run file")
        return
    if records:  # cut or edited (new files start with the header): nothing to check the records' settings against
        raise ValueError("--resume: the run file has records but no header line, so the settings they were made "
                         "with cannot be checked; start another run file")


def check_same_prompts(records: list[dict[str, Any]], prompts: dict[str, list[Any]], system: str | None) -> None:
    """A resumed run's results must be for the prompts loaded now, shown to the model as they would be now: a record
    whose prompt id names another prompt (another dataset file, or an edited one; LiveCodeBench ids are row numbers),
    or whose chat was worded otherwise (an earlier forerun's instructions), is refused.  `prompts`: those loaded now
    and those the records name beyond them (`prompts_named_by_records`).  Records from before each fingerprint (no prompt_sha, no
    messages_sha: such files still resume, unchecked on that count).  `system`: --system, which the run header's
    settings have already matched."""
    loaded = {(ds, p.id): p for ds, rows in prompts.items() for p in rows}
    for rec in records:
        prompt = loaded.get((rec.get("dataset"), rec.get("prompt_id")))
        if prompt is None:
            continue
        where = f"--resume: the run file's results for {rec['dataset']} prompt {rec['prompt_id']!r} are for"
        if rec.get("prompt_sha") and prompt.fingerprint() != rec["prompt_sha"]:
            raise ValueError(f"{where} another prompt than the one loaded now (another or an edited dataset file); "
                             "resume with the same data, or start another run file")
        if rec.get("messages_sha") and prompt.messages_fingerprint(system) != rec["messages_sha"]:
            raise ValueError(f"{where} a chat worded otherwise than the one this forerun shows the model (another "
                             "version's instructions); start another run file")


def check_same_input_ids(records: list[dict[str, Any]], prompts: dict[str, list[Any]], settings: Any, rt: Any) -> None:
    """A resumed run's results must be for the token ids the model would be given now: the same chat through
    another tokenizer or chat template under the same model name (an edited local model folder, a transformers
    that renders the template otherwise) is refused (`input_sha`).  Checked once the model's tokenizer is loaded;
    records from before input_sha are not checked."""
    from ..eval.harness.items import prompt_input_ids  # ~0.9 s (the SGLang frontend, the graders): not at --help

    loaded = {(ds, p.id): p for ds, rows in prompts.items() for p in rows}
    now: dict[tuple[str, str], str] = {}
    for rec in records:
        key = (rec.get("dataset"), rec.get("prompt_id"))
        if not rec.get("input_sha") or key not in loaded:
            continue
        if key not in now:
            now[key] = ids_fingerprint(prompt_input_ids(rt.tokenizer, loaded[key], settings))
        if now[key] != rec["input_sha"]:
            raise ValueError(f"--resume: the run file's results for {key[0]} prompt {key[1]!r} were made from other "
                             f"prompt tokens than {rt.name}'s tokenizer and chat template give now (another "
                             "tokenizer or template under the same model name); start another run file")
