"""The cost model of `forerun bench presto`: what a decode step costs against the rows decoding, and the
model-call time it predicts for a PreSTO variant.

    t(r) ≈ a + b·r              time of one decode step with r rows (least squares over measured sizes)
    T ≈ a·S + b·G               a chain's model-call time from its decode steps S and row-steps G
    S_sequential ÷ S_variant    the speedup where extra rows are free (b → 0, a wide accelerator batch)
    λ = b / a                   what one more row costs relative to a step: streaming PreSTO's admission
                                threshold (`PrefetchConfig.row_cost`)
    (S_seq + λ·G_seq) ÷ (S_var + λ·G_var)   the speedup predicted at a given λ (`speedup_at_row_cost`; the
                                ratio needs only λ, e.g. a GPU's from `forerun bench gpu-rows`)

S and G are counted by the samplers (a call's decode steps are its longest request's tokens), so the
predictions at λ = 0 and at a given λ need no step timer: they hold on a server backend too.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ...runtime_ext.protocol import SamplingParams


def step_cost_curve(engine: Any, prompt_ids: Sequence[int], rows: Sequence[int] = (1, 2, 4, 6, 8, 12, 16, 20),
                    tokens: int = 16) -> dict[str, Any]:
    """Time of one decode step against the rows decoding (the embedded engine's own step timer), and the
    least-squares fit t(r) = a + b·r.  Each size decodes `tokens` steps of r rows on one cached prompt."""
    engine.generate(list(prompt_ids), SamplingParams(max_new_tokens=2, seed=1, ignore_eos=True))  # warm + cache
    points = []
    for r in rows:
        before = engine.stats()
        engine.generate_batch([(list(prompt_ids), SamplingParams(max_new_tokens=tokens, temperature=1.0, seed=100 + i,
                                                                 ignore_eos=True)) for i in range(r)])
        after = engine.stats()
        steps = after["decode_steps"] - before["decode_steps"]
        points.append({"rows": r, "step_s": (after["decode_s"] - before["decode_s"]) / max(steps, 1),
                       "mean_rows": (after["decode_rows"] - before["decode_rows"]) / max(steps, 1)})
    x = np.array([p["mean_rows"] for p in points])
    y = np.array([p["step_s"] for p in points])
    b, a = np.polyfit(x, y, 1) if len(points) > 1 else (0.0, float(y[0]))
    one = next((p["step_s"] for p in points if p["rows"] == 1), float(a + b))
    return {"points": points, "fit": {"a_s": float(a), "b_s": float(b)},
            "relative": [{"rows": p["rows"], "x_one_row": p["step_s"] / one} for p in points]}


def speedup_at_row_cost(row: dict[str, Any], row_cost: float) -> float:
    """(S_seq + λ·G_seq) ÷ (S_variant + λ·G_variant) from the row's decode steps S and row-steps G (means per
    chain): the speedup predicted where one more row costs λ of a decode step (λ = 0: rows free).  Past λ = 1 both
    sides are divided by λ: the same ratio, and a huge finite λ (1e308) no longer overflows λ·G to inf / inf."""
    (s_seq, s_pre), (g_seq, g_pre) = row["decode_steps"], row["row_steps"]
    if row_cost > 1:
        t_seq, t_pre = s_seq / row_cost + g_seq, s_pre / row_cost + g_pre
    else:
        t_seq, t_pre = s_seq + row_cost * g_seq, s_pre + row_cost * g_pre
    return t_seq / t_pre if t_pre else math.nan


def cost_model_prediction(row: dict[str, Any], fit: dict[str, float] | None = None,
                          row_costs: Sequence[float] = ()) -> dict[str, Any]:
    """The speedup where extra rows are free (S_sequential / S_variant), at each λ of `row_costs`, and with a
    measured `fit` the model-call time a·S + b·G and the speedup it predicts."""
    out: dict[str, Any] = {}
    if fit is not None:
        a, b = fit["a_s"], fit["b_s"]
        (s_seq, s_pre), (g_seq, g_pre) = row["decode_steps"], row["row_steps"]
        out = {"predicted_time_s": [a * s_seq + b * g_seq, a * s_pre + b * g_pre],
               "predicted_speedup": speedup_at_row_cost(row, b / a) if a > 0 else math.nan}  # a·(S + λ·G), λ = b / a
    return {**out, "speedup_rows_free": speedup_at_row_cost(row, 0.0),
            "speedup_at_row_cost": {f"{lam:g}": speedup_at_row_cost(row, lam) for lam in row_costs},
            "measured_speedup": row["speedup_eq20"]}


def row_cost_of(fit: dict[str, float]) -> float:
    """λ = b / a of a fit t(r) = a + b·r: one more row's cost relative to a decode step (0 when b ≤ 0)."""
    a, b = fit["a_s"], fit["b_s"]
    return max(b, 0.0) / a if a > 0 else 0.0
