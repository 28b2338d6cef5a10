"""Algorithm 1 / 2 over a fast deterministic fake engine, and the mutate-vs-serve stress test."""

from __future__ import annotations

import hashlib
import threading

import numpy as np
import pytest

from forerun.runtime_ext.preposition.prepositioner import PrepositionConfig, Prepositioner
from forerun.runtime_ext.protocol import GenerateOutput, SamplingParams
from forerun.runtime_ext.preposition.ready_cache import SessionState
from forerun.runtime_ext.preposition.gate import GateConfig, logit_gap

VOCAB = 24


def hash_logits(ids) -> np.ndarray:
    """Next-token logits as a deterministic function of the whole token sequence."""
    digest = hashlib.blake2b(np.asarray(ids, dtype=np.int64).tobytes(), digest_size=8).digest()
    rng = np.random.default_rng(int.from_bytes(digest, "little"))
    return rng.normal(size=VOCAB) * 2.0


class HashEngine:
    """Fake engine: greedy token = argmax(hash_logits(ids)); records priorities; fake radix cache."""

    tokenizer = None

    def __init__(self):
        self.calls: list[tuple[int, int]] = []  # (priority, len(ids))
        self._seen: set[tuple[int, ...]] = set()
        self._lock = threading.Lock()

    def next_token_logits(self, ids):
        return hash_logits(ids)

    def generate(self, input_ids, params: SamplingParams, *, rid=None, priority=0) -> GenerateOutput:
        ids = tuple(int(t) for t in input_ids)
        with self._lock:
            self.calls.append((priority, len(ids)))
            cached = max((n for n in range(len(ids), 0, -1) if ids[:n] in self._seen), default=0)
            for n in range(1, len(ids) + 1):
                self._seen.add(ids[:n])
        logits = hash_logits(ids)
        lp = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
        order = np.argsort(-lp, kind="stable")
        meta = {"cached_tokens": cached, "prompt_tokens": len(ids)}
        if params.top_logprobs_num:
            meta["output_top_logprobs"] = [[[float(lp[i]), int(i), None] for i in order[: params.top_logprobs_num]]]
        return GenerateOutput(input_ids=ids, output_ids=(int(order[0]),), text=f"<{int(order[0])}>", meta_info=meta)


def inline(gate=GateConfig(threshold=0.0), **kw):
    return Prepositioner(HashEngine(), PrepositionConfig(gate=gate, background=False, **kw))


def test_fast_path_serves_fresh_argmax_without_engine_call():
    pp = inline()
    s = SessionState([1, 2, 3])
    assert pp.preposition(s, [4, 5])
    n_calls = len(pp.engine.calls)
    assert pp.engine.calls[-1][0] == -1  # lowest priority
    r = pp.serve(s, [4, 5])
    assert r.path == "fast" and r.delta == 0
    assert r.token_id == int(np.argmax(hash_logits([1, 2, 3, 4, 5])))
    assert r.logit_gap == pytest.approx(logit_gap(hash_logits([1, 2, 3, 4, 5])))
    assert len(pp.engine.calls) == n_calls  # no scheduler, no decode
    assert pp.counters.served_fast == 1 and pp.counters.consumed == 1
    assert "gate fired" in r.reason and r.version == s.version


def test_keep_logits_scans_the_vector():
    pp = inline(keep_logits=True)
    s = SessionState([7])
    pp.preposition(s, [8])
    assert s.ready_for([8]).logits is not None
    r = pp.serve(s, [8])
    assert r.path == "fast" and r.token_id == int(np.argmax(hash_logits([7, 8])))


def test_gate_not_met_falls_through_with_zero_delta():
    pp = inline(gate=GateConfig(threshold=1e9))
    s = SessionState([1, 2])
    pp.preposition(s, [3, 4, 5])
    r = pp.serve(s, [3, 4, 5])
    assert r.path == "fall" and r.delta == 0 and r.cached_tokens == 5  # entry pre-paid
    assert "gate not met" in r.reason and r.logit_gap == pytest.approx(logit_gap(hash_logits([1, 2, 3, 4, 5])))
    assert r.token_id == int(np.argmax(hash_logits([1, 2, 3, 4, 5])))
    assert pp.engine.calls[-1][0] == 0


