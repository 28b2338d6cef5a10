"""`forerun eval` (graded, resumable runs over the seven datasets) and `forerun eval report`.

    forerun eval --datasets all|NAME,... --methods greedy,low-temp,power-mh,... --limit N --out RUN.jsonl
                 [--resume] [--seed S[,S...] | --samples K] [--concurrency C] [--model M | --backend URL[,URL...]]
                 [settings]
    forerun eval report RUN.jsonl --out DIR [--json]

Methods and settings: `eval.harness.methods` / `settings`; the run file: `eval.harness.runs`; the report: `eval.harness.report`.  Bad input
(unknown dataset or method, an output path that cannot be written, a run file made with other settings, a
file that is not a run) is one line on stderr and exit status 2, before any model is loaded, and leaves the
file as it was.  A generation that fails is retried (`ItemRunner`); one that still fails is an error line,
counted as a wrong answer, retried by `--resume`; the run then exits 1.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from .args import (SEED_MAX, add_model_arguments, comma_items, input_path, nonnegative_int, positive_float,
                   positive_int, seed_int, utf8_text)
from .classifier import classifier_file
from .engine import add_backend_arguments, check_context, check_pool_serves, open_pool_from, warn_nondeterministic
from .applicability import eval_rules, reject_inapplicable
from .config_flags import field_flags, flags_named, name_flags
from .errors import report
from .eval_resume import check_resumable, check_same_input_ids, check_same_prompts, prompts_named_by_records
from .inputs import check_utf8
from .output import make_output_dir, output_dir, print_json, progress_bar
from ..programs.random_streams import PAPER_SEED
from ..runtime_ext.protocol import EngineError

ALL_DATASETS = ("math500", "aime", "humaneval", "mbpp", "lcb-v5", "gpqa", "mmlu")
VOLATILE_FIELDS = ("wall_s", "call_time_s", "time_per_call_s", "grade_s", "finished_at", "load_avg", "command")
"""Record fields that differ between two runs of the same items: timings, machine load, the command line."""


MAX_SAMPLES = 100_000
"""Most --samples per prompt: the run plan lists every item up front, so --samples 1e14 spent unbounded time and
memory before the model loaded (helper U's noticed item); 1e5 samples of one prompt is already days of decoding."""


def _seeds(text: str) -> list[int]:
    return list(dict.fromkeys(seed_int(s) for s in comma_items(text)))


def _budgets(text: str) -> tuple[int | None, tuple[tuple[str, int], ...]]:
    """--n: "64", "math500=64,aime=512" or both ("64,aime=512"): (n for all or None, per-dataset overrides)."""
    from ..eval.datasets.registry import dataset_spec

    every, per = None, {}
    for part in comma_items(text):
        name, sep, value = part.rpartition("=")
        try:
            n = int(value)
            key = dataset_spec(name).name if sep else None
        except (ValueError, KeyError) as e:
            raise argparse.ArgumentTypeError(f"expected N or NAME=N (N a whole number >= 1), got {part!r}"
                                             + (f": {e.args[0]}" if isinstance(e, KeyError) else "")) from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"expected N >= 1, got {part!r}")
        if key is None:
            every = n
        else:
            per[key] = n
    return every, tuple(sorted(per.items()))


