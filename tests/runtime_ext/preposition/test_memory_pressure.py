"""Pre-positioning is best-effort under memory pressure (issue 28, item 4), on the real tiny engine.

* A user request never fails because pre-positioning ran: pre-positions pin their entries at the background
  priority, and the engine drops such pins when a user request needs the room (the same request fails when
  pre-positions pin at normal priority: the test's teeth).
* The cost check counts what a pre-position will hold (state ‖ E minus what pins already hold), so a
  session's pinned state is charged once and an unpinned state in full.
* The engine's headroom counts each KV token once: a pinned prefix that a running row reads in place is
  not charged again.
* A standing query whose pre-position's pin the engine dropped (and whose KV it evicted) still gets the fresh
  answer: oracle, greedy decoding by plain transformers forwards.
"""

from __future__ import annotations

import gc
import logging
import threading
import time

import pytest
import torch

from forerun.programs.session_text import render
from forerun.programs.sessions import SessionFormat, StreamingSession
from forerun.runtime_ext.engine import EmbeddedEngine, EngineConfig
from forerun.runtime_ext.engine.models import build_byte_tokenizer, load_model
from forerun.runtime_ext.preposition.prepositioner import PrepositionConfig, Prepositioner
from forerun.runtime_ext.preposition.engines import kv_headroom
from forerun.runtime_ext.preposition.ready_cache import SessionState
from forerun.runtime_ext.preposition.gate import GateConfig
from forerun.runtime_ext.protocol import EngineError, SamplingParams
from forerun.testing.transformers_oracle import norms_in_model_dtype

SYSTEM = "You watch a pump."
DATA = "p=1.25 t=40 flow=ok"
QUERIES = {f"q{i}": f"Standing question number {i}: is the pump fine?" for i in range(3)}
ADHOC = "An ad-hoc question that is rather long, about the valves and the pipes?"


def lengths():
    tok, fmt = build_byte_tokenizer(), SessionFormat()
    state = len(render(tok, fmt.system, "system", SYSTEM)) + len(render(tok, fmt.data, "data", DATA))
    header = len(tok.encode(fmt.header, add_special_tokens=False))
    entries = [len(render(tok, fmt.query, "query", q)) + header for q in QUERIES.values()]
    adhoc = len(render(tok, fmt.query, "query", ADHOC)) + header
    return state, entries, header, adhoc


def pressured_session(budget, *, background_pins=True):
    eng = EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=0.0, max_total_tokens=budget))
    # τ = inf: every request reaches the engine (the gate never serves from the cache)
    pp = Prepositioner(eng, PrepositionConfig(gate=GateConfig(threshold=float("inf")), background=False))
    if not background_pins:
        pp._pin_priority = False  # pre-position pins at normal priority: they never yield
    s = StreamingSession(pp, system=SYSTEM)
    for name, q in QUERIES.items():
        s.register_query(name, q)
    s.append_data(DATA)
    return eng, pp, s


def test_a_user_request_never_fails_because_prepositioning_ran():
    state, entries, header, adhoc = lengths()
    # room for the pinned state, every pre-position and the ad-hoc row's charge only if the pre-positions
    # yield: the row is charged its whole prompt (state + entry), the pinned state stays locked
    budget = 2 * state + adhoc + 20
    assert state + sum(entries) + header + (state + adhoc) > budget  # pre-positions at full would block it
    eng, pp, s = pressured_session(budget)
    try:
        assert len(s.state.held()) == len(QUERIES) + 1  # the pool was free: every entry was pre-positioned
        assert eng.stats()["yielding_pins"] == len(QUERIES) + 1
        held = s.state.held()
        r = s.ask(ADHOC)  # needs the room the pre-positions hold
        assert r.path == "fall"
        r = s.ask(ADHOC.replace("valves", "motors"), max_new_tokens=2)  # the first one's KV is evictable
        assert r.path == "fall" and len(r.output.output_ids) == 2
        st = eng.stats()
        assert st["pins_yielded"] >= 1 and st["pins"] == 1 + st["yielding_pins"]
        # the ready distributions stay valid (only their KV was cached): still held, still matched exactly
        assert s.state.held() == held
        r = s.ask_standing("q0")
        assert r.match == "exact" and r.delta == 0
        s.append_data("p=1.30")  # the session's own pin (normal priority) gets its room too
        s.close()
        assert eng.stats()["pins"] == 0  # unpin of a dropped pin is a no-op, the others are released
    finally:
        pp.close()
        eng.close()


def test_the_same_request_fails_when_prepositions_do_not_yield():
    """Teeth for the test above: with pre-position pins at normal priority the user request fails."""
    state, entries, header, adhoc = lengths()
    eng, pp, s = pressured_session(2 * state + adhoc + 20, background_pins=False)
    try:
        with pytest.raises(EngineError, match="pinned"):
            s.ask(ADHOC)
    finally:
        s.close()
        pp.close()
        eng.close()