def test_fast_answer_set_excludes_top_token():
    top = int(np.argmax(hash_logits([1, 2])))
    pp = inline(gate=GateConfig(threshold=0.0, fast_answer_set=frozenset({(top + 1) % VOCAB})))
    s = SessionState([1])
    pp.preposition(s, [2])
    assert pp.serve(s, [2]).path == "fall"


def test_eligibility_prefix_and_mismatch():
    pp = inline()
    s = SessionState([1, 2])
    pp.preposition(s, [3, 4])
    r = pp.serve(s, [3, 4, 9, 9])  # entry extended: pre-paid, Δ = 2
    assert r.path == "fall" and r.delta == 2 and r.cached_tokens == 4
    assert r.token_id == int(np.argmax(hash_logits([1, 2, 3, 4, 9, 9])))
    assert r.logit_gap is None  # γ of the pre-positioned entry says nothing about this request
    r = pp.serve(s, [3, 7])  # differs: not eligible; token 3 is the pinned entry's, so only 7 is prefilled
    assert r.path == "fall" and r.delta == 1 and r.logit_gap is None  # was 2: the whole entry
    assert r.cached_tokens == 3 and "held 1 of its tokens" in r.reason
    c = pp.counters
    assert c.fell_through == 2 and c.consumed == 1


def test_relaxed_serves_the_header_token_never_the_standing_querys():
    """§3.4: an ad-hoc query is served the question-independent header token; the standing query its own."""
    pp = inline()
    s = SessionState([1, 2])
    header = [50 % VOCAB, 3]
    standing = [11, 13] + header
    assert pp.preposition(s, standing, header=header)
    r = pp.serve(s, [11, 12] + header, allow_relaxed=True)
    assert r.path == "fast_relaxed" and tuple(r.entry) == tuple(header) and r.match == "relaxed"
    assert r.token_id == int(np.argmax(hash_logits([1, 2] + header)))  # question-independent token
    assert r.token_id != int(np.argmax(hash_logits([1, 2] + standing)))  # (this hash seed tells them apart)
    r = pp.serve(s, standing, allow_relaxed=True)
    assert r.path == "fast" and r.token_id == int(np.argmax(hash_logits([1, 2] + standing)))
    assert pp.serve(s, [11, 12] + header, allow_relaxed=False).path == "fall"
    c = pp.counters
    assert c.served_fast_relaxed == 1 and c.served_fast == 1 and c.consumed == 2 and c.installed == 2


def test_a_relaxed_match_counts_as_a_hit_only_when_served():
    pp = inline(gate=GateConfig(threshold=1e9))
    s = SessionState([1, 2])
    pp.preposition(s, header=[7, 3])
    r = pp.serve(s, [11, 12, 7, 3], allow_relaxed=True)
    assert r.path == "fall" and r.match == "relaxed" and r.delta == 4 and "relaxed" in r.reason
    assert pp.counters.consumed == 0
    s.append([5])
    assert pp.counters.invalidated == 1 and pp.counters.hit_rate == 0.0


def test_cold_when_nothing_prepositioned_and_after_mutation():
    pp = inline()
    s = SessionState([1, 2])
    assert pp.serve(s, [3]).path == "cold"
    pp.preposition(s, [3])
    s.append([4])
    r = pp.serve(s, [3])
    assert r.path == "cold" and r.token_id == int(np.argmax(hash_logits([1, 2, 4, 3])))
    c = pp.counters
    assert c.cold == 2 and c.invalidated == 1 and c.wasted_fraction == 1.0


def test_budget_skip_does_not_touch_the_engine():
    pp = inline(budget_headroom=2)
    s = SessionState([1])
    assert not pp.preposition(s, [2, 3, 4])
    assert pp.engine.calls == [] and pp.counters.skipped == 1 and s.held() == []
    assert pp.preposition(s, [2, 3])
    pp2 = Prepositioner(HashEngine(), PrepositionConfig(background=False), headroom_fn=lambda: 0)
    assert not pp2.preposition(SessionState([1]), [2])
    with pytest.raises(ValueError, match="budget_headroom"):
        PrepositionConfig(budget_headroom=-1)
    with pytest.raises(ValueError, match="background_priority"):
        PrepositionConfig(background_priority=0)


