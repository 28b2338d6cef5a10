"""`forerun sample` and `forerun bench presto`: power samplers and their PreSTO variants from the command line.

    forerun sample --sampler {power-mh,entropy-cut,multitry-mh} [--presto --npf N]
                   (--prompt TEXT | --dataset NAME --index I) [--n --block --K --alpha --seed]
                   [--model M | --backend URL[,URL...] [--tokenizer PATH]] [--records FILE] [--json]
    forerun bench presto [--dataset math500 --prompts P --n --block --K --npf --samplers ...]
                         [--traversals bfs predictive streaming streaming-predictive] [--cost-model]
                         [--model M [--concurrency N] | --backend URL[,URL...] [--concurrency N] [--flush-cache]]
                         [--paper] [--records FILE] [--json]

With `--backend http://host:port` the samplers run unchanged on a launched SGLang server; several URLs (or an
sglang-router URL) run the benchmark's independent chains concurrently, `--concurrency` per server
(`runtime_ext.pool`).  A stock server returns neither the per-token entropy of p0 (EntropyCut) nor log q at
extra temperatures (MultiTryMH): those samplers need the forerun plugin (`scripts/launch_runtime --plugin`)
and otherwise stop with a clear error; PowerMH needs neither (exact two-pass recipe).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import sys
import time
from typing import Any, Iterator

from .args import (
    add_model_arguments,
    dataset_name,
    input_path,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
    seed_int,
    utf8_text,
)
from .applicability import bench_presto_rules, reject_inapplicable, sample_rules
from .classifier import classifier_from_args, warn_shipped
from .config_flags import flags_named
from .engine import add_backend_arguments, check_context, check_pool_serves, open_pool_from, warn_nondeterministic
from .errors import CommandError, reports_errors
from .inputs import dataset_paths
from .output import output_file, print_json, progress_bar
from .row_cost import bench_cost_curve, row_cost_arg, row_cost_for, with_row_cost
from ..programs.call_cost import BUDGET_UNITS, DEFAULT_MAX_NODES
from ..programs.sampler_config import (CPU_SAMPLER, CPU_STREAM_ROWS, DEFAULT_BUDGET, SAMPLER_KINDS, TABLE6_SAMPLER,
                                        PrefetchConfig, SamplerConfig, default_budget, predictive_rule,
                                        prefetch_shortfall)

__all__ = ["register", "sample_command", "bench_presto_command", "prompt_id_for_text"]

TRAVERSAL_CHOICES = ("bfs", "predictive", "streaming", "streaming-predictive")
"""PreSTO variants: round-based (BFS / predictive rule) and streaming (issue 12) in BFS or ĥ order."""

NPF_DEFAULT = DEFAULT_BUDGET
"""N_pf without --npf: the paper's 20 (Table 6); MultiTryMH's default is larger (`NPF_HELP`)."""
NPF_HELP = (f"prefetch budget N_pf (default {NPF_DEFAULT}; multitry-mh "
            f"{default_budget(SamplerConfig(kind='multitry-mh'))} = 3(2M − 1), two prefetched levels of its 2M − 1 "
            "requests per transition). Below 2× a transition's requests a call prefetches nothing: a warning says so")


def _common(p: argparse.ArgumentParser, *, concurrency: bool = False) -> None:
    p.add_argument("--n", type=positive_int, default=None, help=f"response length n (default {CPU_SAMPLER.response_length})")
    p.add_argument("--block", type=positive_int, default=None, help="block size B (default: n, a single block)")
    p.add_argument("--K", type=positive_int, default=None, help=f"MH transitions per block (default {CPU_SAMPLER.steps_per_block})")
    p.add_argument("--alpha", type=positive_float, default=None, help=f"power exponent α (default {CPU_SAMPLER.alpha:g}; τ = 1/α)")
    p.add_argument("--beta", type=positive_float, default=None,
                   help=f"EntropyCut exponent β (default {CPU_SAMPLER.beta:g}; entropy-cut only)")
    p.add_argument("--seed", type=seed_int, default=None, help=f"run seed (default {CPU_SAMPLER.seed})")
    add_model_arguments(p, with_backend=True)
    add_backend_arguments(p, concurrency=concurrency)
    p.add_argument("--traversal", choices=TRAVERSAL_CHOICES, default=None,
                   help="tree traversal rule (bfs); streaming[-predictive]: streaming PreSTO, rows started the moment "
                        "their prefix exists, N_pf rows at once, best first by the probability that the walk reaches "
                        "them (ĥ: the chain's acceptance rate, or the classifier's)")
    p.add_argument("--classifier", type=input_path, default=None,
                   help="certainty classifier JSON for the predictive traversals (default: the shipped one, trained on "
                        "PowerMH chains of the default model; a warning on stderr for another model or sampler)")
    p.add_argument("--budget-unit", choices=BUDGET_UNITS, default=None,
                   help="what N_pf counts: distinct generated requests (default) or scored nodes (the paper's count)")
    p.add_argument("--max-nodes", type=positive_int, default=None,
                   help=f"request unit: most nodes scored per round (default {DEFAULT_MAX_NODES})")
    p.add_argument("--stream-rows", type=positive_int, default=None,
                   help=f"streaming traversals: rows running at once (default: N_pf with --backend; on the embedded "
                        f"engine (CPU) at most {CPU_STREAM_ROWS}, where more rows waste more tokens, BENCHMARKS.md). "
                        "Round-based variants keep N_pf requests per call, so one run compares both at their own "
                        "budgets")
    p.add_argument("--row-cost", type=row_cost_arg, default=None,
                   help="streaming traversals: λ, what one more row adds to a decode step relative to the step; a row "
                        "starts only for a node worth it, P·(1 + ĥ·D) >= λ (P: its reach, D: levels below it). "
                        "A number, or 'measured': b/a of the step time a + b·rows on the embedded engine (default 0: "
                        "rows free, up to N_pf; measured on 2 cores it beat the measured λ, BENCHMARKS.md)")
    p.add_argument("--early-reject", action=argparse.BooleanOptionalAction, default=None,
                   help="streaming traversals, PowerMH: reject a proposal while it decodes once its tokens so far "
                        "decide the rejection (exact: each token can only lower log r at τ = 1/α; default on; "
                        "--no-early-reject waits for every whole proposal, as the sequential sampler does)")
    p.add_argument("--call-overhead", type=positive_float, default=None,
                   help="request unit, predictive rule: κ0, a call's fixed cost in requests; maximise "
                        "predicted transitions / (κ0 + requests) instead of predicted transitions")
    p.add_argument("--reuse", action=argparse.BooleanOptionalAction, default=None,
                   help="serve requests a chain already generated from its suffix cache (default on)")
    p.add_argument("--records", default=None,
                   help="append per-node records (JSONL, one line per scored node) to this file")
    p.add_argument("--data-dir", default=None, help="dataset directory (default: packaged / FORERUN_DATA_DIR)")
    p.add_argument("--json", action="store_true", help="print a JSON object on stdout")


def register(subparsers: Any, bench_subparsers: Any) -> None:
    s = subparsers.add_parser("sample", help="run one power sampler (optionally its PreSTO variant) on one prompt")
    s.add_argument("--sampler", choices=SAMPLER_KINDS, default="power-mh")
    s.add_argument("--presto", action="store_true", help="run the PreSTO variant")
    s.add_argument("--npf", type=positive_int, default=None, help=NPF_HELP)
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", type=utf8_text, help="prompt text (chat template applied when the model has one)")
    src.add_argument("--dataset", type=dataset_name, help="dataset name (with --index)")
    s.add_argument("--index", type=nonnegative_int, default=None, help="prompt index in --dataset (default 0)")
    _common(s)
    s.set_defaults(handler=sample_command)
    _register_bench_presto(bench_subparsers)


def _register_bench_presto(bench_subparsers: Any) -> None:
    b = bench_subparsers.add_parser("presto", help="each sampler vs its PreSTO variant: Table 7 metrics, one run")
    b.add_argument("--dataset", type=dataset_name, default="math500")
    b.add_argument("--prompts", type=positive_int, default=3, help="first P prompts of the dataset (default 3)")
    b.add_argument("--npf", type=positive_int, default=None, help=NPF_HELP)
    b.add_argument("--samplers", nargs="+", choices=SAMPLER_KINDS, default=["power-mh"],
                   help="samplers to pair with their PreSTO variants (default power-mh)")
    b.add_argument("--paper", action="store_true", help=f"Table 6 exactly: n=B={TABLE6_SAMPLER.response_length}, α={TABLE6_SAMPLER.alpha:g}, "
                        f"K={TABLE6_SAMPLER.steps_per_block}, N_pf={NPF_DEFAULT}, seed {TABLE6_SAMPLER.seed}")
    b.add_argument("--traversals", nargs="+", choices=TRAVERSAL_CHOICES, default=None,
                   help="several PreSTO variants side by side against one set of sequential chains (default: "
                        "--traversal), e.g. bfs predictive streaming")
    b.add_argument("--cost-model", action=argparse.BooleanOptionalAction, default=None,
                   help="measure the decode-step time against the rows decoding (embedded engine) and predict each "
                        "row's call time from its decode steps and row-steps (default: on when a streaming variant "
                        "runs on the embedded engine)")
    b.add_argument("--predict-row-cost", type=nonnegative_float, nargs="+", default=(), metavar="λ",
                   help="also predict each variant's speedup where one more row costs λ of a decode step, "
                        "(S_seq + λ·G_seq) / (S + λ·G) from its decode steps S and row-steps G (e.g. a GPU's λ "
                        "from `forerun bench gpu-rows`; an H200 measured 0.005-0.017, BENCHMARKS.md). The prediction "
                        "where rows are free (λ = 0) is always printed, on a server too")
    b.add_argument("--flush-cache", action="store_true",
                   help="with --backend: flush the server's prefix cache before each chain (waits for the server to "
                        "be idle; never by default: a shared server's cache belongs to its other users too). The "
                        "embedded engine is flushed between chains at --concurrency 1 anyway")
    _common(b, concurrency=True)
    b.set_defaults(handler=bench_presto_command)


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """n, B, K, N_pf, α and seed of this run: the flags over `CPU_SAMPLER` (or `TABLE6_SAMPLER` with --paper)."""
    base = TABLE6_SAMPLER if getattr(args, "paper", False) else CPU_SAMPLER
    n = args.n or base.response_length
    return dict(n=n, block=args.block or (base.block_size if args.n is None else n), K=args.K or base.steps_per_block,
                npf=args.npf or NPF_DEFAULT, alpha=args.alpha or base.alpha,
                seed=base.seed if args.seed is None else args.seed)


def _prefetch(args: argparse.Namespace, npf: int | None, configs: list[Any], traversal: str | None = None):
    """The PreSTO settings of one variant; npf None: each sampler's default budget (`PrefetchConfig.resolved`)."""
    traversal = traversal or args.traversal
    streaming = traversal.startswith("streaming")
    if streaming:  # streaming's N_pf: rows at once
        npf = args.stream_rows or default_stream_rows(args, npf, configs)
    cost = dict(budget=npf, budget_unit=args.budget_unit, reuse_suffixes=args.reuse, streaming=streaming,
                call_overhead=None if streaming else args.call_overhead,
                early_reject=streaming and getattr(args, "early_reject", None) is not False,
                **({"max_nodes": args.max_nodes} if args.max_nodes else {}))
    if traversal in ("bfs", "streaming"):
        return PrefetchConfig(**cost)
    return PrefetchConfig(**cost, **predictive_rule(classifier_from_args(args)))


