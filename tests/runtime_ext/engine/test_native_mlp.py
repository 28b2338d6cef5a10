"""linear_silu over pack_pairs weights (the layer loop's fused MLP input): the same bits as the unfused
silu_mul(linear(x, pack([gate, up]))) on every path, split and shape, and bad input refused."""

from __future__ import annotations

import pytest
import torch

from forerun.runtime_ext.engine import native
from forerun.testing.native_paths import both_paths

K = native.kernels()
pytestmark = pytest.mark.skipif(K is None, reason=f"native kernels unavailable: {native.unavailable_reason()}")

ROWS = (1, 2, 3, 5, 6, 7, 10, 11, 20, 33)  # one row, two rows, one tile of 3-5 / 6-10 rows, several row tiles


def unfused(x, gate, up):
    return K.silu_mul(K.linear(x, K.pack([gate, up]), None))


def mlp_input(I, k, wdtype=torch.float32, xdtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    gate = (torch.randn(I, k, generator=g, dtype=torch.float64) * 0.2).to(wdtype)
    up = (torch.randn(I, k, generator=g, dtype=torch.float64) * 0.2).to(wdtype)
    x = torch.randn(max(ROWS), k, generator=g, dtype=torch.float64).to(xdtype)
    return x, gate, up


@pytest.mark.parametrize("I,k", [(1536, 576), (16 * 37, 576), (24, 37), (1000, 100), (1, 5)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_fused_is_the_unfused_product_bit_for_bit_on_both_paths_and_any_thread_count(I, k, threads):
    """16 x 37 gate features at K = 576: 74 panels, which two threads would split 37 / 37 were the ranges not
    aligned to pairs (a gate panel without its up).  24 and 1000: a last pair of partial panels; 1: one feature."""
    x, gate, up = mlp_input(I, k, seed=I + k)
    pairs = K.pack_pairs(gate, up)
    assert (pairs.N, pairs.K, pairs.pairs) == (2 * I, k, I)
    for rows in ROWS:
        xs = x[:rows].contiguous()
        fast, slow = native.with_threads(threads, lambda: both_paths(K, lambda: K.linear_silu(xs, pairs)))
        want = native.with_threads(threads, lambda: unfused(xs, gate, up))
        assert torch.equal(fast, want) and torch.equal(slow, want), (rows, threads)


@pytest.mark.parametrize("wdtype,xdtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                                           (torch.float64, torch.float64)])
def test_fused_matches_in_every_weight_and_activation_dtype(wdtype, xdtype):
    x, gate, up = mlp_input(200, 96, wdtype, xdtype, seed=3)
    pairs = K.pack_pairs(gate, up)
    for rows in (1, 6, 20):
        xs = x[:rows].contiguous()
        got = native.with_threads(2, lambda: K.linear_silu(xs, pairs))
        assert got.dtype == xdtype and torch.equal(got, native.with_threads(2, lambda: unfused(xs, gate, up)))


def test_the_split_the_schedule_and_the_fusion_switch_never_change_a_bit():
    x, gate, up = mlp_input(16 * 37, 576, seed=5)
    pairs = K.pack_pairs(gate, up)
    want = {rows: unfused(x[:rows].contiguous(), gate, up) for rows in ROWS}
    default = K.row_tile_schedule()
    try:
        for stealing in (True, False):
            K.set_work_stealing(stealing)
            for fuse in (True, False):
                K.set_fuse_silu(fuse)
                for schedule in ((0, 1, 1), (16 * 1024, 4, 4), (64, 3, 1)):
                    K.set_row_tile_schedule(*schedule)
                    for rows in ROWS:
                        got = native.with_threads(2, lambda: K.linear_silu(x[:rows].contiguous(), pairs))
                        assert torch.equal(got, want[rows]), (stealing, fuse, schedule, rows)
    finally:
        K.set_work_stealing(True)
        K.set_fuse_silu(True)
        K.set_row_tile_schedule(*default)


def test_silu_is_computed_as_defined():
    """Oracle independent of the kernels: float64 silu(x W_g^T) * (x W_u^T) agrees to float32 accuracy."""
    x, gate, up = mlp_input(40, 64, seed=9)
    got = K.linear_silu(x[:5].contiguous(), K.pack_pairs(gate, up)).double()
    g64, u64 = x[:5].double() @ gate.double().T, x[:5].double() @ up.double().T
    assert (got - torch.nn.functional.silu(g64) * u64).abs().max() < 1e-5


def test_bad_input_is_refused():
    x, gate, up = mlp_input(32, 16)
    with pytest.raises(RuntimeError, match="pack_pairs: gate and up must be"):
        K.pack_pairs(gate, up[:31])
    with pytest.raises(RuntimeError, match="pack_pairs: contiguous CPU tensors of one dtype"):
        K.pack_pairs(gate, up.to(torch.bfloat16))
    with pytest.raises(RuntimeError, match="linear_silu: weights must come from pack_pairs"):
        K.linear_silu(x, K.pack([gate, up]))
    with pytest.raises(RuntimeError, match="linear: weights packed by pack_pairs go to linear_silu"):
        K.linear(x, K.pack_pairs(gate, up), None)
    with pytest.raises(RuntimeError, match="linear_silu: x has 15 inputs"):
        K.linear_silu(x[:, :15].contiguous(), K.pack_pairs(gate, up))
