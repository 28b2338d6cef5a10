"""Embedded engine against brute-force oracles: a plain transformers forward of the full sequence,
direct log q_τ / entropy computations, alone-vs-batched invariance, radix reuse, concurrency."""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from forerun.runtime_ext.engine import (
    EmbeddedEngine,
    EngineConfig,
    entropy_from_log_probs,
    sample_inverse_cdf,
    sampling_log_probs,
    sampling_uniform,
)
from forerun.runtime_ext.engine.models import load_model
from forerun.runtime_ext.protocol import Engine, EngineError, SamplingParams
from forerun.testing.kv_memory import held_tokens
from forerun.testing.transformers_oracle import norms_in_model_dtype

TOL = 1e-10


@pytest.fixture(scope="module")
def engine():
    eng = EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=2.0))
    yield eng
    eng.close()


def prompt(engine, text):
    return list(engine.tokenizer.encode(text))


def full_logp(engine, ids):
    """Oracle: log p0 at every position from one plain transformers forward without any cache."""
    with torch.inference_mode(), norms_in_model_dtype():
        logits = engine.model(input_ids=torch.tensor([list(ids)])).logits[0].double()
    return torch.log_softmax(logits, -1), logits


def check_against_oracle(engine, out):
    seq = list(out.input_ids) + list(out.output_ids)
    logp, _ = full_logp(engine, seq)
    n = len(out.input_ids)
    for t, tok in enumerate(out.output_ids):
        assert out.output_logp0[t] == pytest.approx(float(logp[n - 1 + t, tok]), abs=TOL)
        assert out.output_entropy[t] == pytest.approx(float(entropy_from_log_probs(logp[n - 1 + t])), abs=TOL)


def test_satisfies_engine_protocol(engine):
    assert isinstance(engine, Engine)
    info = engine.server_info()
    assert info["served_model_name"] == "tiny" and info["max_context"] == 2048


def test_logp0_matches_plain_forward_with_and_without_cache_hits(engine):
    engine.flush_cache()
    root = prompt(engine, "The quick brown fox jumps over the lazy dog. ☃ Ünïcode!")
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=7, ignore_eos=True, return_logprob=True)
    cold = engine.generate(root, params)
    assert cold.meta_info["cached_tokens"] == 0
    check_against_oracle(engine, cold)
    warm = engine.generate(root, params)
    assert warm.meta_info["cached_tokens"] == len(root) - 1
    assert warm.output_ids == cold.output_ids
    np.testing.assert_allclose(warm.output_logp0, cold.output_logp0, atol=TOL)
    full = root + list(cold.output_ids)
    for cut in (1, 5, 23, len(root), len(root) + 6, len(full)):  # several cut points, in and beyond the prompt
        out = engine.generate(full[:cut], SamplingParams(max_new_tokens=5, seed=cut, ignore_eos=True))
        assert out.meta_info["cached_tokens"] == max(min(cut - 1, len(full) - 1), 0) or cut == len(full)
        check_against_oracle(engine, out)


def test_logits_and_next_token_logits_match_forward(engine):
    ids = prompt(engine, "logits at the end")
    _, logits = full_logp(engine, ids)
    np.testing.assert_allclose(engine.next_token_logits(ids), logits[-1].numpy(), atol=TOL)
    np.testing.assert_allclose(engine.next_token_logits(ids), logits[-1].numpy(), atol=TOL)  # cached


def test_batch_invariance_any_order(engine):
    reqs = [
        (prompt(engine, "alpha beta"), SamplingParams(max_new_tokens=9, temperature=0.8, seed=1, ignore_eos=True)),
        (prompt(engine, "gamma"), SamplingParams(max_new_tokens=4, temperature=1.3, top_k=20, seed=2, ignore_eos=True)),
        (prompt(engine, "a much longer prompt with ☃ inside"), SamplingParams(max_new_tokens=13, top_p=0.9, seed=3, ignore_eos=True)),
        (prompt(engine, "greedy one"), SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)),
        (prompt(engine, "alpha beta"), SamplingParams(max_new_tokens=7, temperature=1.0, seed=99, ignore_eos=True)),
    ]
    engine.flush_cache()
    alone = [engine.generate(ids, p) for ids, p in reqs]
    for order in ([0, 1, 2, 3, 4], [4, 2, 0, 3, 1]):
        engine.flush_cache()
        batched = engine.generate_batch([reqs[i] for i in order])
        for i, out in zip(order, batched):  # bit-exact (float64, batch-invariant kernels)
            assert out.output_ids == alone[i].output_ids
            assert out.output_logq == alone[i].output_logq
            assert out.output_logp0 == alone[i].output_logp0
            assert out.output_entropy == alone[i].output_entropy


def test_bit_exact_whatever_the_cache_state(engine):
    """KV computed by prefill, by decode, or reused from the tree gives the same bits."""
    ids = prompt(engine, "cache state invariance ☃")
    p = SamplingParams(max_new_tokens=10, seed=4, ignore_eos=True, return_logprob=True)
    engine.flush_cache()
    first = engine.generate(ids, p)
    full = list(ids) + list(first.output_ids)
    cut = len(ids) + 6  # tokens ids[..], out[:6]: their KV was computed by decode steps
    q = SamplingParams(max_new_tokens=5, seed=9, ignore_eos=True)
    from_decode_kv = engine.generate(full[:cut], q)
    assert from_decode_kv.meta_info["cached_tokens"] == cut - 1
    engine.flush_cache()
    from_prefill = engine.generate(full[:cut], q)
    assert from_prefill.meta_info["cached_tokens"] == 0
    assert from_decode_kv.output_ids == from_prefill.output_ids
    assert from_decode_kv.output_logp0 == from_prefill.output_logp0
    assert from_decode_kv.output_entropy == from_prefill.output_entropy