def default_stream_rows(args: argparse.Namespace, npf: int | None, configs: list[Any]) -> int | None:
    """Rows at once without --stream-rows: N_pf, on the embedded engine (CPU) at most `CPU_STREAM_ROWS` - unless
    that cap would leave a sampler nothing to prefetch (`prefetch_shortfall`; MultiTryMH: 2M − 1 = 7 requests
    per transition keeps its own default budget)."""
    cap = min(npf or NPF_DEFAULT, CPU_STREAM_ROWS)
    capped = PrefetchConfig(budget=cap, streaming=True)
    if getattr(args, "backend", None) or any(prefetch_shortfall(cfg, capped) for cfg in configs):
        return npf
    return cap


def _configs(args: argparse.Namespace, kinds, st: dict[str, Any]):
    from ..programs.sampler_config import SamplerConfig

    with flags_named(args, SamplerConfig, response_length="n", block_size="block", steps_per_block="K"):
        return [SamplerConfig(kind=k, response_length=st["n"], block_size=st["block"], steps_per_block=st["K"],
                              alpha=st["alpha"], beta=args.beta or CPU_SAMPLER.beta, seed=st["seed"]) for k in kinds]


@contextlib.contextmanager
def _bar(total: int, desc: str, unit: str = "transition") -> Iterator[Any]:
    with progress_bar(total=total, desc=desc, unit=unit, leave=False) as bar:
        yield bar


