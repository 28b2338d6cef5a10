"""`forerun generate` and `forerun bench engine`: the embedded CPU engine from the command line.

    forerun generate --prompt TEXT [--model default|tiny|PATH | --backend URL [--tokenizer PATH]
                     [--request-timeout SECONDS]] [--max-tokens N] [--temperature T] [--seed S] [--raw] [--json]
    forerun bench engine [--model default] [--json]
    forerun bench work-split [--rows 1 6 20] [--repeats 21] [--tokens 8] [--neighbour-duty 0 0.3] [--json]

`--backend http://host:port` (also on `forerun sample` / `forerun bench presto` / `forerun eval`) runs on a
launched SGLang server (`scripts/launch_runtime`) through `SGLangServerBackend` instead of the embedded engine;
`--request-timeout` bounds how long one request to it may wait for an answer (`ServerConfig.timeout_s`).
"""

from __future__ import annotations

import argparse
from typing import Any

from ..programs.prompts import chat_prompt_ids
from .args import (
    add_model_arguments,
    comma_items,
    finite_float,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
    seed_int,
    utf8_text,
)
from .applicability import backend_rules, reject_inapplicable
from .config_flags import flags_named
from .errors import CommandError, reports_errors
from .output import bars_enabled, print_json, progress_bar

__all__ = ["register", "generate_command", "bench_engine_command", "bench_work_split_command",
           "add_backend_arguments", "backend_urls", "check_pool_serves", "BACKEND_ONLY_OPTIONS"]

BACKEND_ONLY_OPTIONS = ("tokenizer", "allow_nondeterministic", "request_timeout")
"""Options that apply only with --backend (`args` attribute names); without it they are an error."""