def _settings_arguments(e: argparse.ArgumentParser) -> None:
    from ..eval.harness.settings import CPU_BUDGET_SCALE, CPU_NPF, EvalSettings, default_budget
    from ..programs.sampler_config import CPU_STREAM_ROWS
    from ..programs.selection_rules import FINAL_RULES, SELECT_RULES

    d = EvalSettings()
    e.add_argument("--n", type=_budgets, default=(None, ()), metavar="N|NAME=N,...",
                   help=f"MH response length / max new tokens: one N for every dataset and/or NAME=N per dataset "
                        f"(default per dataset: PreSTO's budget ÷ {CPU_BUDGET_SCALE}, e.g. math500 "
                        f"{default_budget('math500')}, aime {default_budget('aime')})")
    e.add_argument("--system", default=None, type=utf8_text, help="a system turn before every prompt")
    e.add_argument("--no-chat-template", dest="chat_template", action="store_false",
                   help="encode the prompt text as is, without the model's chat template")
    e.add_argument("--thinking", choices=("on", "off"), default=None,
                   help="the chat template's thinking switch (models that have one, e.g. Qwen3)")
    e.add_argument("--block", type=positive_int, default=None, help="MH block size B (default n: one block)")
    e.add_argument("--K", type=positive_int, default=d.K, help=f"MH transitions per block ({d.K})")
    e.add_argument("--npf", type=positive_int, default=d.npf,
                   help=f"PreSTO prefetch budget N_pf (default {CPU_NPF}; streaming methods: rows at once, default "
                        f"{CPU_STREAM_ROWS}; MultiTryMH, where these prefetch nothing: its own default, 21)")
    e.add_argument("--alpha", type=positive_float, default=d.alpha, help=f"power exponent α, τ = 1/α ({d.alpha:g})")
    e.add_argument("--beta", type=positive_float, default=d.beta, help=f"EntropyCut β ({d.beta:g})")
    e.add_argument("--best-of", type=positive_int, default=d.best_of, help=f"N of best-of-n ({d.best_of})")
    e.add_argument("--best-of-select", choices=tuple(SELECT_RULES), default=d.best_of_select,
                   help="best-of-n's answer: " + "; ".join(f"{k}: {v}" for k, v in SELECT_RULES.items()))
    e.add_argument("--smc-particles", type=positive_int, default=d.smc_particles,
                   help=f"Power-SMC particles P ({d.smc_particles})")
    e.add_argument("--smc-block", type=positive_int, default=d.smc_block,
                   help=f"Power-SMC tokens per batched call ({d.smc_block})")
    e.add_argument("--smc-ramp", type=nonnegative_int, default=d.smc_ramp,
                   help=f"Power-SMC exponent ramp in tokens ({d.smc_ramp}; 0: no bridge)")
    e.add_argument("--smc-ess", type=float, default=d.smc_ess, help=f"Power-SMC resampling threshold κ ({d.smc_ess})")
    e.add_argument("--smc-final", choices=tuple(FINAL_RULES), default=d.smc_final,
                   help="Power-SMC's answer: " + "; ".join(f"{k}: {v}" for k, v in FINAL_RULES.items()))
    e.add_argument("--gpqa-shuffle-seed", type=seed_int, default=d.gpqa_shuffle_seed, metavar="S",
                   help=f"seed of GPQA's per-question answer-choice shuffle ({d.gpqa_shuffle_seed}; recorded in the "
                        "run header, so --resume keeps it)")
    e.add_argument("--fixed-horizon", action="store_true",
                   help="MH chains of exactly n tokens, EOS ignored (PreSTO Table 6); default: the references' rule, "
                        "a chain stops at the end of the block whose state holds an EOS")
    e.add_argument("--forced-answer", action="store_true",
                   help="after each response (cut at EOS), append a forcing text (math: 'Final answer: $\\boxed{', "
                        "multiple choice: 'The answer is (') and decode a few tokens greedily (32 / 8); graded and "
                        "reported in its own column; code datasets get none")