def test_the_cost_check_counts_what_the_preposition_will_hold():
    with EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=0.0, max_total_tokens=300)) as eng:
        pp = Prepositioner(eng, PrepositionConfig(gate=GateConfig(threshold=0.0), background=False))
        state, entry = list(range(20, 120)), [7, 8, 9, 10, 11]
        assert pp.hold_cost(state, entry) == 105  # nothing pinned: state and entry
        handle = eng.pin(state)
        assert pp.hold_cost(state, entry) == 5  # the pinned state is charged once
        assert pp.hold_cost(state[:50] + [3] * 10, entry) == 15  # only the pinned part of a prefix counts
        eng.unpin(handle)
        # an unpinned 100-token state with 250 tokens pinned elsewhere: the pass would hold 105 > 50 free -> skip
        other = eng.pin([(130 + i) % 256 for i in range(250)])
        bare = SessionState(state)
        assert not pp.preposition(bare, entry)
        assert bare.counters.skipped == 1 and bare.counters.started == 0 and bare.held() == []
        # counting L_entry alone (the old check) starts a pass the engine cannot hold
        real = pp.hold_cost
        pp.hold_cost = lambda st, e: len(e)
        assert not pp.preposition(bare, entry)
        assert bare.counters.started == 1 and bare.counters.discarded == 1
        pp.hold_cost = real
        eng.unpin(other)
        mine = eng.pin(state)  # the state pinned by its session: the pass holds L_entry = 5 more
        assert pp.preposition(bare, entry) and bare.counters.installed == 1
        assert pp.serve(bare, entry).path == "fast"
        bare.close()
        pp.release_pins(bare)
        eng.unpin(mine)
        assert eng.stats()["pins"] == 0
        pp.close()


def test_the_engine_headroom_charges_a_pinned_prefix_once():
    budget = 600
    with EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=0.0, max_total_tokens=budget)) as eng:
        root = list(range(40, 140))
        handle = eng.pin(root)
        done = threading.Event()

        def run():
            eng.generate(root + [7], SamplingParams(max_new_tokens=150, ignore_eos=True, seed=1))
            done.set()

        t = threading.Thread(target=run)
        t.start()
        seen = None
        deadline = time.monotonic() + 60
        while not done.is_set() and time.monotonic() < deadline:
            st = eng.stats()
            if st["active_rows"] == 1:
                seen = st
                break
        t.join(60)
        assert seen is not None, "the row finished before it was observed"
        # the row reads the pinned root in place: the engine's headroom charges it once (as locked) ...
        assert seen["kv_headroom_tokens"] == budget - seen["radix_locked_tokens"] - seen["radix_reserved_tokens"]
        assert kv_headroom(eng)() <= budget - 100
        # ... where locked + the row's whole KV would charge the root twice
        twice = budget - seen["radix_locked_tokens"] - seen["active_kv_tokens"]
        assert seen["active_kv_tokens"] >= 100 and twice < seen["kv_headroom_tokens"] - 90 + seen["radix_reserved_tokens"]
        eng.unpin(handle)


def greedy_oracle(eng, ids, n):
    """Oracle: n greedy tokens after `ids` from plain transformers forwards of the whole sequence (no cache)."""
    seq = list(ids)
    with torch.inference_mode(), norms_in_model_dtype():
        for _ in range(n):
            seq.append(int(torch.argmax(eng.model(input_ids=torch.tensor([seq])).logits[0, -1])))
    return seq[len(ids):]


@pytest.mark.parametrize("threshold, path", [(float("inf"), "fall"), (0.0, "fast")])
def test_serving_a_standing_query_whose_pin_the_engine_dropped_gives_the_fresh_answer(threshold, path):
    """Every pre-position's pin dropped and its KV evicted by a user request that needs the whole pool: serving the
    standing query still answers as a fresh greedy decode of state ‖ entry (oracle: a plain transformers forward),
    through the engine when the gate does not fire (nothing of the entry resident any more), from the ready
    distribution when it does."""
    state, entries, header, adhoc = lengths()
    budget = state + sum(entries) + header + 40
    with EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=0.0, max_total_tokens=budget)) as eng:
        pp = Prepositioner(eng, PrepositionConfig(gate=GateConfig(threshold=threshold), background=False))
        s = StreamingSession(pp, system=SYSTEM)
        try:
            for name, q in QUERIES.items():
                s.register_query(name, q)
            s.append_data(DATA)
            pins = {slot.pin for slot in s.state._slots.values()}
            assert len(pins) == len(QUERIES) + 1 and None not in pins
            # a user request whose row needs all but the session's pinned state: every background pin yields
            filler = [(13 * i) % 200 + 30 for i in range(budget - state - 9)]  # 1 fed by decode + 10 new
            eng.generate(filler, SamplingParams(max_new_tokens=10, temperature=0.0, ignore_eos=True))
            st = eng.stats()
            assert st["pins_yielded"] == len(pins) and st["yielding_pins"] == 0 and pins <= eng._yielded
            for n in (1, 3) if path == "fall" else (1,):
                r = s.ask_standing("q0", max_new_tokens=n)
                assert r.match == "exact" and r.path == (path if n == 1 else "fall")
                assert eng.pinned_prefix(r.state + r.entry) == len(r.state)  # only the state is still pinned
                got = [r.token_id] if r.output is None else list(r.output.output_ids)
                assert got == greedy_oracle(eng, r.state + r.entry, n)
                if r.output is not None and n == 1:
                    assert r.cached_tokens == len(r.state)  # nothing of the entry was resident: prefilled again
                    # ... and the result says so: the whole entry is Δ, not the planned 0
                    assert r.delta == len(r.entry) and "dropped the pre-paid KV" in r.reason, (r.delta, r.reason)
        finally:
            s.close()
            pp.close()
        assert eng.stats()["pins"] == 0  # the session's pin released; unpin of a dropped pin is a no-op


