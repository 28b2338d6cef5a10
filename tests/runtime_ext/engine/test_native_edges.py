"""The native kernels at their edges: signed zeros, non-finite rows, empty widths and arguments out of range.

Each call that used to end the process (an integer division by zero, a read past the logits) runs in a child
process, so a regression fails this test instead of killing the test run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from forerun.runtime_ext.engine import native
from forerun.testing.native_paths import both_paths as on_both_paths

K = native.kernels()
pytestmark = pytest.mark.skipif(K is None, reason=f"native kernels unavailable: {native.unavailable_reason()}")
NONE = torch.empty(0, dtype=torch.long)


def both_paths(fn):
    """fn() with the vectorized code, then with the portable definition."""
    return on_both_paths(K, fn)


def bits(t: torch.Tensor) -> list[int]:
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int64).tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_max_of_signed_zeros_is_plus_zero_on_both_paths(dtype):
    """-0 first, +0 later in the same vector lane (tokens 0 and 16): the scalar max kept the first (-0), the vector
    one the later (+0), so `vocab_stats` returned different bits on the two paths.  The max is now +0 on both."""
    logits = torch.full((3, 40), -1.0, dtype=dtype)
    logits[0, 0], logits[0, 16] = -0.0, 0.0
    logits[1, 3], logits[1, 35] = 0.0, -0.0
    logits[2, 5] = -0.0  # the only zero: still +0
    fast, slow = both_paths(lambda: K.vocab_stats(logits))
    plus_zero = bits(torch.zeros(3, dtype=dtype))
    assert bits(fast[0]) == bits(slow[0]) == plus_zero
    for a, b in zip(fast[1:], slow[1:]):
        assert torch.equal(a, b)


def test_a_non_finite_row_gets_nan_statistics_not_leftover_memory():
    """A row with a NaN or an infinity returned its log S and entropy uninitialized (whatever torch.empty held:
    different from call to call), and a max that depends on the code path.  Now all three are NaN, the finite rows
    are untouched, and the bits are the same on both paths and from call to call."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 100, generator=g)
    logits[0, 16], logits[1, 7], logits[2, 99] = float("nan"), float("inf"), float("-inf")
    for _ in range(3):
        torch.full((4 * 100,), 1e30).sum()  # leave something in the allocator's memory
        fast, slow = both_paths(lambda: K.vocab_stats(logits))
        assert fast[3].tolist() == slow[3].tolist() == [False, False, False, True]
        for out in (fast, slow):
            for t in out[:3]:
                assert torch.isnan(t[:3]).all()
        alone = K.vocab_stats(logits[3:].contiguous())
        for t, u in zip(fast[:3], alone[:3]):
            assert torch.equal(t[3:], u)


def run_child(code: str) -> subprocess.CompletedProcess:
    prelude = "import torch\nfrom forerun.runtime_ext.engine import native\nK = native.kernels()\n"
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                          env=dict(os.environ), timeout=300)


CALLS = {
    "silu_mul of zero width": "print(tuple(K.silu_mul(torch.empty(3, 0)).shape))",
    "vocab_stats of an empty vocabulary": "K.vocab_stats(torch.empty(2, 0))",
    "draw from an empty vocabulary": "K.draw(torch.empty(2, 0), torch.zeros(2), torch.tensor([0]), "
                                     "torch.ones(1, dtype=torch.float64), torch.full((1,), 0.5, dtype=torch.float64))",
    "draw from a row past the logits": "K.draw(torch.randn(2, 40), torch.zeros(2), torch.tensor([5_000_000]), "
                                       "torch.ones(1, dtype=torch.float64), torch.full((1,), 0.5, dtype=torch.float64))",
    "draw with fewer temperatures than rows": "K.draw(torch.randn(2, 40), torch.zeros(2), torch.tensor([0, 1]), "
                                              "torch.ones(1, dtype=torch.float64), "
                                              "torch.full((1,), 0.5, dtype=torch.float64))",
    "attention with no KV heads": "K.attention(torch.randn(2, 16), torch.randn(2, 8), torch.randn(2, 8), "
                                  "torch.randn(2, 1, 4, 8), torch.randn(2, 1, 4, 8), torch.tensor([0, 0]), 0, 1, 2, 0, "
                                  "0.1, torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long), 0)",
}


@pytest.mark.parametrize("what", sorted(CALLS))
def test_degenerate_calls_raise_or_return_instead_of_ending_the_process(what):
    """Each of these ended the process (SIGFPE: a grain divided by a width of 0, or Hq % 0; SIGSEGV: a row index
    read past the logits) or read past an argument.  Now each returns (silu_mul: an empty result) or raises a
    RuntimeError that names the kernel."""
    done = run_child(f"""
        try:
            {CALLS[what]}
        except RuntimeError as exc:
            print("raised:", exc)
    """)
    assert done.returncode == 0, (what, done.returncode, done.stderr[-2000:])
    if what.startswith("silu_mul"):
        assert "(3, 0)" in done.stdout
    else:
        assert "raised:" in done.stdout, done.stdout