def test_logq_equals_direct_computation(engine):
    ids = prompt(engine, "sampling distribution")
    for temp, top_k, top_p, min_p in [(1.0, -1, 1.0, 0.0), (0.7, -1, 1.0, 0.0), (1.5, 10, 1.0, 0.0),
                                      (1.0, -1, 0.8, 0.0), (0.9, 30, 0.95, 0.0), (1.5, -1, 1.0, 0.05),
                                      (1.2, 40, 0.9, 0.2)]:
        out = engine.generate(ids, SamplingParams(max_new_tokens=6, temperature=temp, top_k=top_k, top_p=top_p,
                                                  min_p=min_p, seed=11, ignore_eos=True, return_logprob=True))
        _, logits = full_logp(engine, list(ids) + list(out.output_ids))
        n = len(ids)
        for t, tok in enumerate(out.output_ids):
            z = logits[n - 1 + t] / temp
            if top_k > 0:
                kth = torch.sort(z, descending=True).values[top_k - 1]
                z = torch.where(z >= kth, z, torch.tensor(float("-inf"), dtype=z.dtype))
            q = torch.softmax(z, -1)
            if top_p < 1:  # brute force nucleus: smallest prefix by probability with mass >= top_p
                order = torch.argsort(q, descending=True)
                keep = torch.zeros_like(q, dtype=torch.bool)
                mass = 0.0
                for j in order.tolist():
                    keep[j] = True
                    mass += float(q[j])
                    if mass >= top_p:
                        break
                q = torch.where(keep, q, torch.zeros_like(q))
                q = q / q.sum()
            if min_p > 0:  # SGLang: after top-k / top-p, keep probability >= min_p x the largest
                q = torch.where(q >= min_p * q.max(), q, torch.zeros_like(q))
                q = q / q.sum()
            assert q[tok] > 0
            assert out.output_logq[t] == pytest.approx(float(torch.log(q[tok])), abs=1e-9)
            assert out.meta_info["output_token_logprobs"][t][:2] == [out.output_logq[t], tok]


def test_sampling_helpers():
    logq = torch.log(torch.tensor([0.0, 0.25, 0.5, 0.25], dtype=torch.float64))
    assert sample_inverse_cdf(logq, 0.0) == 1
    assert sample_inverse_cdf(logq, 0.2499) == 1
    assert sample_inverse_cdf(logq, 0.26) == 2
    assert sample_inverse_cdf(logq, 0.9999999) == 3
    u = [sampling_uniform(5, p) for p in range(200)]
    assert u == [sampling_uniform(5, p) for p in range(200)] and all(0 <= x < 1 for x in u)
    assert u != [sampling_uniform(6, p) for p in range(200)]
    assert 0.4 < float(np.mean(u)) < 0.6
    logits = torch.randn(50, dtype=torch.float64)
    lq = sampling_log_probs(logits, 1.0, top_k=5)
    assert int(torch.isfinite(lq).sum()) == 5
    with pytest.raises(ValueError):
        sampling_log_probs(logits, 0.0)
    assert torch.equal(torch.isfinite(sampling_log_probs(logits, 1.0, min_p=1.0)), logits == logits.max())


def test_min_p_one_is_greedy_and_penalties_are_refused_not_ignored(engine):
    ids = prompt(engine, "min p")
    greedy = engine.generate(ids, SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True))
    for seed in range(3):
        hot = engine.generate(ids, SamplingParams(max_new_tokens=6, temperature=1.5, min_p=1.0, seed=seed, ignore_eos=True))
        assert hot.output_ids == greedy.output_ids and hot.output_logq == (0.0,) * 6  # q is the point mass
    for name in ("frequency_penalty", "presence_penalty"):
        with pytest.raises(EngineError, match=f"{name} are not implemented by the embedded engine"):
            engine.generate(ids, SamplingParams(max_new_tokens=2, **{name: 0.5}))
    with pytest.raises(ValueError, match="min_p must be in"):
        SamplingParams(min_p=1.5)


def test_sampling_uniform_is_numpys_seed_sequence_of_seed_words_and_position():
    """u(seed, p) = the first two words of numpy's SeedSequence([seed lo, seed hi, p]) (the stream every run since
    the engine's first has drawn from): numpy itself is the oracle, over seeds and positions of every width,
    including positions past 2^32 (two entropy words) and seeds past 2^64 (reduced mod 2^64)."""
    rng = np.random.default_rng(7)
    cases = [(0, 0), (1, 0), (0, 1), (2**64 - 1, 2**32 - 1), (2**32, 2**32), (5, 2**70 + 3), (-1, 7), (2**64 + 9, 3)]
    def word() -> int:  # any width from 1 to 62 bits
        return int(rng.integers(0, 2**62)) >> int(rng.integers(0, 62))

    cases += [(word(), word()) for _ in range(3000)]
    for seed, position in cases:
        s = seed % 2**64
        w = np.random.SeedSequence([s % 2**32, s >> 32, position]).generate_state(2, np.uint32)
        bits = ((int(w[0]) << 21) ^ (int(w[1]) >> 11)) % 2**53
        assert sampling_uniform(seed, position) == bits / 2**53, (seed, position)