def prompt_id_for_text(text: str) -> str:
    """The prompt_id of a `--prompt` run: `prompt/` + the first 12 hex digits of sha256(text), so records of
    different prompts never share a prompt_id (prompt-grouped cross-validation holds whole prompts out)."""
    return "prompt/" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def _dataset_prompt(args: argparse.Namespace) -> Any:
    from ..eval.datasets.loading import DATA_DIR_ENV, PACKAGED_SLICE_SIZE, load_prompts, resolve_data_dir

    packaged = resolve_data_dir(args.data_dir).packaged
    if packaged and args.index >= PACKAGED_SLICE_SIZE:
        raise CommandError(f"--index {args.index} is out of range: only the first {PACKAGED_SLICE_SIZE} prompts of "
                           f"{args.dataset} are packaged; set {DATA_DIR_ENV} to the full offline datasets")
    prompts = load_prompts(args.dataset, data_dir=args.data_dir, limit=args.index + 1)  # not UTF-8: a DatasetError
    if args.index >= len(prompts):
        raise CommandError(f"--index {args.index} is out of range: {args.dataset} has {len(prompts)} prompts "
                           f"(valid: 0 to {len(prompts) - 1})")
    return prompts[args.index]


def _checked_inputs(args: argparse.Namespace, kinds: list[str], rules: Any) -> tuple[dict[str, Any], list[Any], Any]:
    """Everything that can be wrong with the arguments, found before the model loads: options that do not
    apply (`rules`, cli/applicability.py), then the unset ones get their defaults."""
    reject_inapplicable(rules(args))
    args.traversal, args.budget_unit = args.traversal or "bfs", args.budget_unit or "request"
    args.reuse = args.reuse is not False
    if getattr(args, "index", None) is None:
        args.index = 0
    output_file(args.records, "--records", inputs={"--classifier": args.classifier,
                                                   "--dataset": dataset_paths(getattr(args, "dataset", None), args.data_dir)})
    st = _settings(args)
    labels = getattr(args, "traversals", None) or [args.traversal]
    configs = _configs(args, kinds, st)
    prefetch = {label: _prefetch(args, args.npf, configs, label) for label in dict.fromkeys(labels)}
    return st, configs, prefetch