def register(subparsers: Any, bench_subparsers: Any) -> None:
    e = subparsers.add_parser("eval", help="graded, resumable eval runs over the seven datasets (and `eval report`)")
    sub = e.add_subparsers(dest="eval_command", metavar="{report}")
    r = sub.add_parser("report", help="tables (markdown) and figures (PNG) of a run file")
    r.add_argument("run", metavar="RUN.jsonl", help="a run file written by `forerun eval`")
    r.add_argument("--out", required=True, metavar="DIR", help="folder for report.md, summary.json and the PNGs")
    r.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    r.set_defaults(handler=report_command)
    e.add_argument("--datasets", "--dataset", default=None,  # --dataset: `bench presto`'s spelling
                   help=f"comma-separated names, or all ({', '.join(ALL_DATASETS)})")
    e.add_argument("--methods", default="default", help="comma-separated methods, default or all (see README)")
    e.add_argument("--limit", type=positive_int, default=3, help="first N prompts of each dataset (3)")
    e.add_argument("--out", default=None, metavar="RUN.jsonl", help="the run file (append-only JSONL)")
    e.add_argument("--resume", action="store_true", help="continue --out: skip the items it already holds")
    e.add_argument("--seed", type=_seeds, default=[PAPER_SEED], help=f"run seed(s), comma-separated ({PAPER_SEED})")
    e.add_argument("--samples", type=positive_int, default=None,
                   help="samples per prompt: seeds --seed, --seed+1, ... (pass@k, maj@k in the report)")
    add_model_arguments(e, with_backend=True)
    add_backend_arguments(e, concurrency=True)  # items in flight per runtime (1: clean per-item timings)
    e.add_argument("--data-dir", default=None, help="offline datasets folder (default: FORERUN_DATA_DIR, ../shared/datasets)")
    e.add_argument("--dataset-file", action="append", default=[], metavar="NAME=PATH",
                   help="read dataset NAME from this one file (its usual schema), e.g. lcb-v6=lcb_release_v6.jsonl; "
                        "repeatable")
    e.add_argument("--classifier", type=input_path, default=None, help="certainty classifier JSON (presto-*-predictive methods; default: the "
                   "shipped one, trained on PowerMH chains of the default model)")
    _settings_arguments(e)
    e.add_argument("--json", action="store_true", help="print the run summary as JSON on stdout")
    e.set_defaults(handler=eval_command)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def check_output_file(path: str | None, resume: bool) -> Path:
    """The run file: its folder must exist and be writable; an existing non-empty file needs --resume."""
    if not path:
        raise ValueError("--out RUN.jsonl is required")
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"--out {path} is a directory")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise ValueError(f"--out {path}: {parent} is not a directory" if parent.exists()
                         else f"--out {path}: folder {parent} does not exist")
    if p.exists() and not p.is_file():
        raise ValueError(f"--out {path} is not a regular file (a run file is appended to and resumed)")
    if p.exists() and p.stat().st_size > 0 and not resume:
        raise ValueError(f"--out {path} already holds a run: pass --resume to continue it, or choose another file")
    return p


