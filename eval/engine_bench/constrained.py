"""(f) of `forerun bench engine`: what a constrained row costs in the batched decode step.

One batch of `rows` sampled rows (distinct seeds, `decode_tokens` tokens each, EOS ignored) is decoded three
ways, side by side in one run, each a median over `repeats` after one warm-up:

    free        no row constrained
    mixed       the first half of the rows constrained by CONSTRAINT (the rest as in `free`)
    all         every row constrained

CONSTRAINT is a regex no row can complete within `decode_tokens` tokens (at least 1500 characters), so every
row of every variant runs the same number of decode steps and the step times compare like with like.  Reported:
seconds per decode step, the extra per constrained row and step ((mixed - free) / constrained rows), and whether
the unconstrained rows of `mixed` generated exactly their ids of `free` (the mask touches constrained rows
only).  The grammar is compiled in the warm-up (cached by (tokenizer, grammar)), so the timing is the masks'.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from ...runtime_ext.protocol import SamplingParams

CONSTRAINT = r"[A-Za-z0-9 ,.;:'!?()\n-]{1500,}"
"""Prose characters, at least 1500 of them: a live grammar at every step of the measurement."""


def measure_constrained(engine: Any, prompt: list[int], rows: int, decode_tokens: int, repeats: int,
                        tick: Callable[[int], Any]) -> dict[str, Any]:
    """Run (f) on `engine` (module docstring); returns a JSON-able dict."""
    constrained = {"free": 0, "mixed": rows // 2, "all": rows}

    def batch(k: int) -> list[tuple[list[int], SamplingParams]]:
        return [(prompt, SamplingParams(max_new_tokens=decode_tokens, temperature=1.0, seed=1000 + i,
                                        ignore_eos=True, regex=CONSTRAINT if i < k else None))
                for i in range(rows)]

    seconds: dict[str, list[float]] = {name: [] for name in constrained}
    ids: dict[str, list[list[int]]] = {}
    for rep in range(repeats + 1):
        for name, k in constrained.items():
            t0 = time.perf_counter()
            outs = engine.generate_batch(batch(k))
            elapsed = time.perf_counter() - t0
            tick(1)
            if any(len(o.output_ids) != decode_tokens for o in outs):
                raise RuntimeError(f"bench engine (f): a {name} row stopped before {decode_tokens} tokens")
            ids[name] = [list(o.output_ids) for o in outs]
            if rep > 0:
                seconds[name].append(elapsed)
    step = {name: statistics.median(ts) / decode_tokens for name, ts in seconds.items()}
    k = constrained["mixed"]
    return {
        "rows": rows,
        "decode_tokens": decode_tokens,
        "constraint": CONSTRAINT,
        "constrained_rows": constrained,
        "step_s": step,
        "extra_per_constrained_row_step_s": (step["mixed"] - step["free"]) / k if k else float("nan"),
        "mixed_over_free": step["mixed"] / step["free"],
        "all_over_free": step["all"] / step["free"],
        "unconstrained_rows_identical": ids["mixed"][k:] == ids["free"][k:],
    }


def format_constrained(c: dict[str, Any]) -> str:
    s = c["step_s"]
    return (f"(f) constrained rows ({c['rows']} rows x {c['decode_tokens']} tokens, regex): decode step "
            f"{1e3 * s['free']:.1f} ms with none, {1e3 * s['mixed']:.1f} ms with {c['constrained_rows']['mixed']} "
            f"constrained ({c['mixed_over_free']:.2f}x), {1e3 * s['all']:.1f} ms with all ({c['all_over_free']:.2f}x); "
            f"{1e3 * c['extra_per_constrained_row_step_s']:.2f} ms per constrained row and step; "
            f"unconstrained rows' ids unchanged: {c['unconstrained_rows_identical']}")