def _warn_shortfall(command: str, configs: list[Any], prefetch: dict[str, Any]) -> None:
    """One stderr line per sampler whose PreSTO variant cannot prefetch at the given N_pf (`prefetch_shortfall`)."""
    notes = (prefetch_shortfall(cfg, pf) for cfg in configs for pf in prefetch.values())
    for note in dict.fromkeys(n for n in notes if n):
        print(f"forerun {command}: warning: {note}", file=sys.stderr)


@reports_errors("sample")
def sample_command(args: argparse.Namespace) -> int:
    from ..programs.proposals import proposal_model_for
    from ..programs.prompts import chat_prompt_ids
    from ..programs.records import RecordWriter
    from ..programs.sampler_factory import make_sampler

    st, (cfg,), variants = _checked_inputs(args, [args.sampler], sample_rules)
    prefetch = variants[args.traversal]
    if args.presto:
        _warn_shortfall("sample", [cfg], {args.traversal: prefetch})
    if not args.dataset and not args.prompt:
        raise CommandError("--prompt must not be empty")
    prompt = _dataset_prompt(args) if args.dataset else None
    with open_pool_from(args) as pool, pool.lease() as runtime:  # one chain: one runtime
        check_pool_serves(pool, seeded=True, samplers=[args.sampler])
        notes = warn_nondeterministic(pool)
        warn_shipped("sample", args, runtime.name, [args.sampler])
        if prompt is not None:
            pid, ids = f"{args.dataset}/{prompt.id}", chat_prompt_ids(runtime.tokenizer, prompt.messages())
        else:
            pid, ids = prompt_id_for_text(args.prompt), chat_prompt_ids(runtime.tokenizer, args.prompt)
        check_context(runtime, [len(ids)], cfg.response_length)
        if args.presto and prefetch.streaming:
            prefetch = with_row_cost(args, prefetch, row_cost_for(args, runtime, ids, probe=args.row_cost == "measured"))
        model = proposal_model_for(runtime.backend, args.sampler, cfg.mtm_temperatures)
        sampler = make_sampler(model, cfg, presto=args.presto, prefetch=prefetch)
        writer = RecordWriter(args.records, model=runtime.name) if args.records else None
        with _bar(cfg.num_blocks * cfg.steps_per_block, sampler.name) as bar:  # records: each call as it ends
            result = sampler.run(ids, prompt_id=pid, progress=bar.update,
                                 on_call=(lambda call: writer.write_calls([call])) if writer else None)
        response = runtime.tokenizer.decode(list(result.response_ids))
    out = result.summary()
    if args.presto:
        st = dict(st, npf=getattr(sampler, "prefetch").budget)  # the budget it ran with (its default without --npf)
    out.update(sampler=sampler.name, settings=st, model=runtime.name, backend=runtime.location, response=response,
               determinism=notes[0] if notes else "token for token",
               call_times_s=[c.wall_time for c in result.mh_calls],
               transitions_per_call_list=[c.transitions for c in result.mh_calls],
               transitions_per_reuse_round=[c.transitions for c in result.rounds if c.kind == "reuse"],
               history=result.history)
    if args.json:
        print_json(out)
        return 0
    print(out["response"])
    print(f"\ntoken ids: {out['response_ids']}")
    print(f"{sampler.name}: {result.transitions} transitions in {result.num_calls} calls "
          f"({result.transitions_per_call:.2f}/call), call time {result.call_time:.2f}s "
          f"({result.time_per_call:.3f}s/call), accepts {sum(result.history)}")
    return 0