def test_budget_is_checked_when_the_job_runs_not_when_queued():
    """A job queued while B was 0 runs once B has grown (and B is read on the worker thread)."""
    release = threading.Event()

    class Blocking(HashEngine):
        def generate(self, input_ids, params, **kw):
            if 99 in input_ids:
                release.wait(10)
            return super().generate(input_ids, params, **kw)

    budget = {"B": 100}
    readers = []

    def headroom():
        readers.append(threading.current_thread().name)
        return budget["B"]

    pp = Prepositioner(Blocking(), PrepositionConfig(gate=GateConfig(threshold=0.0)), headroom_fn=headroom)
    a, b = SessionState([99]), SessionState([1])
    pp.preposition(a, [2])  # the worker blocks in a's forward pass
    budget["B"] = 0
    pp.preposition(b, [2, 3])  # queued while B = 0
    budget["B"] = 100
    release.set()
    assert pp.wait_idle(30)
    assert b.ready_for([2, 3]) is not None and pp.counters.skipped == 0
    assert set(readers) == {"forerun-preposition"}
    pp.close()


def test_background_errors_surface_only_in_their_own_session():
    class Broken(HashEngine):
        failures = 1

        def generate(self, input_ids, params, **kw):
            if 66 in input_ids and self.failures:
                self.failures -= 1
                raise RuntimeError("boom")
            return super().generate(input_ids, params, **kw)

    pp = Prepositioner(Broken(), PrepositionConfig(gate=GateConfig(threshold=0.0)))
    bad, good = SessionState([66]), SessionState([1])
    pp.preposition(bad, [2])
    pp.preposition(good, [2])
    assert pp.wait_idle(10)  # no session named: nobody else's error is raised here
    assert pp.serve(good, [2]).path == "fast"
    pp.preposition(good, [3])
    assert pp.wait_idle(10, session=good)
    # a user request never fails because pre-positioning ran: the serve falls back to the engine
    assert pp.serve(bad, [2, 3]).path == "cold"
    with pytest.raises(RuntimeError, match="background pre-position failed"):
        pp.wait_idle(10, session=bad)
    pp.preposition(bad, [2])  # raised once: the session stays usable
    assert pp.wait_idle(10, session=bad) and pp.serve(bad, [2]).path == "fast"
    bad.check_counters()
    assert bad.counters.discarded == 1
    pp.close()


def test_an_engine_error_in_the_background_is_a_skip_not_an_error():
    """Best-effort (§3.2): an EngineError (no room, engine busy) discards that pre-position and nothing else;
    the session's next calls neither raise it nor see it."""
    from forerun.runtime_ext.protocol import EngineError

    class Full(HashEngine):
        def generate(self, input_ids, params, **kw):
            if kw.get("priority", 0) < 0:
                raise EngineError("pin: could not keep 9 tokens resident")
            return super().generate(input_ids, params, **kw)

    pp = Prepositioner(Full(), PrepositionConfig(gate=GateConfig(threshold=0.0)))
    s = SessionState([1, 2])
    assert pp.preposition(s, [3], header=[4])
    assert pp.wait_idle(10, session=s)  # nothing kept: no error to raise
    assert pp.serve(s, [3]).path == "cold"
    pp.preposition(s, [3])  # nor here
    assert pp.wait_idle(10, session=s)
    assert s.counters.discarded == 3 and s.counters.installed == 0
    s.check_counters()
    pp.close()


def test_default_budget_is_the_engines_kv_headroom():
    class StatsEngine(HashEngine):
        def stats(self):
            return {"radix_max_total_tokens": 100, "radix_locked_tokens": 85, "active_kv_tokens": 10}

    pp = Prepositioner(StatsEngine(), PrepositionConfig(background=False))
    s = SessionState([1])
    assert pp.preposition(s, [2] * 5) and not pp.preposition(s, [2] * 6)
    off = Prepositioner(StatsEngine(), PrepositionConfig(background=False, engine_headroom=False))
    assert off.preposition(SessionState([1]), [2] * 6)


def test_bad_inputs_are_rejected_before_any_work():
    pp = inline()
    s = SessionState([1])
    for bad in (["2"], "23", [2.0]):
        with pytest.raises(ValueError, match="integer token ids"):
            pp.preposition(s, bad)
        with pytest.raises(ValueError, match="integer token ids"):
            pp.serve(s, bad)
    with pytest.raises(ValueError, match="at least one token"):
        pp.preposition(s, [])
    with pytest.raises(ValueError, match="at least one token"):
        pp.preposition(s)

    class Vocab(HashEngine):
        vocab_size = VOCAB

    with pytest.raises(ValueError, match="outside the vocabulary"):
        Prepositioner(Vocab(), PrepositionConfig(gate=GateConfig(fast_answer_set={VOCAB}), background=False))
    known = Prepositioner(Vocab(), PrepositionConfig(background=False))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        known.preposition(s, [VOCAB])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        known.serve(s, [1, VOCAB + 3])
    assert pp.engine.calls == [] and known.engine.calls == []