def create_output_file(p: Path) -> None:
    """Create (or open for appending) the run file before any model loads: permission bits say nothing to root."""
    try:
        os.close(os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    except OSError as e:
        raise ValueError(f"--out {p}: cannot be written ({e.strerror})") from None


def _datasets(text: str | None) -> list[str]:
    from ..eval.datasets.registry import dataset_spec

    if not text:
        raise ValueError(f"--datasets is required (comma-separated names, or all: {', '.join(ALL_DATASETS)})")
    names: list[str] = []
    for raw in comma_items(text, "--datasets"):
        if raw.lower() == "all":
            names += ALL_DATASETS
        else:
            try:
                names.append(dataset_spec(raw).name)
            except KeyError as e:
                raise ValueError(str(e.args[0])) from None
    return list(dict.fromkeys(names))


def _dataset_files(items: list[str], names: list[str]) -> dict[str, str]:
    """--dataset-file NAME=PATH entries as {dataset: path}, each naming one of the selected datasets."""
    from ..eval.datasets.registry import dataset_spec

    files: dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path:
            raise ValueError(f"--dataset-file {item!r}: expected NAME=PATH")
        try:
            ds = dataset_spec(name).name
        except KeyError as e:
            raise ValueError(f"--dataset-file: {e.args[0]}") from None
        if ds not in names:
            raise ValueError(f"--dataset-file {item!r}: {ds} is not among --datasets ({', '.join(names)})")
        if not os.path.isfile(path):
            raise ValueError(f"--dataset-file {item!r}: no such file")
        files[ds] = path
    return files


def _plan(args: argparse.Namespace) -> dict[str, Any]:
    """Everything that can be checked before a model is loaded."""
    from ..eval.datasets.loading import load_prompts
    from ..eval.harness.settings import EvalSettings, parse_methods

    out = check_output_file(args.out, args.resume)
    methods = parse_methods(comma_items(args.methods, "--methods"))
    reject_inapplicable(eval_rules(args, methods, EvalSettings()))
    if not 0 <= args.smc_ess <= 1:
        raise ValueError(f"--smc-ess must be in [0, 1], got {args.smc_ess}")
    with flags_named(args, EvalSettings, budgets="n"):
        settings = EvalSettings(n=args.n[0], budgets=args.n[1], system=args.system, chat_template=args.chat_template,
                                thinking=None if args.thinking is None else args.thinking == "on", block=args.block,
                                K=args.K, npf=args.npf, alpha=args.alpha, beta=args.beta, best_of=args.best_of,
                                best_of_select=args.best_of_select, smc_particles=args.smc_particles,
                                smc_block=args.smc_block, smc_ramp=args.smc_ramp, smc_ess=args.smc_ess,
                                smc_final=args.smc_final, gpqa_shuffle_seed=args.gpqa_shuffle_seed,
                                fixed_horizon=args.fixed_horizon, forced_answer=args.forced_answer)
    seeds = list(args.seed)
    if args.samples is not None:
        if len(seeds) > 1:
            raise ValueError("--samples K takes one --seed S (the samples use seeds S..S+K-1), not a list")
        if args.samples > MAX_SAMPLES:  # the plan lists every (prompt, seed) item before the model loads
            raise ValueError(f"--samples {args.samples}: at most {MAX_SAMPLES} samples per prompt (each one an answer "
                             "decoded by every method on every prompt)")
        if seeds[0] + args.samples - 1 > SEED_MAX:
            raise ValueError(f"--seed {seeds[0]} --samples {args.samples}: the last sample's seed "
                             f"{seeds[0] + args.samples - 1} is over 2**63 - 1")
        seeds = [seeds[0] + i for i in range(args.samples)]
    names = _datasets(args.datasets)
    if settings.gpqa_shuffle_seed != EvalSettings().gpqa_shuffle_seed and "gpqa" not in names:
        raise ValueError(f"--gpqa-shuffle-seed applies only when --datasets includes gpqa ({', '.join(names)})")
    stray = [f"{ds}={n}" for ds, n in args.n[1] if ds not in names]  # would be ignored: the run has no such dataset
    if stray:
        raise ValueError(f"--n {stray[0]}: {stray[0].split('=')[0]} is not among --datasets ({', '.join(names)})")
    for ds in names:  # --block must divide every dataset's n, α suit every method: refused before any item runs
        with flags_named(args, EvalSettings, budgets="n"):
            resolved = settings.for_dataset(ds)
        _check_methods(args, resolved, methods, seeds[0])
    files = _dataset_files(args.dataset_file, names)
    prompts = {}
    for ds in names:
        prompts[ds] = load_prompts(ds, data_dir=args.data_dir, limit=args.limit, file=files.get(ds),
                                   gpqa_seed=settings.gpqa_shuffle_seed)  # not UTF-8: a DatasetError naming the file
    create_output_file(out)  # last: bad input elsewhere leaves no file behind
    return {"out": out, "methods": methods, "settings": settings, "prompts": prompts, "seeds": seeds,
            "dataset_files": files}


def _check_methods(args: argparse.Namespace, settings: Any, methods: list[str], seed: int) -> None:
    """Every method's settings built once (`MethodRunner.config`): one that cannot run (power-smc at α < 1) is
    one line naming the method and the flags for the config's fields (`config_flags`), before any model loads,
    instead of an error line per item."""
    from ..eval.harness.methods import MethodRunner

    runner = MethodRunner(None, settings)
    for method in methods:
        try:
            runner.config(method, seed)
        except ValueError as exc:
            config_type, dests = _method_config_dests(method)
            message = name_flags(_one_line(exc), field_flags(args, config_type, dests))
            raise ValueError(f"--methods {method}: {message}") from None


def _method_config_dests(method: str) -> tuple[type, dict[str, str]]:
    """The config `MethodRunner.config` builds for `method` and {field: the eval flag's dest} where they differ."""
    from ..eval.harness.methods import Method
    from ..programs.baselines import BaselineConfig
    from ..programs.power_smc import PowerSMCConfig
    from ..programs.sampler_config import SamplerConfig

    if Method.parse(method).is_mh:
        return SamplerConfig, {"response_length": "n", "block_size": "block", "steps_per_block": "K"}
    if method == "power-smc":
        return PowerSMCConfig, {"particles": "smc_particles", "max_new_tokens": "n", "block_size": "smc_block",
                                "ramp_tokens": "smc_ramp", "ess_threshold": "smc_ess", "final": "smc_final"}
    return BaselineConfig, {"max_new_tokens": "n", "samples": "best_of", "select": "best_of_select"}


def _classifier(args: argparse.Namespace, methods: list[str]):
    """--classifier FILE; without it the shipped classifier when a predictive method runs (`classifiers.shipped`)."""
    if not args.classifier:
        from ..classifiers.shipped import load_shipped

        return load_shipped() if any(m.endswith("-predictive") for m in methods) else None
    return classifier_file(args.classifier)


def _shipped_checked(classifier: Any, model: str, methods: list[str]) -> Any:
    """The classifier to run; for the shipped one, a warning line when the model or a sampler differs."""
    from ..classifiers.shipped import ShippedClassifier, mismatch_note
    from ..eval.harness.settings import Method

    if not isinstance(classifier, ShippedClassifier):
        return classifier
    samplers = [Method.parse(m).sampler for m in methods if m.endswith("-predictive")]
    note = mismatch_note(classifier, model, samplers)
    if note:
        print(f"forerun eval: warning: {note}", file=sys.stderr)
    return classifier.classifier


def _check_sandbox() -> None:
    """Code items run only where the sandbox contains them (or the user allowed an uncontained run)."""
    from ..eval.graders.sandbox import ALLOW_ENV, isolation_report

    iso = isolation_report()
    if iso.get("not_contained") and os.environ.get(ALLOW_ENV) != "1":
        raise ValueError(f"the code sandbox cannot contain programs on this machine (not contained: "
                         f"{', '.join(iso['not_contained'])}); set {ALLOW_ENV}=1 to run generated code anyway")


def eval_command(args: argparse.Namespace) -> int:
    from ..eval.harness.forced import forcing_header
    from ..eval.harness.runs import RunFileError, read_run
    from ..eval.harness.settings import Method

    pool = None
    try:
        plan = _plan(args)
        header, existing = (read_run(check_utf8(plan["out"], "--out", complete_lines=True)) if args.resume
                            else (None, []))
        forced = forcing_header(plan["settings"].forced_answer)
        if header is not None or existing:  # the settings first: a refused resume loads no model
            check_resumable(header, existing, {**(header or {}), "settings": plan["settings"].to_json(),
                                               "forced_answers": forced}, plan["methods"])
            plan["checked_prompts"] = prompts_named_by_records(args, plan, existing, plan["dataset_files"])
            check_same_prompts(existing, plan["checked_prompts"], plan["settings"].system)
        classifier = _classifier(args, plan["methods"])
        pool = open_pool_from(args)
        check_pool_serves(pool, seeded=True, samplers={Method.parse(m).sampler for m in plan["methods"]})
        warn_nondeterministic(pool)
        rt = pool.first
        check_same_input_ids(existing, plan.get("checked_prompts", {}), plan["settings"], rt)
        classifier = _shipped_checked(classifier, rt.name, plan["methods"])
        plan["header"] = {"model": rt.name, "dtype": rt.dtype, "concurrency": pool.slots,
                          "settings": plan["settings"].to_json(), "forced_answers": forced}
        plan["needs_header"] = header is None  # a new or blank file (one with records and no header was refused)
        check_resumable(header, existing, plan["header"], plan["methods"])
        return _execute(args, plan, pool, existing, classifier)
    except (ValueError, OSError, EngineError, RunFileError) as exc:  # usage 2, an engine failure 1 (cli/errors.py)
        return report("eval", exc)
    finally:
        if pool is not None:
            pool.close()


def _execute(args: argparse.Namespace, plan: dict[str, Any], pool: Any, existing: list[dict[str, Any]],
             classifier: Any) -> int:
    from ..eval.harness.items import ItemRunner
    from ..eval.harness.runs import RunWriter, final_records, load_run, plan_items, run_header, run_items

    items = plan_items(plan["prompts"], plan["methods"], plan["seeds"])
    done = {r["key"] for r in final_records(existing) if not r.get("error")}
    todo = [it for it in items if it.key not in done]
    if any(it.prompt.category == "code" for it in todo):
        _check_sandbox()
    command = "forerun " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    worker = ItemRunner(pool, plan["settings"], classifier, flush=pool.slots == 1, command=command)
    worker.prepare(todo)
    for dataset in dict.fromkeys(it.dataset for it in todo):  # a deterministic overflow: refused, not retried
        lens = [len(worker.prompt_ids[(it.dataset, it.prompt.id)]) for it in todo if it.dataset == dataset]
        check_context(pool.first, lens, plan["settings"].n_for(dataset))
    bar = progress_bar(total=len(items), initial=len(items) - len(todo), desc="forerun eval", unit="item")
    start = time.perf_counter()
    written = 0
    try:
        with RunWriter(plan["out"]) as writer:
            if plan["needs_header"]:  # the header first: resume checks it
                writer.write(run_header(**plan["header"], backend=[rt.location for rt in pool.runtimes],
                                        command=command, created=time.time(),
                                        selection_rules=plan["settings"].selection_rules(plan["methods"])))
            written = run_items(todo, worker.generate, worker.finish, writer,
                                concurrency=pool.width, progress=bar)
    except KeyboardInterrupt:
        bar.close()
        raise KeyboardInterrupt(f"{plan['out']} holds every finished item; rerun with --resume to finish") from None
    bar.close()
    return _print_summary(args, final_records(load_run(plan["out"])), written, time.perf_counter() - start)


def _print_summary(args: argparse.Namespace, records: list[dict[str, Any]], written: int, wall: float) -> int:
    """The run's cells on stdout; exit 1 when any item still failed (its error line is retried by --resume)."""
    from ..eval.harness.intervals import NO_SPREAD
    from ..eval.harness.report import NO_FORCED_PASS
    from ..eval.harness.report import summarize

    summary = summarize(records)
    keys = ("dataset", "method", "n", "correct", "accuracy", "pass_at_k", "maj_at_k", "ci95", "forced_accuracy",
            "forced_ci95", "tokens_decoded", "forced_tokens", "wall_s", "errors")
    out = {"run": str(args.out), "items": len(records), "written_now": written, "wall_s": wall,
           "forced_answer": bool(args.forced_answer),  # False: the cells' forced_* fields are null (no forced pass)
           "cells": [{k: c[k] for k in keys} for c in summary["cells"]], "comparisons": summary["comparisons"],
           "selection_rules": summary["selection_rules"]}
    failed = sum(c["errors"] for c in summary["cells"])
    if args.json:
        print_json(out, reasons={"diff_ci95": NO_SPREAD, "forced_tokens": NO_FORCED_PASS})
    else:
        print(f"{args.out}: {len(records)} items ({written} new, {wall:.1f} s)")
        for line in out["selection_rules"].values():
            print(f"  {line}")
        for c in out["cells"]:
            lo, hi = c["ci95"]
            extra = " ".join(f"pass@{k} {100 * v:.0f}%" for k, v in c["pass_at_k"].items() if k != "1")
            extra += "".join(f" maj@{k} {100 * v:.0f}%" for k, v in c["maj_at_k"].items())
            if c["forced_accuracy"] is not None:
                extra += f" forced {100 * c['forced_accuracy']:.0f}%"
            print(f"  {c['dataset']:<10} {c['method']:<28} {c['correct']:>3}/{c['n']:<3} "
                  f"[{100 * lo:4.0f}, {100 * hi:4.0f}] % {extra} {c['tokens_decoded']:7.0f} tok "
                  f"{c['wall_s']:8.2f} s/item" + (f"  errors {c['errors']}" if c["errors"] else ""))
        for c in out["comparisons"]:
            lo, hi = c["diff_ci95"]
            interval = f"[{100 * lo:+.1f}, {100 * hi:+.1f}]" if math.isfinite(lo) else f"[no interval: {NO_SPREAD}]"
            print(f"  {c['dataset']:<10} {c['method']} vs {c['baseline']}: Δ pass@1 {100 * c['diff']:+.1f} pts "
                  f"{interval}, {c['test']} p = {c['p_value']:.3g} ({c['pairs']} pairs)")
    if failed:
        print(f"forerun eval: {failed} item(s) failed after retries (error lines in {args.out}); rerun with "
              "--resume to retry them", file=sys.stderr)
        return 1
    return 0


def report_command(args: argparse.Namespace) -> int:
    from ..eval.harness.report_files import REPORT_FILES, write_report
    from ..eval.harness.runs import RunFileError, final_records, load_run

    try:
        if not Path(args.run).is_file():
            raise ValueError(f"{args.run}: no such run file")
        out = output_dir(args.out, "--out", files=REPORT_FILES, inputs={"RUN.jsonl": args.run},  # each is replaced
                         writer="the report")
        records = final_records(load_run(check_utf8(args.run, complete_lines=True), repair=False))
        if not records:
            raise ValueError(f"{args.run} holds no finished item")
        command = "forerun " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        summary, files = write_report(records, make_output_dir(out), run_path=args.run, command=command)
    except (ValueError, OSError, RunFileError) as exc:  # CommandError is a ValueError
        print(f"forerun eval report: {_one_line(exc)}", file=sys.stderr)
        return 2
    if args.json:
        print_json({"files": [str(f) for f in files], **summary})
    else:
        print("\n".join(str(f) for f in files))
    return 0
