"""The running batch's buffer memory (SpareKV, recycled between batches) and the allocation-free finite check."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from forerun.runtime_ext.engine import EmbeddedEngine, EngineConfig
from forerun.runtime_ext.engine.batch import RunningBatch, SpareKV, batch_pair
from forerun.runtime_ext.engine.forward import all_finite
from forerun.runtime_ext.engine.models import load_model
from forerun.runtime_ext.engine.requests import RequestMode, make_request
from forerun.runtime_ext.protocol import SamplingParams

TEMPLATE = torch.empty((2, 2, 3, 0, 4), dtype=torch.float32)  # layers 2, kv heads 3, head dim 4


def test_spare_memory_is_reused_when_it_fits_and_only_then():
    spare = SpareKV()
    buf, flat = spare.take(TEMPLATE, rows=5, cap=7, zero=False)
    assert buf.shape == (2, 2, 5, 3, 7, 4) and buf.is_contiguous() and flat.numel() == buf.numel()
    spare.give(flat)
    assert spare.nbytes == flat.nbytes
    small, small_flat = spare.take(TEMPLATE, rows=2, cap=7, zero=False)  # fits: the kept memory, a view of it
    assert small_flat is flat and small.data_ptr() == flat.data_ptr() and spare.flat is None
    other, other_flat = spare.take(TEMPLATE, rows=2, cap=7, zero=False)  # nothing kept now: new memory
    assert other_flat is not flat
    spare.give(flat)
    big, big_flat = spare.take(TEMPLATE, rows=6, cap=7, zero=False)  # larger than the kept memory: new memory,
    assert big_flat is not flat and spare.flat is None  # and the kept memory is let go (peak memory bounded)
    spare.give(flat)
    spare.give(other_flat)  # smaller than what is kept: ignored
    assert spare.flat is flat
    spare.give(big_flat)  # larger: replaces it
    assert spare.flat is big_flat
    wide, wide_flat = spare.take(TEMPLATE.double(), rows=1, cap=1, zero=False)  # another dtype: new memory
    assert wide_flat is not big_flat and wide.dtype == torch.float64
    spare.drop()
    assert spare.flat is None and spare.nbytes == 0


def test_zero_asks_for_zeros_in_reused_memory():
    spare = SpareKV()
    _, flat = spare.take(TEMPLATE, rows=4, cap=5, zero=False)
    flat.fill_(float("nan"))
    spare.give(flat)
    buf, same = spare.take(TEMPLATE, rows=3, cap=5, zero=True)
    assert same is flat and not torch.isnan(buf).any() and int(torch.count_nonzero(buf)) == 0


def test_batch_pair_shares_one_spare():
    a, b = batch_pair(TEMPLATE, 8, share_prefix=True)
    assert a is not b and a.spare is b.spare and a.share_prefix and b.share_prefix


def _row_with_kv(tokens: int, max_new: int, fill: float):
    """A request holding the KV of its `tokens`-token prompt: one segment [layers, 2, H, tokens, D] of `fill`."""
    r = make_request(list(range(1, tokens + 1)), SamplingParams(max_new_tokens=max_new), rid=None, priority=0,
                     mode=RequestMode.GENERATE, vocab_size=256, max_context=1000)
    r.kv_len = tokens
    L, _, H, _, D = TEMPLATE.shape
    return r, [torch.full((L, 2, H, tokens, D), fill)]


def test_copied_rows_get_zero_pads_in_recycled_memory():
    """Without share_prefix (transformers' forward reads every column up to the right edge, pads masked) a row's
    left pads must be zeros, also when the buffer's memory held NaN and when the buffer is rebuilt around rows
    that keep running."""
    spare = SpareKV()
    _, flat = spare.take(TEMPLATE, rows=16, cap=64, zero=False)
    flat.fill_(float("nan"))
    spare.give(flat)
    batch = RunningBatch(TEMPLATE, 8, share_prefix=False, spare=spare)
    a, a_kv = _row_with_kv(3, 4, 1.0)
    batch.join([(a, a_kv)])
    assert batch._flat is flat  # the NaN memory is the buffer
    batch.advance()  # a holds 4 columns now
    b, b_kv = _row_with_kv(9, 4, 2.0)  # longer than the right edge: the buffer is rebuilt, a copied over
    batch.join([(b, b_kv)])
    assert batch.rebuilds == 2 and batch._flat is not flat and spare.flat is flat
    buf = batch.active
    assert batch.end == 9
    for slot, r, value in ((0, a, 1.0), (1, b, 2.0)):
        pads, own = buf[:, :, slot, :, : batch.end - r.kv_len], buf[:, :, slot, :, batch.end - r.kv_len: batch.end]
        assert int(torch.count_nonzero(pads)) == 0 and not torch.isnan(pads).any()
        assert not torch.isnan(own).any()
    assert bool((buf[:, :, 1, :, :9] == 2.0).all()) and bool((buf[:, :, 0, :, 5:8] == 1.0).all())


@pytest.mark.parametrize("shape", [(7,), (3, 5, 11), (2, 2, 3, 9, 4)])
def test_all_finite_against_elementwise_check(shape):
    rng = np.random.default_rng(0)
    base = torch.from_numpy(rng.normal(size=shape).astype(np.float32) * 50)
    assert all_finite(base)
    assert all_finite(base[..., ::2])  # a strided view
    for bad in (float("nan"), float("inf"), -float("inf")):
        for where in (0, base.numel() // 2, base.numel() - 1):
            t = base.clone()
            t.view(-1)[where] = bad
            assert not all_finite(t), (bad, where)
    t = base.clone()
    t.view(-1)[0], t.view(-1)[-1] = float("inf"), -float("inf")  # opposite infinities: the sum is NaN
    assert not all_finite(t)
    assert all_finite(torch.full((4,), 3.0e38, dtype=torch.float32)) is False  # conservative on overflow
    assert math.isfinite(3.0e38) and all_finite(torch.full((1,), 3.0e38, dtype=torch.float32))


@pytest.mark.parametrize("batch_invariant", [True, False])
def test_recycled_buffer_full_of_nan_changes_no_token(batch_invariant):
    """A batch buffer made from recycled memory holds the last batch's bytes; here NaN in every element.  The
    native forward reads only each row's own columns, transformers' forward gets zeroed pads: the tokens and
    log-probs are those of a fresh engine, and the recycled memory was the one used."""
    reqs = [(list(f"row {i} {'y' * (5 * i)}".encode()),
             SamplingParams(max_new_tokens=6 + 3 * i, seed=10 + i, ignore_eos=True)) for i in range(4)]
    config = EngineConfig(batch_window_ms=20.0, batch_invariant=batch_invariant)
    with EmbeddedEngine(load_model("tiny"), config) as fresh:
        want = fresh.generate_batch(reqs)
    with EmbeddedEngine(load_model("tiny"), config) as eng:
        eng.generate_batch(reqs)  # leaves its buffer's memory in the spare
        eng.flush_cache()
        spare = eng._normal.spare
        assert spare.flat is None  # flush_cache releases the kept memory
        eng.generate_batch(reqs)
        kept = spare.flat
        assert kept is not None
        ptr = kept.data_ptr()

        def poison() -> None:  # on the engine's thread (inference mode): NaN everywhere, no prefix hits
            kept.fill_(float("nan"))
            eng.radix.evict(eng.radix.total_tokens)

        eng._command(poison)
        got = eng.generate_batch(reqs)
        assert spare.flat is not None and spare.flat.data_ptr() == ptr  # used, then given back
    for a, b in zip(want, got):
        assert a.output_ids == b.output_ids and a.output_logp0 == b.output_logp0 and a.output_logq == b.output_logq
