"""The cost model of `forerun bench presto`: what a decode step costs against the rows decoding, and the
model-call time it predicts for a PreSTO variant.

    t(r) ≈ a + b·r              time of one decode step with r rows (least squares over measured sizes)
    T ≈ a·S + b·G               a chain's model-call time from its decode steps S and row-steps G
    S_sequential ÷ S_variant    the speedup where extra rows are free (b → 0, a wide accelerator batch)
    λ = b / a                   what one more row costs relative to a step: streaming PreSTO's admission
                                threshold (`PrefetchConfig.row_cost`)
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


def cost_model_prediction(row: dict[str, Any], fit: dict[str, float]) -> dict[str, Any]:
    """Model-call time predicted as a·S + b·G from the row's decode steps S and row-steps G (means per chain), the
    speedup it predicts, and the speedup where extra rows are free (b = 0: S_sequential / S_variant)."""
    a, b = fit["a_s"], fit["b_s"]
    (s_seq, s_pre), (g_seq, g_pre) = row["decode_steps"], row["row_steps"]
    t_seq, t_pre = a * s_seq + b * g_seq, a * s_pre + b * g_pre
    return {"predicted_time_s": [t_seq, t_pre], "predicted_speedup": t_seq / t_pre if t_pre else math.nan,
            "speedup_rows_free": s_seq / s_pre if s_pre else math.nan,
            "measured_speedup": row["speedup_eq20"]}


def row_cost_of(fit: dict[str, float]) -> float:
    """λ = b / a of a fit t(r) = a + b·r: one more row's cost relative to a decode step (0 when b ≤ 0)."""
    a, b = fit["a_s"], fit["b_s"]
    return max(b, 0.0) / a if a > 0 else 0.0
