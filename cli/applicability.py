"""Options that do not apply to what a command was asked to do are an error, not silently ignored.

Each command lists its rules as `(option, given, applies, why)`: `given` says the user set the option (its
default is a sentinel, None, or the option is compared with its default), `applies` whether it means anything
with the rest of the command line.  The first rule that is given but does not apply is one line on stderr and
exit 2 (`CommandError`), before any model loads:

    forerun sample --prompt x --npf 4
    forerun sample: --npf applies only with --presto (N_pf is PreSTO's prefetch budget)
"""

from __future__ import annotations

import argparse
from typing import Iterable

from .errors import CommandError

__all__ = ["Rule", "reject_inapplicable", "backend_rules", "prefetch_rules", "sample_rules", "bench_presto_rules",
           "eval_rules"]

Rule = tuple[str, bool, bool, str]
"""(option as typed, given, applies, why it does not apply)."""

PREDICTIVE_TRAVERSALS = ("predictive", "streaming-predictive")
"""The traversals that rank the tree with the certainty classifier's ĥ."""


def reject_inapplicable(rules: Iterable[Rule]) -> None:
    """CommandError for the first option that was given but does not apply."""
    for option, given, applies, why in rules:
        if given and not applies:
            raise CommandError(f"{option} {why}")


def backend_rules(args: argparse.Namespace) -> list[Rule]:
    """--tokenizer, --allow-nondeterministic, --request-timeout only with --backend.  (--model and --dtype stay
    documented as ignored with --backend: a script may keep its --model while it switches to a server.)"""
    server = bool(getattr(args, "backend", None))
    return [
        ("--tokenizer", args.tokenizer is not None, server, "applies only with --backend"),
        ("--allow-nondeterministic", args.allow_nondeterministic, server, "applies only with --backend"),
        ("--request-timeout", args.request_timeout is not None, server, "applies only with --backend"),
    ]


def prefetch_rules(args: argparse.Namespace, traversals: list[str], presto: bool) -> list[Rule]:
    """The PreSTO options: only for a PreSTO variant, and each only where its traversal or budget unit uses it."""
    pre = "applies only with --presto"
    request_unit = (args.budget_unit or "request") == "request"
    streaming = presto and any(t.startswith("streaming") for t in traversals)
    only_streaming = "applies only to the streaming traversals (--traversal streaming or streaming-predictive)"
    return [
        ("--traversal", args.traversal is not None, presto, pre),
        ("--budget-unit", args.budget_unit is not None, presto, pre),
        ("--reuse/--no-reuse", args.reuse is not None, presto, pre),
        ("--max-nodes", args.max_nodes is not None, presto and request_unit,
         "applies only with --presto and --budget-unit request"),
        ("--call-overhead", args.call_overhead is not None, presto and "predictive" in traversals and request_unit,
         "applies only to the round-based predictive rule (--traversal predictive) with --budget-unit request"),
        ("--stream-rows", getattr(args, "stream_rows", None) is not None, streaming, only_streaming),
        ("--row-cost", getattr(args, "row_cost", None) is not None, streaming, only_streaming),
        ("--early-reject/--no-early-reject", getattr(args, "early_reject", None) is not None, streaming, only_streaming),
        ("--classifier", args.classifier is not None, presto and any(t in PREDICTIVE_TRAVERSALS for t in traversals),
         "applies only with a predictive traversal (--traversal predictive or streaming-predictive)"),
    ]


def sample_rules(args: argparse.Namespace) -> list[Rule]:
    traversals = [args.traversal or "bfs"]
    return [
        ("--npf", args.npf is not None, args.presto, "applies only with --presto (N_pf is PreSTO's prefetch budget)"),
        *prefetch_rules(args, traversals, args.presto),
        ("--beta", args.beta is not None, args.sampler == "entropy-cut", "applies only to --sampler entropy-cut"),
        ("--index", args.index is not None, args.dataset is not None, "applies only with --dataset"),
        ("--data-dir", args.data_dir is not None, args.dataset is not None, "applies only with --dataset"),
        *backend_rules(args),
    ]


def bench_presto_rules(args: argparse.Namespace) -> list[Rule]:
    traversals = list(args.traversals or [args.traversal or "bfs"])
    server = bool(args.backend)
    return [
        ("--traversal", args.traversal is not None and bool(args.traversals), False,
         "and --traversals both name the PreSTO variants: give one of them"),
        *prefetch_rules(args, traversals, True)[1:],
        ("--beta", args.beta is not None, "entropy-cut" in args.samplers,
         "applies only when --samplers includes entropy-cut"),
        ("--flush-cache", args.flush_cache, server, "applies only with --backend (the embedded engine is flushed "
                                                    "between chains at --concurrency 1)"),
        ("--cost-model", args.cost_model is True, not server,
         "measures the embedded engine's decode step; it does not apply with --backend"),
        *backend_rules(args),
    ]


def eval_rules(args: argparse.Namespace, methods: list[str], defaults: object) -> list[Rule]:
    """`defaults`: `EvalSettings()` (a setting counts as given when it differs from its default)."""
    def changed(*names: str) -> bool:
        return any(getattr(args, n) != getattr(defaults, n) for n in names)

    from ..eval.harness.settings import Method

    mh = any(Method.parse(m).is_mh for m in methods)
    return [
        ("--classifier", args.classifier is not None, any(m.endswith("-predictive") for m in methods),
         "applies only to presto-*-predictive methods"),
        ("--alpha", changed("alpha"), any(m != "greedy" for m in methods),
         "applies only to methods that sample (greedy is argmax: it has no temperature τ = 1/α)"),
        ("--npf", changed("npf"), any(m.startswith("presto-") for m in methods), "applies only to presto-* methods"),
        ("--beta", changed("beta"), any("entropy-cut" in m for m in methods),
         "applies only to the entropy-cut methods"),
        ("--K", changed("K"), mh, "applies only to the MH methods (power-mh, entropy-cut, multitry-mh, presto-*)"),
        ("--block", args.block is not None, mh, "applies only to the MH methods"),
        ("--fixed-horizon", args.fixed_horizon, mh, "applies only to the MH methods"),
        ("--best-of/--best-of-select", changed("best_of", "best_of_select"), "best-of-n" in methods,
         "applies only to the best-of-n method"),
        ("--smc-*", changed("smc_particles", "smc_block", "smc_ramp", "smc_ess", "smc_final"), "power-smc" in methods,
         "applies only to the power-smc method"),
        *backend_rules(args),
    ]