def test_empirical_distribution_follows_q(engine):
    """Inverse-CDF with the keyed uniform draws from q_τ: frequencies over many seeds match q."""
    ids = prompt(engine, "x")
    _, logits = full_logp(engine, ids)
    q = torch.softmax(logits[-1] / 1.0, -1).numpy()
    outs = engine.generate_batch([(ids, SamplingParams(max_new_tokens=1, seed=s)) for s in range(400)])
    counts = np.bincount([o.output_ids[0] for o in outs], minlength=len(q)) / 400
    assert np.abs(counts - q).sum() < 0.5  # total variation, loose (400 draws)
    assert all(o.output_logq[0] == pytest.approx(np.log(q[o.output_ids[0]]), abs=1e-9) for o in outs[:20])


def test_greedy_and_seeds(engine):
    ids = prompt(engine, "greedy")
    g = engine.generate(ids, SamplingParams(max_new_tokens=5, temperature=0.0, ignore_eos=True))
    logp, logits = full_logp(engine, list(ids) + list(g.output_ids))
    assert list(g.output_ids) == [int(torch.argmax(logits[len(ids) - 1 + t])) for t in range(5)]
    # SGLang reports a greedy token's log_softmax of the logits (τ < 1e-6 runs as τ = 1, top_k = 1): log p0
    expect = [float(logp[len(ids) - 1 + t][y]) for t, y in enumerate(g.output_ids)]
    assert g.output_logq == pytest.approx(expect, abs=TOL) and g.output_logq == g.output_logp0
    top = [entry[0][0] for entry in engine.generate(ids, SamplingParams(
        max_new_tokens=5, temperature=0.0, ignore_eos=True, return_logprob=True, top_logprobs_num=1)).meta_info["output_top_logprobs"]]
    assert g.output_logq == tuple(top)  # the logprob of the token and its top-1 entry agree
    a = engine.generate(ids, SamplingParams(max_new_tokens=20, ignore_eos=True))
    b = engine.generate(ids, SamplingParams(max_new_tokens=20, ignore_eos=True))
    assert a.meta_info["sampling_seed"] != b.meta_info["sampling_seed"]
    c = engine.generate(ids, SamplingParams(max_new_tokens=20, ignore_eos=True, seed=a.meta_info["sampling_seed"]))
    assert c.output_ids == a.output_ids


def test_noise_is_keyed_by_absolute_position(engine):
    """Continuing a generation from its prefix with the same seed reproduces the same tokens."""
    ids = prompt(engine, "positional noise")
    p = SamplingParams(max_new_tokens=10, seed=42, ignore_eos=True)
    full = engine.generate(ids, p)
    head = engine.generate(ids, SamplingParams(max_new_tokens=4, seed=42, ignore_eos=True))
    tail = engine.generate(list(ids) + list(head.output_ids), SamplingParams(max_new_tokens=6, seed=42, ignore_eos=True))
    assert head.output_ids + tail.output_ids == full.output_ids


def test_scoring_mode_shift(engine):
    ids = prompt(engine, "score these prompt tokens ☃")
    logp, _ = full_logp(engine, ids)
    for start in (0, 1, 7, len(ids) - 1):
        out = engine.generate(ids, SamplingParams(max_new_tokens=0, return_logprob=True, logprob_start_len=start,
                                                  top_logprobs_num=3))
        entries = out.meta_info["input_token_logprobs"]
        assert out.output_ids == () and out.meta_info["finish_reason"]["type"] == "length"
        assert len(entries) == len(ids) - start
        assert entries[0][0] is None and entries[0][1] == ids[start]
        for j in range(1, len(entries)):
            pos = start + j
            assert entries[j][1] == ids[pos]
            assert entries[j][0] == pytest.approx(float(logp[pos - 1, ids[pos]]), abs=TOL)
            assert out.meta_info["input_token_entropy"][j] == pytest.approx(float(entropy_from_log_probs(logp[pos - 1])), abs=TOL)
            top = out.meta_info["input_top_logprobs"][j]
            assert [t[1] for t in top] == torch.topk(logp[pos - 1], 3).indices.tolist()
        assert out.input_logp0 == tuple(e[0] for e in entries)
        assert out.meta_info["cached_tokens"] <= start


def test_top_logprobs_of_p0(engine):
    ids = prompt(engine, "top k")
    out = engine.generate(ids, SamplingParams(max_new_tokens=3, top_logprobs_num=4, temperature=0.5, seed=1, ignore_eos=True,
                                              return_logprob=True))
    logp, _ = full_logp(engine, list(ids) + list(out.output_ids))
    for t, top in enumerate(out.meta_info["output_top_logprobs"]):
        ref = torch.topk(logp[len(ids) - 1 + t], 4)
        assert [e[1] for e in top] == ref.indices.tolist()
        np.testing.assert_allclose([e[0] for e in top], ref.values.numpy(), atol=TOL)