def test_kv_headroom_reads_engine_stats():
    from forerun.runtime_ext.preposition.engines import kv_headroom

    class StatsEngine(HashEngine):
        def __init__(self, locked):
            super().__init__()
            self.locked = locked

        def stats(self):
            return {"radix_max_total_tokens": 100, "radix_locked_tokens": self.locked, "active_kv_tokens": 10}

    eng = StatsEngine(locked=85)
    pp = Prepositioner(eng, PrepositionConfig(background=False), headroom_fn=kv_headroom(eng))
    s = SessionState([1])
    assert pp.preposition(s, [2] * 5) and not pp.preposition(s, [2] * 6)  # B = 100 - 85 - 10 = 5
    assert pp.counters.skipped == 1
    with pytest.raises(ValueError, match="stats"):
        kv_headroom(object())


def test_embedded_engine_tiny_model_matches_fresh_logits():
    """On the real engine (tiny float64 model): γ from top-2 logprobs = logit gap, served token = argmax."""
    from forerun.runtime_ext.engine import EmbeddedEngine, EngineConfig
    from forerun.runtime_ext.engine.models import load_model

    with EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=0.0)) as eng:
        pp = Prepositioner(eng, PrepositionConfig(gate=GateConfig.forced_open()))
        s = SessionState([5, 6, 7, 8, 9, 10])
        for step in range(3):
            pp.preposition(s, [40, 41, 42])
            pp.wait_idle(60)
            r = pp.serve(s, [40, 41, 42])
            fresh = eng.next_token_logits(list(s.tokens) + [40, 41, 42])
            assert r.path == "fast" and r.token_id == int(np.argmax(fresh))
            assert r.logit_gap == pytest.approx(logit_gap(fresh), abs=1e-9)
            s.append([11 + step])
        pp2 = Prepositioner(eng, PrepositionConfig(gate=GateConfig(threshold=float("inf")), background=False))
        pp2.preposition(s, [40, 41, 42])
        r = pp2.serve(s, [40, 41, 42, 43])
        assert r.path == "fall" and r.delta == 1 and r.cached_tokens >= len(s.tokens) + 2
        assert r.token_id == int(np.argmax(eng.next_token_logits(list(s.tokens) + [40, 41, 42, 43])))
        pp.close()


def test_a_serve_that_fails_counts_nothing_and_a_deferred_serve_counts_once():
    """Algorithm 2 records its hits and path counter only once the request succeeded (all-or-nothing)."""
    class Flaky(HashEngine):
        fail = True

        def generate(self, input_ids, params, **kw):
            if kw.get("priority", 0) >= 0 and self.fail:
                raise RuntimeError("engine down")
            return super().generate(input_ids, params, **kw)

    pp = Prepositioner(Flaky(), PrepositionConfig(gate=GateConfig(threshold=1e9), background=False))
    s = SessionState([1, 2])
    pp.preposition(s, [3, 4])
    before = repr(s.counters)
    with pytest.raises(RuntimeError, match="engine down"):
        pp.serve(s, [3, 4, 5])  # a prefix match that would consume the pre-paid entry
    assert repr(s.counters) == before
    pp.engine.fail = False
    r = pp.serve(s, [3, 4], record=False)
    assert r.path == "fall" and repr(s.counters) == before  # not yet recorded
    pp.record(s, r)
    assert s.counters.fell_through == 1 and s.counters.consumed == 1
    s.check_counters()


@pytest.fixture(scope="module")
def tiny_engines():
    """Two embedded engines on the tiny float64 model: one pre-positions, the other answers fresh requests."""
    from forerun.runtime_ext.engine import EmbeddedEngine, EngineConfig
    from forerun.runtime_ext.engine.models import load_model

    loaded = load_model("tiny")
    with EmbeddedEngine(loaded, EngineConfig(batch_window_ms=0.0)) as eng, \
            EmbeddedEngine(loaded, EngineConfig(batch_window_ms=0.0)) as fresh:
        yield eng, fresh