@reports_errors("bench presto")
def bench_presto_command(args: argparse.Namespace) -> int:
    from ..eval.presto.bench import timestamp
    from ..eval.presto.cost_model import cost_model_prediction
    from ..eval.datasets.loading import load_prompts

    st, configs, prefetch = _checked_inputs(args, list(args.samplers), bench_presto_rules)
    _warn_shortfall("bench presto", configs, prefetch)
    prompts = load_prompts(args.dataset, data_dir=args.data_dir, limit=args.prompts)
    if len(prompts) < args.prompts:
        raise CommandError(f"{args.dataset} has only {len(prompts)} prompts here, asked for {args.prompts}")
    with open_pool_from(args) as pool:
        check_pool_serves(pool, seeded=True, samplers=args.samplers)
        notes = warn_nondeterministic(pool)
        warn_shipped("bench presto", args, pool.first.name, args.samplers)
        cost = bench_cost_curve(args, pool, prompts, prefetch, st)  # first: streaming's λ comes from it
        row_cost = row_cost_for(args, pool.first, fit=cost["fit"] if cost else None)
        prefetch = {label: with_row_cost(args, pf, row_cost) for label, pf in prefetch.items()}
        leases_before = list(pool.leases)
        start = time.perf_counter()
        rows = _bench_rows(args, pool, prompts, configs, prefetch)
        wall = time.perf_counter() - start
        leases = [n - b for n, b in zip(pool.leases, leases_before)]  # the chains' (not the cost model's lease)
    runtime = pool.first
    chains = (1 + len(prefetch)) * len(prompts) * len(configs)
    meta = {"date": timestamp(), "model": runtime.name, "dtype": runtime.dtype,
            "backend": runtime.location if len(pool.runtimes) == 1 else [rt.location for rt in pool.runtimes],
            "concurrency": pool.slots, "chains_per_runtime": leases, "chains": chains, "wall_s": wall,
            "chains_per_s": chains / wall, "determinism": notes[0] if notes else "token for token",
            "dataset": args.dataset, "prompts": len(prompts), "settings": st, "traversal": args.traversal,
            "budget_unit": args.budget_unit, "reuse": args.reuse, "call_overhead": args.call_overhead,
            "traversals": list(prefetch), "classifier": _classifier_label(args),
            "row_cost": row_cost if any(pf.streaming for pf in prefetch.values()) else None,
            "early_reject": any(pf.early_reject for pf in prefetch.values()) if any(
                pf.streaming for pf in prefetch.values()) else None}
    if cost is not None:
        meta["cost_model"] = cost
    for r in rows:
        r["cost_model_prediction"] = cost_model_prediction(r, cost["fit"] if cost else None, args.predict_row_cost)
    if args.json:
        print_json({"meta": meta, "rows": rows})
    else:
        _print_bench(args, meta, rows, st, len(prompts))
    not_identical = [f"{r['sampler']} ({r['traversal']})" for r in rows if r["identical_chains"] != r["prompts"]]
    if not_identical and not notes:
        print(f"forerun bench presto: chains differ between sequential and PreSTO for {not_identical}", file=sys.stderr)
        return 1
    return 0