def test_attention_rejects_caches_and_starts_that_do_not_fit_its_arguments():
    """A key cache with fewer KV heads than Hkv (its writes went past the cache), a value cache with fewer, and a
    row start past `length` (a negative key count) are refused before anything is read or written."""
    g = torch.Generator().manual_seed(4)
    B, T, Hq, Hkv, D, length = 2, 1, 4, 2, 16, 3
    qkv = torch.randn(B * T, (Hq + 2 * Hkv) * D, generator=g)
    cos, sin = torch.randn(B * T, D, generator=g), torch.randn(B * T, D, generator=g)
    good = torch.zeros(B, Hkv, length + T, D)
    starts = torch.tensor([0, 1])
    K.attention(qkv, cos, sin, good.clone(), good.clone(), starts, length, T, Hq, Hkv, 0.2, NONE, NONE, 0)
    with pytest.raises(RuntimeError, match="attention"):
        few = torch.zeros(B, 1, length + T, D)
        K.attention(qkv, cos, sin, few, few.clone(), starts, length, T, Hq, Hkv, 0.2, NONE, NONE, 0)
    with pytest.raises(RuntimeError, match="attention"):
        K.attention(qkv, cos, sin, good.clone(), torch.zeros(B, 1, length + T, D), starts, length, T, Hq, Hkv, 0.2,
                    NONE, NONE, 0)
    with pytest.raises(RuntimeError, match="attention"):
        K.attention(qkv, cos, sin, good.clone(), good.clone(), torch.tensor([0, length + 1]), length, T, Hq, Hkv, 0.2,
                    NONE, NONE, 0)


@pytest.mark.parametrize("tau", [1e-50, 1e-300])
def test_a_temperature_that_underflows_float32_draws_the_max_not_token_minus_one(tau):
    """A request's temperature is a float64 > 0; the kernel divides in the logits' dtype, where 1e-50 is 0, and
    (l - m) / 0 was NaN for the max itself: no token drawn, token -1 and log T NaN handed to the sampler.  Now the
    draw is the limit tau -> 0: the tokens of the max share it (u picks among them in token order), log T = log of
    their number; the same bits on both code paths."""
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(3, 50, generator=g)
    logits[1, 7] = logits[1, 40] = logits[1].max() + 1  # two maxima, in different blocks of 16
    logits[2, 20] = logits[2].max() + 1
    m = K.vocab_stats(logits)[0]
    for u, second in ((0.2, False), (0.7, True)):
        rows = torch.arange(3)
        taus, us = torch.full((3,), tau, dtype=torch.float64), torch.full((3,), u, dtype=torch.float64)
        fast, slow = both_paths(lambda: K.draw(logits, m, rows, taus, us))
        for a, b in zip(fast, slow):
            assert torch.equal(a, b)
        tokens, log_t, drawn = fast
        assert tokens.tolist() == [int(logits[0].argmax()), 40 if second else 7, 20]
        assert torch.allclose(log_t, torch.tensor([0.0, float(np.log(2)), 0.0], dtype=torch.float64))
        assert torch.equal(drawn, logits[rows, tokens].double())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_logits_whose_differences_overflow_get_a_finite_entropy(dtype):
    """Finite logits 3e38 and -3e38 (float32) / 1.7e308 and -1.7e308 (float64): l - m overflows to -inf, its
    exp(l - m) is 0, and e (l - m) was 0 * -inf = NaN, a NaN entropy for a row the kernel calls finite.  The
    oracle: one token holds all the mass (entropy 0, log S 0); a plain row against float64 softmax; the same bits
    on both code paths and alone."""
    big = 3e38 if dtype == torch.float32 else 1.7e308
    logits = torch.zeros(2, 40, dtype=dtype)
    logits[0, 3], logits[0, 20] = big, -big
    logits[1] = torch.linspace(-3, 3, 40, dtype=dtype)
    fast, slow = both_paths(lambda: K.vocab_stats(logits))
    for a, b in zip(fast, slow):
        assert torch.equal(a, b)
    assert fast[3].tolist() == [True, True]
    assert fast[1][0].item() == 0.0 and fast[2][0].item() == 0.0
    p = torch.softmax(logits[1].double(), 0)
    assert abs(fast[2][1].item() - float(-(p * p.log()).sum())) < 1e-6
    alone = K.vocab_stats(logits[1:].contiguous())
    assert all(torch.equal(a[1:], b) for a, b in zip(fast, alone))