def test_stop_conditions(engine):
    """SGLang 0.5.23's rules (output.py docstring): a stop id ends the output and stays in output_ids but not in
    the text; ignore_eos ignores stop ids too; min_new_tokens masks EOS and the stop ids out of the draws."""
    ids = prompt(engine, "stops")
    base = engine.generate(ids, SamplingParams(max_new_tokens=30, seed=5, ignore_eos=True))
    out_ids = list(base.output_ids)
    eos = engine.model_info.eos_token_ids[0]
    # a stop id that comes before any EOS of the reference output
    tok = next(t for i, t in enumerate(out_ids[2:], 2) if t != eos and eos not in out_ids[: i + 1])
    first = out_ids.index(tok)
    s = engine.generate(ids, SamplingParams(max_new_tokens=30, seed=5, stop_token_ids=(tok,)))
    assert list(s.output_ids) == out_ids[: first + 1]
    assert s.meta_info["finish_reason"] == {"type": "stop", "matched": tok}
    assert s.text == engine.tokenizer.decode(out_ids[:first], skip_special_tokens=True)  # the stop id dropped
    ignored = engine.generate(ids, SamplingParams(max_new_tokens=30, seed=5, ignore_eos=True, stop_token_ids=(tok,)))
    assert list(ignored.output_ids) == out_ids and ignored.meta_info["finish_reason"]["type"] == "length"
    # stop string: the text is cut before it
    text = engine.tokenizer.decode(out_ids[:12], skip_special_tokens=True)
    stop = next((text[i : i + 2] for i in range(3, len(text) - 1) if "\ufffd" not in text[i : i + 2]), None)
    if stop:
        s3 = engine.generate(ids, SamplingParams(max_new_tokens=30, seed=5, ignore_eos=True, stop=(stop,)))
        assert s3.meta_info["finish_reason"] == {"type": "stop", "matched": stop}
        assert stop not in s3.text and s3.text == text[: text.find(stop)]
    # EOS ends a generation unless ignore_eos
    seqs = engine.generate_batch([(ids, SamplingParams(max_new_tokens=60, seed=k)) for k in range(30)])
    for o in seqs:
        if eos in o.output_ids:
            assert o.output_ids[-1] == eos and o.meta_info["finish_reason"] == {"type": "stop", "matched": eos}
        else:
            assert len(o.output_ids) == 60 and o.meta_info["finish_reason"]["type"] == "length"


def test_min_new_tokens_masks_eos_and_stop_ids(engine):
    """Before min_new_tokens tokens, EOS and the stop ids are never drawn (their probability is moved to the
    other tokens: log q is the masked log-softmax, checked against the raw logits' log p0 and entropy-free
    arithmetic), and after it the output stops at the next of them; output_token_logprobs_masked says so."""
    ids = prompt(engine, "min tokens")
    eos = engine.model_info.eos_token_ids[0]
    # the most frequent first tokens of free draws: the stop id most likely to be masked for real
    firsts = [o.output_ids[0] for o in engine.generate_batch(
        [(ids, SamplingParams(max_new_tokens=1, seed=k)) for k in range(40)])]
    tok = max(set(firsts), key=firsts.count)
    for seed in range(6):
        m = 4
        o = engine.generate(ids, SamplingParams(max_new_tokens=12, seed=seed, min_new_tokens=m,
                                                stop_token_ids=(tok,), temperature=1.0, return_logprob=True))
        assert o.meta_info["output_token_logprobs_masked"] is True
        assert not {tok, eos} & set(o.output_ids[:m])
        later = [i for i, t in enumerate(o.output_ids) if t in (tok, eos)]
        assert later == ([len(o.output_ids) - 1] if later else [])
        assert later or len(o.output_ids) == 12
        # at τ = 1, log q of a masked draw = log p0 − log(1 − p0(EOS) − p0(tok)): the mass renormalised
        logp, _ = full_logp(engine, list(ids) + list(o.output_ids))
        n = len(ids)
        for t in range(m):
            row = logp[n - 1 + t]
            banned_mass = sum(math.exp(float(row[b])) for b in {tok, eos})
            assert o.output_logp0[t] == pytest.approx(float(row[o.output_ids[t]]), abs=TOL)
            assert o.output_logq[t] == pytest.approx(float(row[o.output_ids[t]]) - math.log1p(-banned_mass), abs=1e-9)


def test_bad_input(engine):
    with pytest.raises(EngineError, match="empty prompt"):
        engine.generate([], SamplingParams(max_new_tokens=2))
    with pytest.raises(EngineError, match="exceeds the model context"):
        engine.generate([1, 2, 3], SamplingParams(max_new_tokens=engine.model_info.max_context))
    with pytest.raises(EngineError, match="outside the vocabulary"):
        engine.generate([1, 10_000], SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1.0)
    with pytest.raises(EngineError, match="logprob_start_len"):  # beyond the prompt (SGLang aborts only that)
        engine.generate([1, 2], SamplingParams(max_new_tokens=0, return_logprob=True, logprob_start_len=3))
    with pytest.raises(ValueError, match="max_total_tokens"):
        EngineConfig(max_total_tokens=0)
    with pytest.raises(EngineError, match="input_ids must be integers"):
        engine.generate([1.7, 2.2], SamplingParams(max_new_tokens=2))
    for bad in (1.7, "x", True):  # refused as the request's error, never truncated to an int or raised raw
        with pytest.raises(EngineError, match="priority must be an integer"):
            engine.generate([1, 2], SamplingParams(max_new_tokens=1), priority=bad)


@pytest.mark.parametrize("bad, match", [
    (dict(max_new_tokens=3.0), "max_new_tokens must be an integer"),
    (dict(max_new_tokens=2, return_logprob=True, logprob_start_len=1.0), "logprob_start_len must be an integer"),
    (dict(top_k=2.5), "top_k must be an integer"), (dict(seed=1.5), "seed must be an integer"),
    (dict(stop_token_ids=(1.5,)), "stop_token_ids must be an integer"), (dict(stop=(5,)), "stop must be strings"),
    (dict(temperature=float("inf")), "temperature must be finite"), (dict(top_p="0.5"), "top_p must be a number"),
    (dict(seed=2**64 + 1), "seed must be in"), (dict(min_new_tokens=-1), "min_new_tokens must be in"), (dict(min_new_tokens=3, max_new_tokens=2), "min_new_tokens"),
])
def test_ill_typed_params_are_refused_and_the_engine_goes_on(engine, bad, match):
    """A float max_new_tokens used to pass SamplingParams and stop the engine's worker thread for good."""
    with pytest.raises(ValueError, match=match):
        engine.generate([1, 2, 3], SamplingParams(**bad))
    assert engine.generate([1, 2, 3], SamplingParams(max_new_tokens=np.int64(2), seed=np.int64(1))).output_ids