def _classifier_label(args: argparse.Namespace) -> str | None:
    """The classifier of the predictive variants: --classifier's path, "shipped: FILE", or None."""
    if getattr(args, "shipped", None) is not None:
        from ..classifiers.shipped import SHIPPED_FILE

        return f"shipped: {SHIPPED_FILE}"
    return args.classifier


def _print_bench(args: argparse.Namespace, meta: dict[str, Any], rows: list[dict[str, Any]], st: dict[str, Any],
                 n_prompts: int) -> None:
    from ..eval.presto.bench import format_table

    print(f"PreSTO benchmark — {meta['date']} — model {meta['model']} ({meta['dtype']}, {meta['backend']}), "
          f"{args.dataset} × {n_prompts} prompts, n={st['n']} B={st['block']} K={st['K']} α={st['alpha']} "
          f"N_pf={args.npf or 'default (column N_pf)'} ({args.budget_unit}s) seed={st['seed']} variants={','.join(meta['traversals'])}")
    print("cells: sequential/PreSTO; transitions/call = mean over prompts, K÷calls = Table 2's K ÷ mean calls "
          "(PreSTO); speedup = Eq. 20; calls÷ = reduction in calls; t/call× = increase in time per call; "
          "nodes,req/call = PreSTO nodes scored and requests generated per call; N_pf = its budget; waste,rep = "
          "share of its MH tokens no realized decision read, requests it generated more than once")
    print(format_table(rows))
    _print_streaming(rows, meta)
    print(f"{meta['chains']} chains in {meta['wall_s']:.2f} s = {meta['chains_per_s']:.3f} chains/s "
          f"(concurrency {meta['concurrency']} per runtime, chains per runtime {meta['chains_per_runtime']}); "
          f"determinism: {meta['determinism']}")


