"""The report's 95 % intervals against independent computations: Wilson's closed form and statsmodels'
proportion_confint, scipy's bootstrap built here."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.proportion import proportion_confint

from forerun.eval.harness.intervals import paired_ci, prompt_interval, wilson_interval


def _wilson(k: int, n: int) -> tuple[float, float]:
    """Wilson's score interval in closed form (z of the 97.5 % normal quantile)."""
    z = 1.959963984540054
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def test_wilson_matches_statsmodels_and_the_closed_form():
    for k, n in [(0, 10), (3, 10), (10, 10), (121, 128), (16, 121), (0, 21), (1, 1)]:
        lo, hi = wilson_interval(k, n)
        assert (lo, hi) == pytest.approx(proportion_confint(k, n, alpha=0.05, method="wilson"), abs=1e-9)
        assert (lo, hi) == pytest.approx(_wilson(k, n), abs=1e-9)
    # the pre-positioning paper's figures: 121/128 -> [0.89, 0.97], 16/121 -> [0.083, 0.204]
    assert wilson_interval(121, 128) == pytest.approx((0.89, 0.97), abs=0.006)
    assert wilson_interval(16, 121) == pytest.approx((0.083, 0.204), abs=0.002)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))
    with pytest.raises(ValueError):
        wilson_interval(5, 3)


@pytest.mark.parametrize("k,n", [(0, 21), (21, 21), (0, 3), (1, 1), (5, 12)])
def test_prompts_all_right_or_all_wrong_get_the_wilson_interval_of_k_of_p(k, n):
    """0 of 21 answers right was reported as "0 [0, 0]": the percentile bootstrap of 21 zeros is the point 0,
    which reads as certainty; 21 answers bound the accuracy only to about 0-15 %."""
    values = [1.0] * k + [0.0] * (n - k)
    lo, hi = prompt_interval(values)
    assert (lo, hi) == pytest.approx(_wilson(k, n), abs=1e-9)
    assert lo < hi
    if k == 0:
        assert hi == pytest.approx(0.1546, abs=1e-3) if n == 21 else hi > 0.5


def test_fractional_prompt_values_keep_the_bootstrap_over_prompts():
    values = [2 / 3, 1 / 3, 1.0, 0.0, 0.5]
    want = stats.bootstrap((np.array(values),), np.mean, n_resamples=2000, method="percentile", random_state=0)
    assert prompt_interval(values) == pytest.approx([want.confidence_interval.low, want.confidence_interval.high])
    assert all(math.isnan(x) for x in prompt_interval([]))


def test_a_paired_interval_with_no_spread_is_undefined_not_a_point():
    diff = lambda x, y: float(np.mean(y) - np.mean(x))  # noqa: E731
    for a, b in [([0, 0, 0], [0, 0, 0]), ([1, 1], [0, 0]), ([1.0], [0.0])]:
        assert all(math.isnan(v) for v in paired_ci(a, b, diff)), (a, b)
    a, b = [0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0]
    want = stats.bootstrap((np.array(a), np.array(b)), diff, paired=True, vectorized=False, n_resamples=2000,
                           method="percentile", random_state=0)
    assert paired_ci(a, b, diff) == pytest.approx([want.confidence_interval.low, want.confidence_interval.high])