def test_nan_logits_fail_only_that_request():
    loaded = load_model("tiny")
    with torch.no_grad():
        loaded.model.model.embed_tokens.weight[0xFF] = float("nan")  # byte 0xFF never occurs in UTF-8
    with EmbeddedEngine(loaded, EngineConfig(batch_window_ms=50)) as eng:
        good = [list(b"fine prompt"), list(b"another")]
        bad = list(b"poison") + [0xFF]
        bad_prefill = [0xFF] + list(b"poison")
        results = {}

        def run(name, ids):
            try:
                results[name] = eng.generate(ids, SamplingParams(max_new_tokens=5, seed=1, ignore_eos=True), rid=name)
            except EngineError as exc:
                results[name] = exc

        threads = [threading.Thread(target=run, args=(n, ids)) for n, ids in
                   [("g0", good[0]), ("bad", bad), ("g1", good[1]), ("badp", bad_prefill)]]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert isinstance(results["bad"], EngineError) and "bad" in str(results["bad"])
        assert "NaN" in str(results["bad"])
        assert isinstance(results["badp"], EngineError) and "badp" in str(results["badp"])
        assert len(results["g0"].output_ids) == 5 and len(results["g1"].output_ids) == 5
        assert eng.stats()["failed"] == 2


def test_abort_finishes_with_abort_reason():
    with EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=0)) as eng:
        box = {}

        def run(rid, n):
            box[rid] = eng.generate(list(b"abort me"), SamplingParams(max_new_tokens=n, ignore_eos=True, seed=1), rid=rid)

        t_long = threading.Thread(target=run, args=("long", 1900))
        t_other = threading.Thread(target=run, args=("other", 40))
        t_long.start()
        t_other.start()
        t_other.join(timeout=60)
        eng.abort("long")
        t_long.join(timeout=60)
        assert not t_long.is_alive()
        assert box["long"].meta_info["finish_reason"]["type"] == "abort"
        assert len(box["long"].output_ids) < 1900
        assert box["other"].meta_info["finish_reason"]["type"] == "length"
        eng.abort("unknown-rid")  # no-op


def test_a_request_aborted_during_its_prefill_decodes_no_token():
    """The abort arrives while the request's prompt is prefilled: it finishes before the decode step (it decoded
    one token, a step of the whole batch, before the next loop saw the abort)."""
    with EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=0)) as eng:
        real_prefill = eng._prefill

        def prefill_then_abort(r):
            out = real_prefill(r)
            eng.abort(r.rid)
            return out

        eng._prefill = prefill_then_abort
        steps = eng.stats()["decode_steps"]
        out = eng.generate(list(b"abort in prefill"), SamplingParams(max_new_tokens=8, ignore_eos=True, seed=1),
                           rid="mid-prefill")
        assert out.meta_info["finish_reason"]["type"] == "abort"
        assert list(out.output_ids) == [] and eng.stats()["decode_steps"] == steps


def test_background_priority_pauses_while_normal_requests_run():
    with EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=0)) as eng:
        done_order = []
        lock = threading.Lock()

        def run(name, prio, n):
            out = eng.generate(list(b"priority"), SamplingParams(max_new_tokens=n, ignore_eos=True, seed=3), priority=prio)
            with lock:
                done_order.append((name, len(out.output_ids)))

        bg = threading.Thread(target=run, args=("bg", -1, 300))
        bg.start()
        while eng.stats()["active_rows"] == 0:
            pass
        fg = threading.Thread(target=run, args=("fg", 0, 200))
        fg.start()
        fg.join(timeout=60)
        bg.join(timeout=60)
        # fg started after bg yet finished first: bg was paused while fg ran (200 < 300 remaining steps)
        assert [n for n, _ in done_order] == ["fg", "bg"]
        assert dict(done_order) == {"fg": 200, "bg": 300}


def test_concurrent_threads_mixed_requests_all_finish():
    with EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=1, max_batch_size=16)) as eng:
        rng = np.random.default_rng(0)
        base = list(b"shared prefix for everybody: ")

        def job(i):
            ids = base + [int(x) for x in rng.integers(32, 127, size=int(i % 7) + 1)]
            kind = i % 4
            if kind == 0:
                return eng.generate(ids, SamplingParams(max_new_tokens=int(5 + i % 11), seed=i, ignore_eos=True))
            if kind == 1:
                return eng.generate(ids, SamplingParams(max_new_tokens=0, return_logprob=True, logprob_start_len=3))
            if kind == 2:
                return eng.generate(ids, SamplingParams(max_new_tokens=8, temperature=0, stop=("a",)), priority=-1)
            return eng.next_token_logits(ids)

        with ThreadPoolExecutor(max_workers=32) as pool:
            futures = [pool.submit(job, i) for i in range(64)]
            results = [f.result(timeout=120) for f in futures]
        assert len(results) == 64
        st = eng.stats()
        assert st["active_rows"] == 0 and st["queued"] == 0 and st["radix_locked_tokens"] == 0
        assert st["max_batch_rows"] > 1  # threads shared batched forwards