def _another_session_fits(eng, pp, entry):
    """Another session's 33-token pre-position fits (nothing else pinned is left), is the only pin, and is released
    with it; then the prepositioner closes."""
    other = SessionState(list(range(100, 129)))
    assert pp.preposition(other, entry) and other.counters.skipped == 0
    assert eng.stats()["pins"] == 1  # other's pre-position only
    other.close()
    pp.release_pins(other)
    assert eng.stats()["pins"] == 0
    pp.close()


def test_an_invalidated_pre_position_gives_its_room_back_to_the_next_one():
    """A bare `SessionState`'s mutation or close cannot unpin its pre-positions (the session does not know the
    engine).  Their pins stayed held until a later install or fall-through serve of that session, so B (the engine's
    free pool, read when a job runs) still counted them: the next decision point of the same session, or of another
    one, was skipped for the room a stale pre-position took.  Oracle: the pool arithmetic below and a plain
    transformers forward for the served token."""
    with EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=0.0, max_total_tokens=60)) as eng:
        pp = Prepositioner(eng, PrepositionConfig(gate=GateConfig(threshold=0.0), background=False))
        entry = [200, 201, 202, 203]
        s = SessionState(list(range(1, 31)), frozen_len=4)
        assert pp.preposition(s, entry)  # pins state ‖ E: 34 of the 60 tokens
        s.shift_window(1)  # invalidates it; the new pass holds 29 + 4 = 33 > the 26 the stale pin leaves free
        assert pp.preposition(s, entry) and s.counters.skipped == 0
        r = pp.serve(s, entry)
        assert r.path == "fast" and [r.token_id] == greedy_oracle(eng, list(s.tokens) + entry, 1)
        s.close()  # its 33-token pre-position is no live state any more: another session's 33 tokens fit
        _another_session_fits(eng, pp, entry)


@pytest.mark.parametrize("invalidated", [False, True])
def test_a_session_dropped_without_close_gives_its_pins_back_to_the_next_pre_position(invalidated):
    """A bare `SessionState` that is garbage-collected while it holds a pinned pre-position (valid, or invalidated
    and not yet unpinned) left that pin in the engine for good: B counted it, and every later decision point that
    needed the room was skipped.  The prepositioner that tracked the session now unpins what it held when the next
    job reads B.  Oracle: the pool arithmetic (34 of 60 tokens pinned leave 26; the next pre-position holds 33)."""
    with EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=0.0, max_total_tokens=60)) as eng:
        pp = Prepositioner(eng, PrepositionConfig(gate=GateConfig(threshold=0.0), background=False))
        entry = [200, 201, 202, 203]
        s = SessionState(list(range(1, 31)), frozen_len=4)
        assert pp.preposition(s, entry) and eng.stats()["pins"] == 1  # state ‖ E: 34 of the 60 tokens
        if invalidated:
            s.shift_window(1)  # the pin waits in the session for a release
        del s
        gc.collect()
        _another_session_fits(eng, pp, entry)


def test_a_dropped_session_never_gives_back_a_pin_twice(caplog):
    """What a dropped session left behind is what it still held: a pin already released (its pre-position invalidated,
    then unpinned) is not unpinned again when the session is collected (the engine would refuse the unknown handle,
    logged as "unpin failed")."""
    caplog.set_level(logging.DEBUG, logger="forerun.runtime_ext.preposition.prepositioner")
    with EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=0.0, max_total_tokens=60)) as eng:
        pp = Prepositioner(eng, PrepositionConfig(gate=GateConfig(threshold=0.0), background=False))
        s = SessionState(list(range(1, 31)), frozen_len=4)
        assert pp.preposition(s, [200, 201, 202, 203])
        s.shift_window(1)
        pp.release_pins(s)
        assert eng.stats()["pins"] == 0
        del s
        gc.collect()
        other = SessionState(list(range(100, 129)))
        assert pp.preposition(other, [200, 201, 202, 203])
        other.close()
        pp.release_pins(other)
        pp.close()
    assert not [r for r in caplog.records if "unpin failed" in r.getMessage()]