def test_a_multi_token_request_gets_the_fresh_answer_not_one_cached_token(tiny_engines):
    """The fast path serves one cached token (Algorithm 2): a request for more (max_new_tokens > 1) must still get
    exactly what a fresh request would, all its tokens and their text, whichever gate fires."""
    eng, fresh = tiny_engines
    rng = np.random.default_rng(3)
    for gate in (GateConfig.forced_open(), GateConfig(threshold=0.0), GateConfig(threshold=float("inf"))):
        pp = Prepositioner(eng, PrepositionConfig(gate=gate, background=False))
        for _ in range(4):
            s = SessionState([int(t) for t in rng.integers(0, 256, 6)])
            entry = [int(t) for t in rng.integers(0, 256, 3)]
            assert pp.preposition(s, entry)
            for m in (1, 2, 4):
                r = pp.serve(s, entry, max_new_tokens=m)
                want = fresh.generate(list(s.tokens) + entry,
                                      SamplingParams(max_new_tokens=m, temperature=0.0, ignore_eos=m == 1))
                got = list(r.output.output_ids) if r.output is not None else [r.token_id]
                assert (got, r.text) == (list(want.output_ids), want.text), (gate, m, r.path)
                assert r.token_id == want.output_ids[0]
            s.close()
            pp.release_pins(s)
        with pytest.raises(ValueError, match="max_new_tokens"):
            pp.serve(SessionState([1]), [2], max_new_tokens=0)
        pp.close()


def test_a_served_special_token_has_the_engines_text(tiny_engines):
    """A cached token that is a special token (EOS, <|im_start|>) is served with the text a fresh request returns
    for it (the engine, like SGLang, skips special tokens in the text), not the token's own spelling."""
    eng, fresh = tiny_engines
    pp = Prepositioner(eng, PrepositionConfig(gate=GateConfig(threshold=0.0), background=False))
    s = SessionState([77])  # argmax after [77, 113] is <|im_start|> (257) on the tiny model, γ ≈ 0.59
    assert pp.preposition(s, [113])
    r = pp.serve(s, [113])
    want = fresh.generate([77, 113], SamplingParams(max_new_tokens=1, temperature=0.0, ignore_eos=True))
    assert r.path == "fast" and want.output_ids == (257,)
    assert (r.token_id, r.text) == (257, want.text)
    assert "<|im_start|>" in r.reason  # the explanation still names the token
    s.close()
    pp.close()


def test_a_certain_distribution_from_top_logprobs_is_served_not_a_background_error():
    """An SGLang-shaped engine may report the runner-up at log-probability -inf (the model is certain): the gap
    γ = +inf (which gap_from_top_logprobs accepts) must install and fire the gate, not fail the pre-position as a
    bug that the session's next `preposition` raises."""
    class CertainEngine:
        """Top-2 log-probs [[0, 7], [-inf, 3]]: p(7) = 1; greedy answers 7."""

        def generate(self, input_ids, params, *, priority=0):
            meta = {"output_top_logprobs": [[[0.0, 7, None], [float("-inf"), 3, None]]]}
            return GenerateOutput(input_ids=tuple(input_ids), output_ids=(7,), text="", meta_info=meta)

    for tau, path in ((2.0, "fast"), (float("inf"), "fall")):
        pp = Prepositioner(CertainEngine(), PrepositionConfig(gate=GateConfig(threshold=tau), background=False))
        s = SessionState([1, 2])
        assert pp.preposition(s, [4])
        assert s.ready_for([4]).logit_gap == float("inf")
        r = pp.serve(s, [4])
        assert (r.path, r.token_id) == (path, 7)
        assert pp.preposition(s, [4]) is False  # held already: nothing to compute, and no kept error raised
        assert s.counters.discarded == 0
        pp.close()


def test_a_preposition_racing_close_is_refused_not_left_pending_for_ever():
    """close() lands between preposition's closed-check and its queue.put (forced here from inside snapshot): the
    job used to be queued behind the worker's stop sentinel, never ran, and wait_idle() blocked for ever."""
    pp = Prepositioner(HashEngine(), PrepositionConfig())

    class ClosedMidway(SessionState):
        def snapshot(self):
            closer = threading.Thread(target=pp.close)
            closer.start()
            closer.join()
            return super().snapshot()

    with pytest.raises(RuntimeError, match="closed"):
        pp.preposition(ClosedMidway([1, 2, 3]), [4, 5])
    assert pp.wait_idle(2)