def test_radix_reuse_eviction_and_pins():
    # the budget counts the running row's own KV too, but not again the pinned root it reads in place
    with EmbeddedEngine(load_model("tiny"), EngineConfig(max_total_tokens=250, batch_window_ms=0)) as eng:
        root = list(range(40, 140))  # 100 tokens
        handle = eng.pin(root)
        st = eng.stats()
        assert st["radix_total_tokens"] == 100 and st["radix_locked_tokens"] == 100
        for k in range(6):  # unrelated traffic overflows the 250-token budget
            eng.generate([200 - k] * 60, SamplingParams(max_new_tokens=10, seed=k, ignore_eos=True))
            assert eng.stats()["radix_total_tokens"] <= 250
        assert eng.stats()["radix_evicted_tokens"] > 0
        hit = eng.generate(root + [7], SamplingParams(max_new_tokens=2, seed=1, ignore_eos=True))
        assert hit.meta_info["cached_tokens"] == 100  # the pinned root survived eviction
        # the row reads the 100 pinned tokens in place and adds 99: 100 + 99 <= 250 (charging the pinned root
        # twice, 100 + 199 > 250, refused it)
        out = eng.generate(root + [7], SamplingParams(max_new_tokens=99, seed=1, ignore_eos=True))
        assert out.meta_info["cached_tokens"] == 100 and len(out.output_ids) == 99
        assert eng.stats()["radix_total_tokens"] <= 250
        other = eng.pin([150 + i for i in range(60)])  # 160 pinned now: 160 + the 99 the row adds > 250
        with pytest.raises(EngineError, match="pinned"):
            eng.generate(root + [7], SamplingParams(max_new_tokens=99, seed=2, ignore_eos=True))
        with pytest.raises(EngineError, match="can never fit"):  # 100 pinned + 151 added > 250 in any engine
            eng.generate(root + [7], SamplingParams(max_new_tokens=151, seed=1, ignore_eos=True))
        eng.unpin(other)
        eng.unpin(handle)
        with pytest.raises(EngineError, match="unknown pin handle"):
            eng.unpin(handle)
        eng.flush_cache()
        assert eng.stats()["radix_total_tokens"] == 0
        with pytest.raises(EngineError, match="pin"):
            eng.pin([i % 250 for i in range(300)])
        assert eng.stats()["peak_kv_pool_tokens"] > 0


@pytest.mark.slow
def test_default_model_batched_matches_alone_and_plain_forward():
    """SmolLM2 in float32 (native kernels): batched decode is bit-identical to alone and matches a plain
    transformers forward to float32 accuracy."""
    with EmbeddedEngine.from_spec("default") as eng:
        assert eng.batch_invariant and eng.plan.path == "native"
        prompts = [prompt(eng, t) for t in ("The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,")]
        p = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
        alone = []
        for ids in prompts:
            eng.flush_cache()
            alone.append(eng.generate(ids, p))
        eng.flush_cache()
        batched = eng.generate_batch([(ids, p) for ids in prompts])
        for a, b in zip(alone, batched):
            assert a.output_ids == b.output_ids and a.output_logp0 == b.output_logp0
            check = full_logp(eng, list(a.input_ids) + list(a.output_ids))[0]
            n = len(a.input_ids)
            np.testing.assert_allclose(a.output_logp0, [float(check[n - 1 + t, y]) for t, y in enumerate(a.output_ids)],
                                       atol=1e-4)


def test_new_arrivals_join_the_running_batch():
    with EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=0)) as eng:
        box = {}

        def run(name, n):
            box[name] = eng.generate(list(b"join"), SamplingParams(max_new_tokens=n, ignore_eos=True, seed=2))

        long = threading.Thread(target=run, args=("long", 400))
        long.start()
        while eng.stats()["decode_steps"] == 0:
            pass
        run("short", 10)  # arrives while "long" decodes; joins its batch between steps
        assert "long" not in box  # finished first although it arrived later
        long.join(timeout=60)
        assert len(box["long"].output_ids) == 400 and eng.stats()["max_batch_rows"] == 2
        alone = eng.generate(list(b"join"), SamplingParams(max_new_tokens=10, ignore_eos=True, seed=2))
        assert alone.output_ids == box["short"].output_ids == box["long"].output_ids[:10]


def test_generate_with_prompt_logprobs_and_duplicate_rid(engine):
    ids = prompt(engine, "prompt and output logprobs")
    out = engine.generate(ids, SamplingParams(max_new_tokens=4, seed=8, ignore_eos=True, return_logprob=True,
                                              logprob_start_len=3))
    logp, _ = full_logp(engine, list(ids) + list(out.output_ids))
    entries = out.meta_info["input_token_logprobs"]
    assert len(entries) == len(ids) - 3 and entries[0][0] is None
    np.testing.assert_allclose([e[0] for e in entries[1:]], [float(logp[p - 1, ids[p]]) for p in range(4, len(ids))], atol=TOL)
    check_against_oracle(engine, out)
    meta = out.meta_info
    assert meta["prompt_tokens"] == len(ids) and meta["completion_tokens"] == 4 and meta["id"]
    assert meta["e2e_latency"] >= 0 and meta["cached_tokens"] <= 3

    gate = threading.Event()
    box = {}

    def hold():
        gate.set()
        box["first"] = engine.generate(ids, SamplingParams(max_new_tokens=300, ignore_eos=True, seed=1), rid="dup")

    t = threading.Thread(target=hold)
    t.start()
    gate.wait()
    while engine.stats()["active_rows"] == 0 and "first" not in box:
        pass
    if "first" not in box:
        with pytest.raises(EngineError, match="already running"):
            engine.generate(ids, SamplingParams(max_new_tokens=1), rid="dup")
    engine.abort("dup")
    t.join(timeout=60)
    assert box["first"].meta_info["id"] == "dup"