def backend_urls(text: str) -> str:
    """A `--backend` value: one URL or comma-separated URLs, each http[s]://host[:port] (argparse type)."""
    from ..runtime_ext.backends.server_config import check_server_url

    try:
        if not text.strip():  # an unset shell variable: said as a URL that is missing, not as a list
            raise ValueError(f"expected http://host:port, got {text!r}")
        return ",".join(check_server_url(u) for u in comma_items(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def request_timeout(text: str) -> float:
    """A `--request-timeout`: seconds > 0, at most what a socket timeout can hold (threading.TIMEOUT_MAX)."""
    import threading

    value = positive_float(text)
    if value > threading.TIMEOUT_MAX:
        raise argparse.ArgumentTypeError(f"expected at most {threading.TIMEOUT_MAX:.0f} seconds, got {text}")
    return value


def check_pool_serves(pool: Any, *, seeded: bool, samplers: Any = ()) -> None:
    """Refuse, before any work, a server that cannot do what the command asks: seeded chains on a server that
    ignores seeds (unless --allow-nondeterministic), EntropyCut / MultiTryMH without the forerun plugin."""
    for rt in pool.runtimes:
        if seeded and not rt.deterministic and rt.determinism_note is None:
            raise CommandError(f"SGLang server {rt.location} runs without --enable-deterministic-inference, so it "
                               "ignores seeds: relaunch it with --enable-deterministic-inference (scripts/launch_runtime "
                               "passes it), or pass --allow-nondeterministic to accept chains equal in law only")
        if getattr(rt.engine, "plugin_enabled", True):
            continue
        for kind, needs in (("entropy-cut", "the entropy of p0 of every token"),
                            ("multitry-mh", "log q at extra temperatures")):
            if kind in samplers:
                raise CommandError(f"the {kind} sampler needs {needs}, which SGLang server {rt.location} does not "
                                   "report: launch it with scripts/launch_runtime --plugin, or use the embedded engine")


def add_backend_arguments(p: argparse.ArgumentParser, *, concurrency: bool = False) -> None:
    """`--backend URL[,URL...]`, `--tokenizer PATH`, `--allow-nondeterministic`, `--request-timeout SECONDS`
    (generate, sample, bench presto, eval) and, where independent chains run, `--concurrency N` (chains in
    flight per runtime)."""
    p.add_argument("--backend", action="append", default=None, metavar="URL", type=backend_urls,
                   help="run on launched SGLang server(s) at URL (http://host:port, e.g. from scripts/launch_runtime; "
                        "repeat or comma-separate for several, or give an sglang-router URL) instead of the embedded "
                        "engine; --model and --dtype are then ignored")
    p.add_argument("--tokenizer", default=None, metavar="PATH",
                   help="with --backend: HF tokenizer name or folder (default: the one the server reports)")
    p.add_argument("--allow-nondeterministic", action="store_true",
                   help="with --backend: accept a server without --enable-deterministic-inference (it ignores seeds: "
                        "runs are then equal in law only, not token for token)")
    p.add_argument("--request-timeout", type=request_timeout, default=None, metavar="SECONDS",
                   help="with --backend: give up on a request the server has not answered after SECONDS "
                        "(default 600; a timed-out request is not retried and the error names the server's URL)")
    if concurrency:
        p.add_argument("--concurrency", type=positive_int, default=1,
                       help="independent chains in flight per runtime: on the embedded engine (its continuous "
                            "batching serves them together) or on each --backend server (default 1: one chain per "
                            "server at a time, so that its prefix cache serves it)")


def open_pool_from(args: argparse.Namespace) -> Any:
    """The runtimes a command's --model/--dtype or --backend/--tokenizer/--concurrency name (`RuntimePool`)."""
    from ..runtime_ext.pool import open_pool

    return open_pool(args.model, args.dtype, backend_urls=args.backend, tokenizer=args.tokenizer,
                     slots=getattr(args, "concurrency", 1), allow_nondeterministic=args.allow_nondeterministic,
                     request_timeout_s=args.request_timeout)


def check_context(runtime: Any, prompt_lens: list[int], n: int, flag: str = "--n") -> None:
    """prompt + response must fit the model context (known for the embedded engine; a server says so itself):
    checked before any decode, named by the option that sets the response length (`flag`)."""
    if runtime.loaded is None:
        return
    longest, limit = max(prompt_lens) + n, runtime.loaded.max_context
    if longest > limit:
        raise CommandError(f"{flag} {n}: prompt ({max(prompt_lens)} tokens) + response ({n} tokens) = {longest} "
                           f"exceeds the model context {limit}")


def warn_nondeterministic(pool: Any) -> list[str]:
    """Print (stderr) and return why seeded runs on `pool` reproduce only in law."""
    import sys

    notes = pool.determinism_notes
    for note in notes:
        print(f"forerun: warning: {note}", file=sys.stderr)
    return notes


def register(subparsers: Any, bench_subparsers: Any) -> None:
    g = subparsers.add_parser("generate", help="generate a completion (embedded CPU engine or --backend URL)")
    g.add_argument("--prompt", required=True, type=utf8_text, help="prompt text (the chat template is applied unless --raw)")
    add_model_arguments(g, with_backend=True)
    add_backend_arguments(g)
    g.add_argument("--max-tokens", type=nonnegative_int, default=128, help="max new tokens (default 128)")
    g.add_argument("--temperature", type=nonnegative_float, default=0.7, help="τ; 0 is greedy (default 0.7)")
    g.add_argument("--top-p", type=finite_float, default=1.0, help="nucleus mass (default 1.0: off)")
    g.add_argument("--top-k", type=int, default=-1, help="top-k (default -1: off)")
    g.add_argument("--seed", type=seed_int, default=None, help="sampling seed (default: random)")
    g.add_argument("--ignore-eos", action="store_true", help="generate exactly --max-tokens tokens")
    g.add_argument("--raw", action="store_true", help="send the prompt as is (no chat template)")
    g.add_argument("--json", action="store_true", help="print a JSON object on stdout")
    g.set_defaults(handler=generate_command)

    b = bench_subparsers.add_parser("engine", help="embedded engine: decode speed, fork batching, prefix hits")
    add_model_arguments(b)
    b.add_argument("--root-tokens", type=positive_int, default=256, help="root length for the fork measurement (256)")
    b.add_argument("--suffixes", type=positive_int, default=20, help="suffixes generated in one call (20)")
    b.add_argument("--suffix-tokens", type=positive_int, default=128, help="tokens per suffix (128)")
    b.add_argument("--decode-tokens", type=positive_int, default=128,
                   help="tokens for the single-stream measurement (128)")
    b.add_argument("--constrained-rows", type=positive_int, default=8,
                   help="rows of the constrained-decoding batch, half of them constrained in its mixed run (8)")
    b.add_argument("--repeats", type=positive_int, default=3,
                   help="repetitions of each timing; the median is reported (3)")
    b.add_argument("--seed", type=seed_int, default=0)
    b.add_argument("--json", action="store_true", help="print a JSON object on stdout")
    b.set_defaults(handler=bench_engine_command)

    w = bench_subparsers.add_parser("work-split", help="embedded engine: the kernels' static split of a matrix "
                                                        "product between threads against work stealing, paired")
    add_model_arguments(w)
    w.add_argument("--rows", type=positive_int, nargs="+", default=[1, 6, 20], help="decode rows per step (1 6 20)")
    w.add_argument("--repeats", type=positive_int, default=21, help="pairs (static, stealing) per size (21)")
    w.add_argument("--tokens", type=positive_int, default=8, help="tokens per row and timing (8)")
    w.add_argument("--neighbour-duty", type=nonnegative_float, nargs="+", default=[0.0, 0.3],
                   help="busy fraction of a neighbour process on the last CPU, in [0, 1); 0: none (0 0.3)")
    w.add_argument("--json", action="store_true", help="print a JSON object on stdout")
    w.set_defaults(handler=bench_work_split_command)

    from ..eval.engine_bench.gpu_rows import add_arguments as add_gpu_rows_arguments

    r = bench_subparsers.add_parser("gpu-rows", help="a decode step's time against rows on a GPU (torch only): λ "
                                                     "for --row-cost and --predict-row-cost")
    add_gpu_rows_arguments(r)
    r.set_defaults(handler=bench_gpu_rows_command)


@reports_errors("generate")
def generate_command(args: argparse.Namespace) -> int:
    if not args.prompt:
        raise CommandError("--prompt must not be empty")
    reject_inapplicable(backend_rules(args))
    from ..runtime_ext.protocol import SamplingParams

    with flags_named(args, SamplingParams, max_new_tokens="max_tokens"):
        params = SamplingParams(max_new_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, seed=args.seed, ignore_eos=args.ignore_eos, return_logprob=True)
    # a bad model or request: one line on stderr (ValueError: exit 2; an EngineError, e.g. no server: 1)
    with open_pool_from(args) as pool, pool.lease() as runtime:
        check_pool_serves(pool, seeded=args.seed is not None)
        name, location = runtime.name, runtime.location
        notes = warn_nondeterministic(pool) if args.seed is not None else []
        ids = _prompt_ids(runtime.tokenizer, args.prompt, args.raw)
        check_context(runtime, [len(ids)], args.max_tokens, "--max-tokens")
        out = runtime.engine.generate(ids, params)
    if args.json:
        meta = out.meta_info
        print_json({
            "model": name,
            "backend": location,
            "determinism": notes[0] if notes else "token for token",
            "text": out.text,
            "prompt_ids": list(out.input_ids),
            "output_ids": list(out.output_ids),
            "finish_reason": meta.get("finish_reason"),
            "prompt_tokens": meta.get("prompt_tokens"),
            "completion_tokens": meta.get("completion_tokens"),
            "sampling_seed": meta.get("sampling_seed", args.seed),
            "e2e_latency": meta.get("e2e_latency"),
            "output_token_logprobs": [e[0] for e in meta["output_token_logprobs"]],
            "output_token_logp0": meta.get("output_token_logp0"),
            "output_token_entropy": meta.get("output_token_entropy"),
        })
    else:
        print(out.text)
    return 0


def _prompt_ids(tok: Any, prompt: str, raw: bool) -> list[int]:
    return list(tok.encode(prompt)) if raw else chat_prompt_ids(tok, prompt)


@reports_errors("bench engine")
def bench_engine_command(args: argparse.Namespace) -> int:
    from ..eval.engine_bench.bench import EngineBenchConfig, format_engine_bench, run_engine_bench

    with flags_named(args, EngineBenchConfig, num_suffixes="suffixes", constrained_batch_rows="constrained_rows"):
        config = EngineBenchConfig(model=args.model, dtype=args.dtype, root_tokens=args.root_tokens,
                                   num_suffixes=args.suffixes, suffix_tokens=args.suffix_tokens,
                                   decode_tokens=args.decode_tokens, constrained_batch_rows=args.constrained_rows,
                                   repeats=args.repeats, seed=args.seed)
    result = run_engine_bench(config, progress=bars_enabled())  # a bad config or model: one line (cli/errors.py)
    if args.json:
        print_json(result, indent=2)
    else:
        print(format_engine_bench(result))
    return 0


@reports_errors("bench work-split")
def bench_work_split_command(args: argparse.Namespace) -> int:
    from ..eval.engine_bench.work_split import WorkSplitConfig, format_work_split, run_work_split

    with flags_named(args, WorkSplitConfig, neighbour_duties="neighbour_duty"):  # bad: one line naming the flag
        config = WorkSplitConfig(model=args.model, dtype=args.dtype, rows=tuple(args.rows), repeats=args.repeats,
                                 tokens=args.tokens, neighbour_duties=tuple(args.neighbour_duty))
    with progress_bar(total=len(config.neighbour_duties) * len(config.rows) * config.repeats,
                      desc="bench work-split", unit="pair", leave=False, disable=args.json) as bar:
        result = run_work_split(config, progress=lambda: bar.update(1))
    if args.json:
        print_json(result, indent=2)
    else:
        print(format_work_split(result))
    return 0


@reports_errors("bench gpu-rows")
def bench_gpu_rows_command(args: argparse.Namespace) -> int:
    from ..eval.engine_bench.gpu_rows import config_from, format_gpu_rows, run_gpu_rows

    config = config_from(args)  # bad settings: one line (cli/errors.py)
    with progress_bar(total=len(config.shapes) * len(set(config.rows)), desc="bench gpu-rows", unit="size",
                      leave=False, disable=args.json) as bar:
        def advance(what: str) -> None:
            bar.set_postfix_str(what)
            bar.update(1)

        result = run_gpu_rows(config, progress=advance)
    if args.json:
        print_json(result, indent=2)
    else:
        print(format_gpu_rows(result))
    return 0
