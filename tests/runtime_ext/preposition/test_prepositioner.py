"""Algorithm 1 / 2 over a fast deterministic fake engine, and the mutate-vs-serve stress test."""

from __future__ import annotations

import hashlib
import random
import threading
import time

import numpy as np
import pytest

from forerun.runtime_ext.preposition.prepositioner import PrepositionConfig, Prepositioner
from forerun.runtime_ext.protocol import GenerateOutput, SamplingParams
from forerun.runtime_ext.preposition.ready_cache import GateConfig, SessionState, logit_gap

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


def test_keep_logits_scans_the_vector():
    pp = inline(keep_logits=True)
    s = SessionState([7])
    pp.preposition(s, [8])
    assert s.slot.ready.logits is not None
    r = pp.serve(s, [8])
    assert r.path == "fast" and r.token_id == int(np.argmax(hash_logits([7, 8])))


def test_gate_not_met_falls_through_with_zero_delta():
    pp = inline(gate=GateConfig(threshold=1e9))
    s = SessionState([1, 2])
    pp.preposition(s, [3, 4, 5])
    r = pp.serve(s, [3, 4, 5])
    assert r.path == "fall" and r.delta == 0 and r.cached_tokens == 5  # entry pre-paid
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
    r = pp.serve(s, [3, 7])  # differs: not eligible
    assert r.path == "fall" and r.delta == 2
    c = pp.counters
    assert c.fell_through == 2 and c.consumed == 1


def test_relaxed_streaming_fast_path_is_separate():
    pp = inline()
    s = SessionState([1, 2])
    header = [50 % VOCAB, 3]
    pp.preposition(s, header, header_len=len(header))
    r = pp.serve(s, [11, 12] + header, allow_relaxed=True)
    assert r.path == "fast_relaxed" and tuple(r.entry) == tuple(header)
    assert r.token_id == int(np.argmax(hash_logits([1, 2] + header)))  # question-independent token
    assert pp.serve(s, [11, 12] + header, allow_relaxed=False).path == "fall"
    c = pp.counters
    assert c.served_fast_relaxed == 1 and c.served_fast == 0


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
    assert pp.engine.calls == [] and pp.counters.skipped == 1 and not s.slot.valid
    assert pp.preposition(s, [2, 3])
    pp2 = Prepositioner(HashEngine(), PrepositionConfig(background=False), headroom_fn=lambda: 0)
    assert not pp2.preposition(SessionState([1]), [2])
    with pytest.raises(ValueError, match="budget_headroom"):
        PrepositionConfig(budget_headroom=-1)
    with pytest.raises(ValueError, match="background_priority"):
        PrepositionConfig(background_priority=0)


def test_background_errors_surface():
    class Broken(HashEngine):
        def generate(self, *a, **k):
            raise RuntimeError("boom")

    pp = Prepositioner(Broken(), PrepositionConfig())
    s = SessionState([1])
    pp.preposition(s, [2])
    with pytest.raises(RuntimeError, match="background pre-position failed"):
        pp.wait_idle(10)
    s.check_counters()
    pp.close()


def _stress(session_cls=SessionState, iterations=10_000, seed=0):
    """Two mutators and two servers race for `iterations` operations in all.

    Mutators append / shift / roll back and re-queue the pre-position; half of the time they wait for it
    to land so that serves see valid distributions that the next mutation then invalidates.  Every
    fast-path token is checked against a fresh forward pass over the tokens the session held when the
    request was checked.  Returns (stale serves, fast serves, prepositioner, session, serves).
    """
    engine = HashEngine()
    pp = Prepositioner(engine, PrepositionConfig(gate=GateConfig(threshold=0.5)))
    s = session_cls(list(range(1, 9)), frozen_len=4)
    entry = (20, 21, 22)
    stale, fast, served = [], [], []
    mutations = iterations // 4
    done = threading.Event()
    served_since = threading.Event()

    def mutator(k):
        rnd = random.Random(seed * 100 + k)
        for _ in range(mutations // 2):
            op = rnd.random()
            with s.lock:  # keep the length bounded; the mutation itself invalidates
                n = s.live_end - s.frozen_len
                if op < 0.5 or n < 3:
                    s.append([rnd.randrange(VOCAB) for _ in range(rnd.randint(1, 3))])
                elif op < 0.75:
                    s.shift_window(rnd.randint(1, min(3, n)))
                else:
                    s.rollback(rnd.randint(1, min(2, n)))
            pp.preposition(s, entry)
            pace = rnd.random()
            if pace < 0.6:  # let the pre-position land (and mostly a serve see it) before the next mutation
                pp.wait_idle(10)
                if pace < 0.3:
                    served_since.clear()
                    served_since.wait(0.05)

    def server(k):
        rnd = random.Random(seed * 100 + 50 + k)
        n = 0
        while n < (iterations - mutations) // 2 or not done.is_set():
            r = pp.serve(s, entry if rnd.random() < 0.9 else entry + (1,))
            served.append(r.path)
            served_since.set()
            n += 1
            # yield the GIL: spinning servers would starve the mutators and the background pre-positions
            # they wait for (the race still interleaves at every serve); past its quota a server idles
            time.sleep(0 if n < (iterations - mutations) // 2 else 0.001)
            if r.path.startswith("fast"):
                fast.append(r)
                fresh = int(np.argmax(hash_logits(list(r.state) + list(r.entry))))
                if fresh != r.token_id:
                    stale.append(r)

    mutators = [threading.Thread(target=mutator, args=(k,)) for k in range(2)]
    servers = [threading.Thread(target=server, args=(k,)) for k in range(2)]
    for t in mutators + servers:
        t.start()
    for t in mutators:
        t.join()
    done.set()
    for t in servers:
        t.join()
    assert pp.wait_idle(60)
    pp.close()
    return stale, fast, pp, s, served


def test_stress_no_stale_serve_and_counters_add_up():
    stale, fast, pp, s, served = _stress()
    c = pp.counters
    assert stale == []
    assert len(served) + 2 * (10_000 // 4 // 2) >= 10_000
    # the race exercised every path and both fates of a pre-position
    assert len(fast) > 500 and c.cold > 50 and c.fell_through > 50 and c.installed > 300, c
    assert c.consumed > 50 and c.invalidated + c.discarded > 10, c
    s.check_counters()
    assert c.served_fast + c.served_fast_relaxed + c.fell_through + c.cold == len(served)
    assert sum(s.invalidation_log.values()) >= c.invalidated


def test_stress_oracle_catches_a_lazy_cache():
    """The same checker flags stale serves when a mutation does not invalidate (oracle has power)."""

    class LazySession(SessionState):
        def _mutated(self, reason):  # bump nothing, clear nothing: the bug §3.6 forbids
            return self.version

        def install(self, ready):
            with self.lock:
                self.in_flight -= 1
                from forerun.runtime_ext.preposition.ready_cache import ReadySlot

                self.slot = ReadySlot(ready=ready, decoded=True, valid=True)
                self.counters.installed += 1
                return True

    stale, fast, _, _, _ = _stress(LazySession, iterations=4000, seed=1)
    assert stale, "a cache that is not invalidated must be caught serving stale tokens"


def test_kv_headroom_reads_engine_stats():
    from forerun.runtime_ext.preposition.prepositioner import kv_headroom

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
        pp = Prepositioner(eng, PrepositionConfig(gate=GateConfig(threshold=-1.0)))
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