@pytest.mark.parametrize("batch_invariant", [True, False])
def test_staggered_joins_and_finishes_match_alone(batch_invariant):
    """Rows join and leave the running batch at different steps (slot moves, in-place joins, rebuilds)."""
    with EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=0, batch_invariant=batch_invariant,
                                                         max_batch_size=6)) as eng:
        reqs = [(list(f"request {i} {'x' * (3 * i)}".encode()),
                 SamplingParams(max_new_tokens=3 + (7 * i) % 17, seed=i, ignore_eos=True)) for i in range(12)]
        alone = [eng.generate(ids, p) for ids, p in reqs]
        eng.flush_cache()
        results = [None] * len(reqs)

        def run(i):
            for _ in range(i * 50):  # stagger the arrivals a little (no timing is asserted)
                pass
            results[i] = eng.generate(*reqs[i])

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(reqs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        for a, b in zip(alone, results):
            assert b is not None and a.output_ids == b.output_ids
            if batch_invariant:
                assert a.output_logp0 == b.output_logp0 and a.output_logq == b.output_logq
            else:
                np.testing.assert_allclose(a.output_logp0, b.output_logp0, atol=1e-12)
        assert eng.stats()["active_rows"] == 0


def test_request_timeout_and_closed_engine():
    eng = EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=0, request_timeout_s=0.02))
    with pytest.raises(EngineError, match="no result within"):
        eng.generate(list(b"slow"), SamplingParams(max_new_tokens=2000, ignore_eos=True, seed=1), rid="slow")
    out = eng.generate(list(b"fast"), SamplingParams(max_new_tokens=2, seed=1))  # the engine keeps serving
    assert len(out.output_ids) >= 1
    eng.close()
    with pytest.raises(EngineError, match="closed"):
        eng.generate(list(b"late"), SamplingParams(max_new_tokens=2))


def test_logq_at_extra_temperatures_equals_direct_computation(engine):
    ids = prompt(engine, "mixture proposal")
    temps = (0.25, 0.5, 1.0)
    out = engine.generate(ids, SamplingParams(max_new_tokens=5, temperature=0.5, seed=3, ignore_eos=True,
                                              return_logprob=True, logprob_temperatures=temps))
    _, logits = full_logp(engine, list(ids) + list(out.output_ids))
    n = len(ids)
    by_temp = out.meta_info["output_token_logq_by_temperature"]
    assert out.meta_info["logprob_temperatures"] == list(temps)
    for j, temp in enumerate(temps):
        assert len(by_temp[j]) == len(out.output_ids)
        for t, tok in enumerate(out.output_ids):
            direct = torch.log_softmax(logits[n - 1 + t] / temp, -1)[tok]
            assert by_temp[j][t] == pytest.approx(float(direct), abs=1e-9)
    # the sampled temperature's entry equals the log q_τ the token was drawn with
    assert by_temp[1] == pytest.approx(list(out.output_logq), abs=1e-9)


def test_late_stop_string_found_past_the_tail_window(engine):
    """A stop string that first appears long after the start (past the decode window) still stops."""
    ids = prompt(engine, "late stop")
    for seed in range(20):
        base = engine.generate(ids, SamplingParams(max_new_tokens=80, seed=seed, ignore_eos=True))
        text = base.text
        stop = next((text[i : i + 3] for i in range(40, len(text) - 3)
                     if "\ufffd" not in text[i : i + 3] and text[i : i + 3] not in text[:i + 2]), None)
        if stop is None:
            continue
        cut = engine.generate(ids, SamplingParams(max_new_tokens=80, seed=seed, ignore_eos=True, stop=(stop,)))
        assert cut.meta_info["finish_reason"] == {"type": "stop", "matched": stop}
        assert cut.text == text[: text.find(stop)]
        return
    pytest.skip("no clean 3-character stop string found after position 40")


def test_kv_pool_use_counts_a_prefix_rows_read_in_place_once():
    """Rows that read one cached prefix in place hold one copy of it: the pool use (the tree's KV plus each row's
    KV outside it) is the pinned root + the rows' generated tokens, within the budget - not the root once per row."""
    with EmbeddedEngine(load_model("tiny"), EngineConfig(max_total_tokens=200)) as eng:
        if not eng._normal.share_prefix:
            pytest.skip("rows copy their prefix without the native forward")
        root = [(7 * i) % 250 for i in range(150)]
        handle = eng.pin(root)
        outs = eng.generate_batch([(root + [k], SamplingParams(max_new_tokens=10, seed=k, ignore_eos=True))
                                   for k in range(4)])
        assert [o.meta_info["cached_tokens"] for o in outs] == [150] * 4
        st = eng.stats()
        assert st["peak_kv_pool_tokens"] == 150 + 4 * 10 <= st["radix_max_total_tokens"]
        assert st["kv_pool_tokens"] == st["radix_total_tokens"] == 150 + 4 * 10  # the rows' KV went to the tree
        eng.unpin(handle)


def test_kv_budget_counts_running_rows_and_queues_what_does_not_fit():
    """8 threads of 50-370-token requests under a 600-token budget: the KV held (the tensors alive in the tree
    and the running rows, each storage once: `kv_memory.held_tokens`) never exceeds it, requests queue instead,
    and every request finishes."""
    budget = 600
    with EmbeddedEngine(load_model("tiny"), EngineConfig(max_total_tokens=budget, batch_window_ms=0)) as eng:
        peaks, rows_seen = [], []
        step, admit = eng._step, eng._admit

        def watched_step(batch):
            step(batch)
            peaks.append(held_tokens(eng))
            rows_seen.append(len(eng._normal) + len(eng._background))

        def watched_admit():
            admit()
            peaks.append(held_tokens(eng))

        eng._step, eng._admit = watched_step, watched_admit
        rng = np.random.default_rng(0)
        jobs = [(list(rng.integers(0, 250, int(rng.integers(20, 50)))), int(rng.integers(30, 320))) for _ in range(32)]

        def run(i):
            ids, n = jobs[i]
            return eng.generate(ids, SamplingParams(max_new_tokens=n, seed=i, ignore_eos=True), priority=-(i % 3 == 0))

        with ThreadPoolExecutor(max_workers=8) as pool:
            outs = list(pool.map(run, range(len(jobs))))
        assert [len(o.output_ids) for o in outs] == [n for _, n in jobs]
        assert max(peaks) <= budget and eng.stats()["peak_kv_pool_tokens"] <= budget
        assert max(peaks) > budget // 2 and max(rows_seen) < 8  # the budget, not the threads, limited the rows
        st = eng.stats()
        assert st["radix_reserved_tokens"] == 0 and st["active_rows"] == 0 and st["queued"] == 0
        with pytest.raises(EngineError, match="can never fit"):
            eng.generate(list(range(100)), SamplingParams(max_new_tokens=502))