def _bench_rows(args: argparse.Namespace, pool: Any, prompts: list[Any], configs: list[Any],
                prefetch: Any) -> list[dict[str, Any]]:
    """Every sampler and its PreSTO variant on every prompt, the chains spread over the pool; one progress bar
    over all MH transitions."""
    from ..eval.presto.bench import run_pairs
    from ..programs.prompts import chat_prompt_ids
    from ..programs.records import RecordWriter

    runtime = pool.first
    items = [(f"{args.dataset}/{p.id}", chat_prompt_ids(runtime.tokenizer, p.messages())) for p in prompts]
    check_context(runtime, [len(ids) for _, ids in items], configs[0].response_length)
    writer = RecordWriter(args.records, model=runtime.name) if args.records else None
    total = (1 + len(prefetch)) * len(items) * sum(cfg.num_blocks * cfg.steps_per_block for cfg in configs)
    flush = args.flush_cache or (runtime.is_embedded and pool.slots == 1)  # never a shared server by default
    with _bar(total, "bench presto") as bar:
        pairs = run_pairs(pool, items, configs, prefetch, flush=flush, progress=bar.set_postfix_str,
                          on_transitions=bar.update,
                          on_result=(lambda r: writer.write_calls(r.calls)) if writer else None)
    return [pair.table_row() for pair in pairs]


def _print_streaming(rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    for r in rows:
        sm = r.get("streaming")
        if sm:
            print(f"{r['sampler']} {r['traversal']}: {sm['transitions_per_window']:.2f} transitions/window, "
                  f"{sm['decode_steps_per_window']:.1f} decode steps/window, {sm['rows_per_step']:.2f} rows/step "
                  f"(max {sm['max_rows']}), rows started/aborted per window {sm['rows_started_per_window']:.1f}/"
                  f"{sm['rows_aborted_per_window']:.1f}, wasted tokens {100 * sm['wasted_token_share']:.0f}%, "
                  f"requests resumed after an abort {r.get('resumed_requests', 0)}")
    cost = meta.get("cost_model")
    if cost:
        rel = ", ".join(f"{p['rows']}:{p['x_one_row']:.2f}x" for p in cost["relative"])
        print(f"cost model: decode step t(r) = {1000 * cost['fit']['a_s']:.2f} ms + {1000 * cost['fit']['b_s']:.2f} "
              f"ms·r (rows:time vs one row {rel})")
    else:
        print("cost model: no step timer on this backend; predictions from decode steps S and row-steps G alone")
    for r in rows:
        pred = r["cost_model_prediction"]
        fitted = (f"predicted speedup {pred['predicted_speedup']:.2f}x (measured {pred['measured_speedup']:.2f}x), "
                  if "predicted_speedup" in pred else f"measured {pred['measured_speedup']:.2f}x, ")
        at = "".join(f", at λ = {lam} {x:.2f}x" for lam, x in pred["speedup_at_row_cost"].items())
        print(f"  {r['sampler']} {r['traversal']}: decode steps {r['decode_steps'][0]:.0f}/{r['decode_steps'][1]:.0f}, "
              f"row-steps {r['row_steps'][0]:.0f}/{r['row_steps'][1]:.0f}; {fitted}"
              f"where rows are free {pred['speedup_rows_free']:.2f}x{at}")
