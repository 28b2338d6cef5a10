"""Streaming PreSTO's λ on the command line (`PrefetchConfig.row_cost`): --row-cost N, or `measured` - b/a of the
decode-step time t(r) ≈ a + b·r that `eval.presto.cost_model.step_cost_curve` fits on the embedded engine (0 on a
server); without the flag rows are free (λ = 0).  `bench_cost_curve` measures that curve for `bench presto` (its
cost model, and λ when asked)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from .args import nonnegative_float


def bench_cost_curve(args: argparse.Namespace, pool: Any, prompts: list[Any], prefetch: dict[str, Any],
                st: dict[str, Any]) -> dict[str, Any] | None:
    """The per-step cost against rows (`step_cost_curve`) on the embedded engine, when asked, by default with a
    streaming variant, and always for --row-cost measured; None on a server (no step timer) or when not wanted."""
    runtime = pool.first
    wanted = args.cost_model if args.cost_model is not None else any(p.streaming for p in prefetch.values())
    wanted = wanted or (args.row_cost == "measured" and any(p.streaming for p in prefetch.values()))  # λ needs it
    if not wanted or not runtime.is_embedded:
        return None
    from ..eval.presto.cost_model import step_cost_curve
    from ..programs.prompts import chat_prompt_ids

    ids = chat_prompt_ids(runtime.tokenizer, prompts[0].messages())
    sizes = sorted({1, 2, 4, 6, 8, 12, 16, st["npf"]} | ({20} if st["npf"] >= 20 else set()))
    with pool.lease() as rt:
        return step_cost_curve(rt.engine, ids, rows=sizes)


def row_cost_arg(text: str) -> float | str:
    """--row-cost: a number >= 0, or `measured`."""
    if text == "measured":
        return text
    try:
        return nonnegative_float(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0 or 'measured', got {text!r}") from None


def row_cost_for(args: argparse.Namespace, runtime: Any, ids: Any = None, *, fit: dict[str, float] | None = None,
              probe: bool = False) -> float:
    """λ of the streaming variants: --row-cost N; with --row-cost measured b/a of the step-time fit on the
    embedded engine (`fit`, or with `probe` a short curve measured here on the prompt `ids`; 0 on a server);
    else 0 (rows free)."""
    if args.row_cost != "measured":
        return float(args.row_cost or 0.0)
    if not runtime.is_embedded:
        return 0.0
    from ..eval.presto.cost_model import row_cost_of, step_cost_curve

    if fit is None and probe:
        fit = step_cost_curve(runtime.engine, ids, rows=(1, 4, 8, 16), tokens=8)["fit"]
    return row_cost_of(fit) if fit is not None else 0.0


def with_row_cost(args: argparse.Namespace, prefetch: Any, row_cost: float) -> Any:
    """The streaming variant's settings with its λ (`PrefetchConfig.row_cost`); the others unchanged."""
    if not prefetch.streaming:
        return prefetch
    if not args.quiet and not args.json and args.row_cost == "measured":
        print(f"forerun: streaming rows start only for nodes worth >= {row_cost:.3f} (the measured cost of one more "
              "row)", file=sys.stderr)
    return dataclasses.replace(prefetch, row_cost=row_cost)