P_PINNED = [(7 * i) % 250 + 1 for i in range(331)]
X_CACHED = [100 + i % 50 for i in range(22)]
Y_NEW = [60 + i % 30 for i in range(30)]


def _generate_after_pinned_and_cached(params):
    """A 400-token budget holding P pinned (331 tokens) and P + X cached but unlocked (22 more, a logits request):
    the output of P + X + Y (30 new tokens) under `params`."""
    with EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=0.0, max_total_tokens=400)) as eng:
        if not eng._normal.share_prefix:
            pytest.skip("the transformers fallback copies the prefix into the row: it is charged for all of it")
        eng.pin(P_PINNED)
        eng.next_token_logits(P_PINNED + X_CACHED)
        return eng.generate(P_PINNED + X_CACHED + Y_NEW, params)


def test_a_prompt_extending_an_unlocked_cached_prefix_is_charged_only_its_new_tokens():
    """P pinned, P + X cached but unlocked, then P + X + Y decoding: the row reads P + X in place and adds 30 + 1
    tokens, which fit the 400-token budget (331 pinned + 22 cached + 31 = 384); charging the 22 unlocked cached
    tokens again refused it ("only 47 can be freed")."""
    out = _generate_after_pinned_and_cached(SamplingParams(max_new_tokens=1, temperature=0))
    assert out.meta_info["cached_tokens"] == len(P_PINNED + X_CACHED) and len(out.output_ids) == 1


def test_cached_tokens_a_prefill_will_recompute_can_be_evicted_to_admit_it():
    """P pinned, P + X cached but unlocked, then P + X + Y returning prompt logprobs from position len(P): its
    prefill recomputes X, so X is neither charged nor protected, and evicting X makes the room the row needs (331
    pinned, 22 cached, the row adds 52 of 400). Protecting the whole cached prompt refused it ("only 47 of 400 can
    be freed")."""
    out = _generate_after_pinned_and_cached(SamplingParams(max_new_tokens=1, temperature=0, return_logprob=True,
                                                           logprob_start_len=len(P_PINNED)))
    assert out.meta_info["cached_tokens"] == len(P_PINNED) and len(out.output_ids) == 1
    assert len(out.meta_info["input_token_logprobs"]) == len(X_CACHED + Y_NEW)


def test_an_admitted_requests_cached_prefix_is_not_evicted_before_its_prefill():
    """Two requests admitted together: A extends a cached unlocked prefix (not charged to it), B needs room that
    evicting that prefix would give.  The admission holds A's prefix, so B waits instead; the KV held never
    exceeds the budget and A reads its whole prefix in place."""
    budget = 300
    with EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=0.0, max_total_tokens=budget)) as eng:
        if not eng._normal.share_prefix:
            pytest.skip("the transformers fallback copies the prefix into the row")
        prefix = [(11 * i) % 240 + 3 for i in range(150)]
        eng.next_token_logits(prefix)  # 150 cached tokens, unlocked
        peaks = []
        step, admit = eng._step, eng._admit

        def watched_step(batch):
            step(batch)
            peaks.append(held_tokens(eng))

        def watched_admit():
            admit()
            peaks.append(held_tokens(eng))

        eng._step, eng._admit = watched_step, watched_admit
        a, b = eng.generate_batch([(prefix + [5, 6], SamplingParams(max_new_tokens=40, seed=1, ignore_eos=True)),
                                   ([200 + i % 40 for i in range(60)],
                                    SamplingParams(max_new_tokens=60, seed=2, ignore_eos=True))])
        assert a.meta_info["cached_tokens"] == len(prefix) and len(a.output_ids) == 40 and len(b.output_ids) == 60
        assert max(peaks) <= budget


def test_a_temperature_below_sglangs_epsilon_is_greedy(engine):
    """SGLang runs 0 <= τ < 1e-6 as greedy (SamplingParams.__post_init__, _SAMPLING_EPS) and reports log p0 of
    each token; 1e-7 used to be sampled at τ = 1e-7 and report log q_τ = 0.0.  Oracle: the model's own forward."""
    ids = prompt(engine, "almost greedy")
    for temperature in (1e-7, 9.9e-7):
        out = engine.generate(ids, SamplingParams(max_new_tokens=5, temperature=temperature, ignore_eos=True))
        logp, logits = full_logp(engine, list(ids) + list(out.output_ids))
        assert list(out.output_ids) == [int(torch.argmax(logits[len(ids) - 1 + t])) for t in range(5)]
        expect = [float(logp[len(ids) - 1 + t][y]) for t, y in enumerate(out.output_ids)]
        assert out.output_logq == pytest.approx(expect, abs=TOL)
    assert SamplingParams(temperature=1e-6).temperature == 1e-6  # the boundary itself samples, as in SGLang
