"""The native kernels: the vector code (AVX-512 or AVX2, whichever this machine builds) against the portable
definition (bit for bit), and the engine's batch invariance in float32 / bfloat16 - a request's bits never
depend on what it is batched with."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from forerun.runtime_ext.engine import EmbeddedEngine, EngineConfig, native
from forerun.runtime_ext.engine.models import build_tiny_model, load_model
from forerun.runtime_ext.protocol import SamplingParams
from forerun.testing.native_paths import both_paths as on_both_paths

K = native.kernels()
pytestmark = pytest.mark.skipif(K is None, reason=f"native kernels unavailable: {native.unavailable_reason()}")


def both_paths(fn):
    """fn() with the vectorized code, then with the portable definition."""
    return on_both_paths(K, fn)


def test_the_vector_code_is_built_wherever_the_machine_has_avx2_or_avx512():
    # otherwise every vector-vs-portable test below compares the portable code with itself
    assert K.vectorized() == (native.isa() in ("avx512", "avx2"))


def assert_same(a, b):
    for x, y in zip(a if isinstance(a, (list, tuple)) else [a], b if isinstance(b, (list, tuple)) else [b]):
        assert torch.equal(x, y)


@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k", [576, 37, 64, 1000])
def test_linear_vector_path_is_the_portable_definition_and_row_invariant(wdtype, k):
    """57 output features: a last panel of 9 (masked stores) inside a unit of 4 panels (one row's tile)."""
    g = torch.Generator().manual_seed(k)
    x = torch.randn(23, k, generator=g)
    x[3] = -0.0  # a row of signed zeros: every sum is a zero, its sign as the portable definition gives it
    ws = [torch.randn(50, k, generator=g).to(wdtype), torch.randn(7, k, generator=g).to(wdtype)]
    bias = torch.randn(57, generator=g)
    packed = K.pack(ws)
    fast, slow = both_paths(lambda: K.linear(x, packed, bias))
    assert_same(fast, slow)
    alone = torch.cat([K.linear(x[i : i + 1].contiguous(), packed, bias) for i in range(23)])
    assert torch.equal(alone, fast)
    for rows in (2, 3, 4, 5, 6, 7, 13):  # every tile shape: streamed 1-6 rows (AVX2: 1-2), one row tile, several
        assert torch.equal(K.linear(x[5 : 5 + rows].contiguous(), packed, bias), fast[5 : 5 + rows])
    ref = x.double() @ torch.cat(ws).double().T + bias.double()
    assert (fast.double() - ref).abs().max() < 1e-3


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 a * b + c rounded once (IEEE fma), elementwise, from float64 arithmetic: a * b is exact in float64;
    TwoSum gives s + e == a * b + c exactly; rounding s to float32 is then the correct rounding except when s lies
    exactly halfway between two floats and e pushes the exact value to one side."""
    p, c64 = a.astype(np.float64) * b.astype(np.float64), c.astype(np.float64)
    s = p + c64
    bv = s - p
    e = (p - (s - bv)) + (c64 - bv)
    r = s.astype(np.float32)
    for toward in (-np.inf, np.inf):
        n = np.nextafter(r, np.float32(toward))
        midpoint = (r.astype(np.float64) + n.astype(np.float64)) / 2
        r = np.where((s == midpoint) & (np.sign(e) == np.sign(n.astype(np.float64) - r)), n, r)
    return r


@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [1, 37, 300])
def test_linear_is_one_fma_chain_per_output_in_input_order(wdtype, k):
    """The definition, computed independently: y[r, n] = fma(x[r, k], w[n, k], ...) for k = 0, 1, ... from +0, then
    + b, each step one float32 rounding.  Both code paths, 1 to 9 rows, 35 outputs (a partial panel)."""
    g = torch.Generator().manual_seed(100 + k)
    x = torch.randn(9, k, generator=g) * torch.logspace(-3, 3, k)  # wide magnitudes: many roundings matter
    w = torch.randn(35, k, generator=g).to(wdtype)
    bias = torch.randn(35, generator=g)
    xn, wn = x.numpy(), w.float().numpy()
    want = np.zeros((9, 35), dtype=np.float32)
    for j in range(k):
        want = fma32(xn[:, j : j + 1], wn[None, :, j], want)
    want = want + bias.numpy()
    packed = K.pack([w])
    for rows in (1, 2, 3, 9):
        fast, slow = both_paths(lambda: K.linear(x[:rows].contiguous(), packed, bias))
        assert np.array_equal(fast.numpy(), want[:rows]) and np.array_equal(slow.numpy(), want[:rows])


@pytest.mark.parametrize("n_out", [34 * 16 - 5, 35 * 16, 38 * 16 - 1])
def test_streamed_calls_split_between_threads_at_any_panel_are_the_definition(n_out):
    """Calls of up to 6 rows (AVX-512; 2 with AVX2) stream the weights: the threads split the output panels evenly
    (not units of 4 panels), so a thread's run can end in a tile of 1, 2 or 3 panels: 34, 35 and 38 panels over 2
    threads give runs of 17 / 17, 18 / 17 and 19 / 19.  K = 576 makes each thread's share big enough to run in
    parallel.  1 to 7 rows: every streamed row count, and the first one with row tiles.  Oracle: fma32 chains."""
    g = torch.Generator().manual_seed(n_out)
    k = 576
    x = torch.randn(7, k, generator=g)
    w = torch.randn(n_out, k, generator=g)
    want = np.zeros((7, n_out), dtype=np.float32)
    for j in range(k):
        want = fma32(x.numpy()[:, j : j + 1], w.numpy()[None, :, j], want)
    packed = K.pack([w])
    for rows in range(1, 8):
        fast, slow = native.with_threads(2, lambda: both_paths(lambda: K.linear(x[:rows].contiguous(), packed, None)))
        assert np.array_equal(fast.numpy(), want[:rows]) and np.array_equal(slow.numpy(), want[:rows])


@pytest.mark.parametrize("schedule", [(0, 1, 1), (0, 1, 4), (16 * 1024, 4, 1), (16 * 1024, 4, 4), (1024, 2, 2),
                                      (64, 3, 4), (64, 3, 1)])
def test_every_row_tile_schedule_gives_the_definition(schedule):
    """The row tile schedule (K blocks of some bytes, 0 = none; how many row tiles prefetch) is chosen per CPU for
    speed; it must never change a bit.  (64, 3): blocks of one or two K steps, so every chain pauses and resumes
    through y hundreds of times.  11, 20 and 33 rows: 2, 2 and 4 row tiles on AVX-512 (10-row tiles), 2, 4 and 6 on
    AVX2.  Oracle: fma32 chains."""
    g = torch.Generator().manual_seed(7)
    k = 300
    x = torch.randn(33, k, generator=g) * torch.logspace(-2, 2, k)
    w = torch.randn(70, k, generator=g)
    want = np.zeros((33, 70), dtype=np.float32)
    for j in range(k):
        want = fma32(x.numpy()[:, j : j + 1], w.numpy()[None, :, j], want)
    packed = K.pack([w])
    default = K.row_tile_schedule()
    K.set_row_tile_schedule(*schedule)
    try:
        for rows in (4, 11, 20, 33):
            got = K.linear(x[:rows].contiguous(), packed, None)
            assert np.array_equal(got.numpy(), want[:rows]), (schedule, rows)
    finally:
        K.set_row_tile_schedule(*default)
    assert K.row_tile_schedule() == default


def test_row_tile_schedule_rejects_nonsense():
    with pytest.raises(RuntimeError, match="row tile schedule"):
        K.set_row_tile_schedule(-1, 1)
    with pytest.raises(RuntimeError, match="row tile schedule"):
        K.set_row_tile_schedule(0, 0)


@pytest.mark.parametrize("quantum", [1, 4])
def test_work_stealing_runs_every_item_once_and_helps_a_slow_thread(quantum):
    """40 items over 2 threads, 1 ms per item on thread 0 and 5 ms on thread 1: thread 0 is done with items 0-19
    first and takes the back of thread 1's range, so thread 1's items are a prefix of 20-39 (a whole number of
    claims of `quantum`) and thread 0's a non-empty suffix.  stealing_trace itself fails an item run twice or never."""
    who = native.with_threads(2, lambda: K.stealing_trace(40, quantum, [1000, 5000]))
    assert who[:20] == [0] * 20
    ones = who[20:].count(1)
    assert who[20:] == [1] * ones + [0] * (20 - ones) and 0 < ones < 20 and ones % quantum == 0


def test_without_work_stealing_the_split_is_static():
    assert K.work_stealing()  # the default
    K.set_work_stealing(False)
    try:
        who = native.with_threads(2, lambda: K.stealing_trace(40, 1, [0, 500]))
    finally:
        K.set_work_stealing(True)
    assert who == [0] * 20 + [1] * 20


def test_linear_is_the_definition_with_either_split():
    """The split decides who runs a panel, never its bits: 1, 2, 6 and 20 rows (both linear paths) with and without
    stealing, against fma32 chains."""
    g = torch.Generator().manual_seed(11)
    k = 200
    x = torch.randn(20, k, generator=g)
    w = torch.randn(16 * 37 - 3, k, generator=g)
    want = np.zeros((20, w.shape[0]), dtype=np.float32)
    for j in range(k):
        want = fma32(x.numpy()[:, j : j + 1], w.numpy()[None, :, j], want)
    packed = K.pack([w])
    try:
        for on in (True, False):
            K.set_work_stealing(on)
            for rows in (1, 2, 4, 6, 20):
                got = native.with_threads(2, lambda: K.linear(x[:rows].contiguous(), packed, None))
                assert np.array_equal(got.numpy(), want[:rows]), (on, rows)
    finally:
        K.set_work_stealing(True)


NONE = torch.empty(0, dtype=torch.long)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_attention_vector_path_is_the_portable_definition(dtype):
    g = torch.Generator().manual_seed(1)
    B, T, Hq, Hkv, D, length = 3, 5, 6, 2, 32, 20
    qkv = torch.randn(B * T, (Hq + 2 * Hkv) * D, generator=g, dtype=dtype)
    cos, sin = torch.randn(B * T, D, generator=g, dtype=dtype), torch.randn(B * T, D, generator=g, dtype=dtype)
    cache = torch.randn(2, B, Hkv, length + T + 3, D, generator=g, dtype=dtype)
    starts = torch.tensor([0, 7, 19])

    def run():
        kv = cache.clone()
        return [K.attention(qkv, cos, sin, kv[0], kv[1], starts, length, T, Hq, Hkv, 0.17, NONE, NONE, 0), kv]

    fast, slow = both_paths(run)
    assert_same(fast, slow)
    # the same row alone (its own keys only) gives the same bits
    kv = cache[:, 1:2].clone()
    alone = K.attention(qkv[T : 2 * T].contiguous(), cos[T : 2 * T].contiguous(), sin[T : 2 * T].contiguous(),
                        kv[0], kv[1], starts[1:2].contiguous(), length, T, Hq, Hkv, 0.17, NONE, NONE, 0)
    assert torch.equal(alone, fast[0][T : 2 * T])


def softmax_attention(q, keys, values, scale):
    """The oracle: softmax(q k^T * scale) v in float64, one query head [D] over keys/values [n, D]."""
    w = torch.softmax((keys.double() @ q.double()) * scale, dim=0)
    return w @ values.double()


def assert_is_softmax_attention(out, queries, kv_pieces, scale):
    """A token's output [Hq * D] against the oracle: query head h (queries [Hq, D], after RoPE) over the keys and
    values of its KV head h // (Hq / Hkv), the concatenation of kv_pieces (each [2, Hkv, n, D], in order)."""
    Hq, D = queries.shape
    groups = Hq // kv_pieces[0].shape[1]
    for h in range(Hq):
        keys = torch.cat([p[0, h // groups] for p in kv_pieces])
        values = torch.cat([p[1, h // groups] for p in kv_pieces])
        want = softmax_attention(queries[h], keys, values, scale)
        assert torch.allclose(out[h * D : (h + 1) * D].double(), want, rtol=1e-5, atol=1e-6), h


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_attention_after_a_cached_prompt_is_softmax_attention_on_any_thread_count(threads):
    """Rows decoding after a cached prompt (read in place from a prefix segment, few buffer columns of their own),
    alone and in a batch, on 1 to 3 threads: every query head's output is its softmax attention over its row's keys,
    and a row's bits do not depend on its batch or on how its attention tasks were split."""
    g = torch.Generator().manual_seed(5)
    layers, layer, Hq, Hkv, D, P, own, B = 2, 1, 6, 2, 32, 700, 7, 5  # P: enough keys for a task per thread
    scale = 0.19
    prefix = torch.randn(layers, 2, Hkv, P, D, generator=g)
    qkv = torch.randn(B, (Hq + 2 * Hkv) * D, generator=g)
    ones, zeros = torch.ones(B, D), torch.zeros(B, D)  # cos = 1, sin = 0: RoPE is the identity
    cache = torch.randn(2, B, Hkv, own + 1, D, generator=g)
    seg = torch.tensor([[prefix.data_ptr(), P]], dtype=torch.long)

    def attend(rows):
        kv = cache[:, rows].clone()
        seg_b = seg.repeat(len(rows), 1)
        off = torch.arange(len(rows) + 1, dtype=torch.long)
        out = native.with_threads(threads, lambda: K.attention(
            qkv[rows].contiguous(), ones[rows].contiguous(), zeros[rows].contiguous(), kv[0], kv[1],
            torch.zeros(len(rows), dtype=torch.long), own, 1, Hq, Hkv, scale, seg_b, off, layer))
        return out, kv

    batch, _ = attend(list(range(B)))
    for b in range(B):
        alone, kv = attend([b])
        assert torch.equal(alone[0], batch[b])
        assert_is_softmax_attention(alone[0], qkv[b, : Hq * D].view(Hq, D), [prefix[layer], kv[:, 0, :, : own + 1]],
                                    scale)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("D", [32, 64, 128])  # 64 and 128: the AVX-512 scores of keys stored one after another
def test_rows_forked_from_different_prompts_attend_in_one_batch_as_alone(threads, D):
    """A decode step's rows forked from several cached prompts (rows sharing leading segments read them together, up
    to a few per task), some with a second segment of their own or shared, one with none, each with its own buffer
    columns: every row's output has the bits of the row attended alone, on the vector and the portable code, and is
    its softmax attention over its keys."""
    g = torch.Generator().manual_seed(11)
    layers, layer, Hq, Hkv, cap = 2, 0, 6, 2, 12
    scale = 0.21
    seg = lambda n: torch.randn(layers, 2, Hkv, n, D, generator=g)
    a, c, d, e, f = seg(300), seg(45), seg(60), seg(25), seg(50)
    rows = [[a], [a, seg(20)], [a], [c], [a, seg(7)], [], [a], [c], [a], [a, seg(33)],  # each row's prefix segments
            [d, e], [d, e, seg(5)], [d, e], [d, e],  # rows forked from one node below a shared prompt
            [f, seg(9)], [f, seg(14)], [f, seg(3)]]  # one prompt, then segments of their own
    B = len(rows)
    starts = torch.tensor([(3 * b) % 7 for b in range(B)], dtype=torch.long)  # first own column of each row
    length = cap - 1
    qkv = torch.randn(B, (Hq + 2 * Hkv) * D, generator=g)
    ones, zeros = torch.ones(B, D), torch.zeros(B, D)  # RoPE is the identity
    cache = torch.randn(2, B, Hkv, cap, D, generator=g)

    def attend(idx):
        kv = cache[:, idx].clone()
        table = [[t.data_ptr(), t.shape[3]] for b in idx for t in rows[b]]
        seg_t = torch.tensor(table, dtype=torch.long).reshape(-1, 2)
        off = torch.tensor([0] + list(np.cumsum([len(rows[b]) for b in idx])), dtype=torch.long)
        return native.with_threads(threads, lambda: K.attention(
            qkv[idx].contiguous(), ones[idx].contiguous(), zeros[idx].contiguous(), kv[0], kv[1],
            starts[idx].contiguous(), length, 1, Hq, Hkv, scale, seg_t, off, layer)), kv

    batch, portable = both_paths(lambda: attend(list(range(B)))[0])
    assert torch.equal(batch, portable)
    for b in range(B):
        alone, kv = attend([b])
        assert torch.equal(alone[0], batch[b]), b
        assert_is_softmax_attention(alone[0], qkv[b, : Hq * D].view(Hq, D),
                                    [t[layer] for t in rows[b]] + [kv[:, 0, :, starts[b] : length + 1]], scale)


def rope_reference(x, cos, sin):
    """transformers' RoPE in float64: x cos + rotate_half(x) sin, rotate_half(x) = (-x[D/2:], x[:D/2])."""
    x, h = x.double(), x.shape[-1] // 2
    return x * cos.double() + torch.cat([-x[h:], x[:h]]) * sin.double()


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("T", [2, 11, 37])  # 37: three runs of tokens
def test_a_prompt_attended_at_once_is_its_tokens_attended_one_at_a_time(threads, T):
    """A prompt's T tokens in one call (after a cached segment and columns already in the buffer; its tokens share
    keys and attend in runs) give the bits of the same tokens fed one per call, on the vector and the portable code,
    and each query head's output is its softmax attention over its token's keys."""
    g = torch.Generator().manual_seed(T)
    layers, layer, Hq, Hkv, D, P, before = 2, 1, 6, 2, 64, 90, 13
    scale = 0.17
    prefix = torch.randn(layers, 2, Hkv, P, D, generator=g)
    seg, off = torch.tensor([[prefix.data_ptr(), P]], dtype=torch.long), torch.tensor([0, 1], dtype=torch.long)
    qkv = torch.randn(T, (Hq + 2 * Hkv) * D, generator=g)
    cos, sin = torch.randn(T, D, generator=g), torch.randn(T, D, generator=g)
    cache = torch.zeros(2, 1, Hkv, before + T, D)
    cache[:, :, :, :before] = torch.randn(2, 1, Hkv, before, D, generator=g)
    start = torch.tensor([2])  # the row's first valid column

    def at_once():
        kv = cache.clone()
        out = native.with_threads(threads, lambda: K.attention(qkv, cos, sin, kv[0], kv[1], start, before, T, Hq, Hkv,
                                                               scale, seg, off, layer))
        return out, kv

    (fast, kv), (slow, _) = both_paths(at_once)
    assert torch.equal(fast, slow)
    one = cache.clone()
    for j in range(T):
        out = K.attention(qkv[j : j + 1].contiguous(), cos[j : j + 1].contiguous(), sin[j : j + 1].contiguous(),
                          one[0], one[1], start, before + j, 1, Hq, Hkv, scale, seg, off, layer)
        assert torch.equal(out[0], fast[j]), j
    assert torch.equal(one, kv)
    for j in range(T):
        queries = torch.stack([rope_reference(qkv[j, h * D : (h + 1) * D], cos[j], sin[j]) for h in range(Hq)])
        assert_is_softmax_attention(fast[j], queries, [prefix[layer], kv[:, 0, :, 2 : before + j + 1]], scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_attention_over_prefix_segments_equals_the_same_keys_in_the_buffer(dtype):
    """Keys read in place from prefix segments (radix-cache KV) give the bits of the same keys in the buffer."""
    g = torch.Generator().manual_seed(3)
    layers, layer, T, Hq, Hkv, D = 2, 1, 3, 4, 2, 32
    pieces = [torch.randn(layers, 2, Hkv, n, D, generator=g, dtype=dtype) for n in (17, 5, 40)]
    prefix = torch.cat(pieces, dim=3)  # [layers, 2, Hkv, 62, D]
    P, own = prefix.shape[3], 4
    qkv = torch.randn(T, (Hq + 2 * Hkv) * D, generator=g, dtype=dtype)
    cos, sin = torch.randn(T, D, generator=g, dtype=dtype), torch.randn(T, D, generator=g, dtype=dtype)
    tail = torch.randn(2, 1, Hkv, own + T, D, generator=g, dtype=dtype)
    full = torch.zeros(2, 1, Hkv, P + own + T, D, dtype=dtype)  # the same keys, all in the buffer
    full[:, 0, :, :P] = prefix[layer]
    full[:, 0, :, P : P + own] = tail[:, 0, :, :own]
    seg = torch.tensor([[t.data_ptr(), t.shape[3]] for t in pieces], dtype=torch.long)
    off = torch.tensor([0, len(pieces)], dtype=torch.long)
    for portable in (False, True):
        K.set_portable(portable)
        try:
            a = K.attention(qkv, cos, sin, full[0], full[1], torch.tensor([0]), P + own, T, Hq, Hkv, 0.2, NONE, NONE, 0)
            b = K.attention(qkv, cos, sin, tail[0], tail[1], torch.tensor([0]), own, T, Hq, Hkv, 0.2, seg, off, layer)
        finally:
            K.set_portable(False)
        assert torch.equal(a, b)
        assert torch.equal(full[:, 0, :, P + own :], tail[:, 0, :, own:])  # the new keys land alike


def test_norm_silu_and_vocabulary_math_vector_path_is_the_portable_definition():
    g = torch.Generator().manual_seed(2)
    h, add, w = torch.randn(7, 100, generator=g), torch.randn(7, 100, generator=g), torch.randn(100, generator=g)

    def norm():
        hh = h.clone()
        return [K.rmsnorm(hh, add, w, 1e-5), hh]

    assert_same(*both_paths(norm))
    gu = torch.cat([torch.linspace(-100, 100, 999), torch.randn(999, generator=g)]).reshape(1, -1).contiguous()
    assert_same(*both_paths(lambda: K.silu_mul(gu)))
    logits = torch.randn(4, 5003, generator=g) * 5
    fast, slow = both_paths(lambda: K.vocab_stats(logits))
    assert_same(fast, slow)
    rows, taus, us = torch.arange(4), torch.tensor([1.0, 0.5, 0.25, 2.0], dtype=torch.float64), torch.rand(4, dtype=torch.float64)
    drawn = both_paths(lambda: K.draw(logits, fast[0], rows, taus, us))
    assert_same(*drawn)
    tokens, _, drawn_logits = drawn[0]
    assert torch.equal(drawn_logits, logits[rows, tokens].double())  # the drawn tokens' logits
    lse = torch.logsumexp(logits.double(), -1)
    assert (fast[0].double() + fast[1] - lse).abs().max() < 1e-6
    bad = logits.clone()
    bad[0, 17], bad[1, 4000], bad[2, 33] = float("nan"), float("inf"), float("-inf")  # inside the vector blocks
    fast, slow = both_paths(lambda: K.vocab_stats(bad))
    assert fast[3].tolist() == slow[3].tolist() == [False, False, False, True]


def _requests(tokenizer, n_new):
    texts = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,", "Once upon a time",
             "The capital of France is Paris, and the capital of Italy is"]
    reqs = []
    for i in range(20):
        ids = list(tokenizer.encode(texts[i % len(texts)] + " " * (i // len(texts))))
        temp = [0.0, 1.0, 0.7, 0.25][i % 4]
        reqs.append((ids, SamplingParams(max_new_tokens=n_new + i % 3, temperature=temp, seed=i, ignore_eos=True,
                                         top_logprobs_num=2 if i % 5 == 0 else 0)))
    return reqs


def _key(out):
    return (out.output_ids, out.output_logq, out.output_logp0, out.output_entropy)


def check_batch_sizes_1_to_20(eng, n_new, seed=0):
    """20 requests alone (cold cache), then in batches of every size 1..20 in random order with the cache
    left warm: every output's tokens and log-probs are bit-identical to the request alone."""
    reqs = _requests(eng.tokenizer, n_new)
    alone = []
    for ids, p in reqs:
        eng.flush_cache()
        alone.append(_key(eng.generate(ids, p)))
    rng = np.random.default_rng(seed)
    for size in range(1, 21):
        order = rng.permutation(20).tolist()
        for start in range(0, 20, size):
            chunk = order[start : start + size]
            outs = eng.generate_batch([reqs[i] for i in chunk])
            for i, out in zip(chunk, outs):
                assert _key(out) == alone[i], f"request {i} differs in a batch of {len(chunk)}"
    assert eng.stats()["max_batch_rows"] == 20


def test_float32_batches_of_every_size_are_bit_identical_to_alone():
    with EmbeddedEngine(build_tiny_model(torch.float32, hidden_size=96), EngineConfig(batch_window_ms=5)) as eng:
        assert eng.plan.path == "native" and eng.batch_invariant
        check_batch_sizes_1_to_20(eng, n_new=6)


def test_bfloat16_weights_batches_are_bit_identical_and_close_to_float32():
    with EmbeddedEngine(build_tiny_model(torch.bfloat16, hidden_size=96), EngineConfig(batch_window_ms=5)) as eng:
        assert eng.kv_dtype == torch.float32
        check_batch_sizes_1_to_20(eng, n_new=4, seed=1)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_default_model_batches_of_every_size_are_bit_identical_to_alone(dtype):
    with EmbeddedEngine(load_model("default", dtype=dtype), EngineConfig(batch_window_ms=20)) as eng:
        assert eng.plan.path == "native"
        check_batch_sizes_1_to_20(eng, n_new=4)


@pytest.mark.parametrize("streams", [1, 2, 4])
@pytest.mark.parametrize("slice_lines,steps", [(576, 576), (48, 192), (10, 10), (7, 30), (3, 3)])
def test_a_prefetching_tile_fetches_every_line_of_its_slice_in_interleaved_streams(streams, slice_lines, steps):
    """A row tile prefetches its slice of the next weights over its K steps (`prefetch_trace`: the line at each
    step).  Every line of the slice once (repeated when there are more steps than lines), none outside it; with S
    streams the first S prefetches start S runs a chunk apart (several streams of memory at once: the speed-up the
    streams exist for), each run in order."""
    got = K.prefetch_trace(slice_lines, steps, streams)
    assert len(got) == steps
    assert set(got) == set(range(slice_lines))
    distinct = list(dict.fromkeys(got))
    chunk = slice_lines // streams
    if chunk >= 1:
        assert distinct[:streams] == [s * chunk for s in range(streams)]
        for s in range(streams):
            run = [line for line in distinct if s * chunk <= line < (s + 1) * chunk]
            assert run == sorted(run)
    assert distinct[streams * chunk:] == list(range(streams * chunk, slice_lines))


@pytest.mark.parametrize("rows,calls", [([65, 65, 65, 65], 20), ([140], 9), ([3, 0, 5], 40), ([16, 1], 1),
                                        ([7, 9], 0), ([], 4), ([1] * 16, 5)])
def test_an_attention_task_prefetches_every_row_of_its_pieces_once_spread_over_its_blocks(rows, calls):
    """An attention task prefetches the KV rows of several pieces (each of its tokens' columns) piece after piece,
    spread evenly over its `calls` blocks of keys (`piece_stream_trace`: the rows covered by pace(), then by each
    call).  Every row of every piece exactly once, in order; nothing at pace() unless there are no calls to spread
    over; no call more than ceil(total / calls) rows, so the last rows come before the task's scores end."""
    trace = K.piece_stream_trace(rows, calls)
    assert len(trace) == calls + 1
    flat = [x for call in trace for x in call]
    expected = [(j << 32) | r for j, n in enumerate(n for n in rows if n > 0) for r in range(n)]
    assert flat == expected
    total = sum(rows)
    if calls > 0:
        assert trace[0] == []
        assert max(len(call) for call in trace[1:]) <= -(-total // calls)
    else:
        assert trace[0] == expected


def test_prefetch_streams_are_1_2_or_4():
    with pytest.raises(RuntimeError, match="row tile schedule"):
        K.set_row_tile_schedule(16 * 1024, 4, 3)
    with pytest.raises(RuntimeError, match="prefetch_trace"):
        K.prefetch_trace(10, 10, 3)


@pytest.mark.parametrize("streams", [1, 2, 3, 4, 16])
@pytest.mark.parametrize("n", [1, 63, 64, 1000, 1_000_003])
def test_the_bandwidth_probe_reads_every_element_once(streams, n):
    """`stream_read` (bench engine's bandwidth probe) splits each thread's share into interleaved runs; its sum of
    small integers (exact in float32 partial sums) is the tensor's sum only when every element is read once."""
    x = torch.arange(n, dtype=torch.float32) % 7
    got = native.with_threads(2, lambda: K.stream_read(x, streams))
    assert got == float(x.double().sum())
