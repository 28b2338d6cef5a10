"""The cost model's predictions: a·S + b·G with a measured fit, and the speedup at a given λ = b / a (rows free at
λ = 0) from the decode steps S and row-steps G alone."""

import math

import pytest

from forerun.eval.presto.cost_model import cost_model_prediction, row_cost_of, speedup_at_row_cost

ROW = {"decode_steps": [974.6, 232.6], "row_steps": [974.6, 1725.8], "speedup_eq20": 3.51}


def test_rows_free_and_at_row_cost_are_ratios_of_step_counts():
    assert speedup_at_row_cost(ROW, 0.0) == pytest.approx(974.6 / 232.6)
    lam = 0.05
    assert speedup_at_row_cost(ROW, lam) == pytest.approx((974.6 + lam * 974.6) / (232.6 + lam * 1725.8))
    # a sequential chain decodes one row per step (G = S): as rows get dear the speedup falls to G_seq / G_variant
    assert speedup_at_row_cost(ROW, 1e9) == pytest.approx(974.6 / 1725.8, rel=1e-6)
    assert math.isnan(speedup_at_row_cost({"decode_steps": [3, 0], "row_steps": [3, 0]}, 0.0))


@pytest.mark.parametrize("lam", [1e200, 1e308, 1.7e308])
def test_a_huge_finite_row_cost_gives_the_exact_ratio_not_nan(lam):
    """λ·G overflowed to inf for λ near the largest float: inf / inf, a NaN printed as null in --json."""
    from fractions import Fraction

    (s_seq, s_pre), (g_seq, g_pre) = [Fraction(x) for x in ROW["decode_steps"]], [Fraction(x) for x in ROW["row_steps"]]
    exact = (s_seq + Fraction(lam) * g_seq) / (s_pre + Fraction(lam) * g_pre)  # rational arithmetic: no overflow
    assert speedup_at_row_cost(ROW, lam) == pytest.approx(float(exact), rel=1e-12)


def test_a_fit_predicts_the_same_speedup_as_its_lambda():
    fit = {"a_s": 0.02, "b_s": 0.0013}
    pred = cost_model_prediction(ROW, fit, row_costs=[0.006, row_cost_of(fit)])
    assert pred["predicted_time_s"] == pytest.approx([0.02 * 974.6 + 0.0013 * 974.6, 0.02 * 232.6 + 0.0013 * 1725.8])
    assert pred["predicted_speedup"] == pytest.approx(pred["speedup_at_row_cost"][f"{0.0013 / 0.02:g}"])
    assert pred["speedup_at_row_cost"]["0.006"] == pytest.approx(speedup_at_row_cost(ROW, 0.006))
    assert pred["speedup_rows_free"] == pytest.approx(974.6 / 232.6) and pred["measured_speedup"] == 3.51


def test_without_a_fit_only_the_step_count_predictions():
    pred = cost_model_prediction(ROW)
    assert set(pred) == {"speedup_rows_free", "speedup_at_row_cost", "measured_speedup"}
    assert pred["speedup_at_row_cost"] == {}
    assert row_cost_of({"a_s": 0.02, "b_s": -0.001}) == 0.0 and row_cost_of({"a_s": 0.0, "b_s": 0.1}) == 0.0
