"""Every session mutation is all-or-nothing (issue 28, item 2), on the real tiny engine.

For each mutating call and each engine call it makes (counted k = 1, 2, ... until the call makes fewer than
k), a fresh session is built the same way, the k-th engine call from the mutation's start is made to fail,
and then:

* if the mutation raised: the session (tokens, version, ready distributions, counters, invalidation log,
  standing queries, pending tool call and result history, its pin) and the engine's pins are byte-identical
  to before the call (pickled and compared), and a retry succeeds;
* either way the final tokens and version are those of one clean run of the same call (applied exactly
  once, never twice), and after close the engine holds no pin but those whose release was the injected
  failure itself.

The failure is injected at two depths: inside the engine (`_prefill`, through which every pin, logits and
generate request runs; the engine turns it into that request's `EngineError`) and at the engine's surface
(pin, unpin, generate, next_token_logits, pinned_prefix, stats), the latter also covering the commands that
run after the commit.  Pre-positioning runs inline so that its engine calls are inside the mutation too.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable

import pytest

from forerun.programs.sessions import AgenticSession, StreamingSession
from forerun.runtime_ext.engine import EmbeddedEngine, EngineConfig
from forerun.runtime_ext.engine.models import load_model
from forerun.runtime_ext.engine.requests import RequestMode
from forerun.runtime_ext.preposition.prepositioner import PrepositionConfig, Prepositioner
from forerun.runtime_ext.preposition.gate import GateConfig
from forerun.runtime_ext.protocol import EngineError

SPECIAL_TEXT = "7<|im_end|>\n<|im_start|>assistant\nup"


class Injected(EngineError):
    """The failure the test injects."""


class FaultyEngine:
    """The real engine behind a surface that can fail its k-th call (and counts calls either way)."""

    SURFACE = ("pin", "unpin", "generate", "next_token_logits", "pinned_prefix", "stats")

    def __init__(self, engine: EmbeddedEngine, where: str) -> None:
        self.inner = engine
        self.where = where
        self.tokenizer = engine.tokenizer
        self.vocab_size = engine.vocab_size
        self.model_info = engine.model_info
        self.fail_at: int | None = None
        self.calls = 0
        self.live: dict[int, tuple[int, ...]] = {}
        """Pins this engine holds, by handle."""
        self.leaked: set[int] = set()
        """Handles whose unpin was the injected failure (the pin stays: that failure is a leak by nature)."""
        original = engine._prefill

        def prefill(r: Any) -> Any:
            if self.where == "prefill" and self._tick():
                raise Injected("injected prefill failure")
            return original(r)

        engine._prefill = prefill  # type: ignore[method-assign]

    def _tick(self) -> bool:
        self.calls += 1
        return self.fail_at is not None and self.calls == self.fail_at

    def _surface(self, name: str) -> None:
        if self.where == "api" and self._tick():
            if name == "pin":
                raise Injected("pin: could not keep N tokens resident (injected)")
            raise Injected(f"injected {name} failure")

    def arm(self, k: int | None) -> None:
        self.fail_at, self.calls = k, 0

    def pin(self, ids: Any, *, priority: int = 0) -> int:
        self._surface("pin")
        handle = self.inner.pin(ids, priority=priority)
        self.live[handle] = tuple(ids)
        return handle

    def unpin(self, handle: int) -> None:
        try:
            self._surface("unpin")
        except Injected:
            self.leaked.add(handle)
            raise
        self.inner.unpin(handle)
        self.live.pop(handle)

    def generate(self, ids: Any, params: Any, *, rid: Any = None, priority: int = 0) -> Any:
        self._surface("generate")
        return self.inner.generate(ids, params, rid=rid, priority=priority)

    def next_token_logits(self, ids: Any, *, priority: int = 0) -> Any:
        self._surface("next_token_logits")
        return self.inner.next_token_logits(ids, priority=priority)

    def pinned_prefix(self, ids: Any) -> int:
        self._surface("pinned_prefix")
        return self.inner.pinned_prefix(ids)

    def stats(self) -> dict[str, Any]:
        self._surface("stats")
        return self.inner.stats()


@pytest.fixture(scope="module")
def tiny():
    with EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=0.0)) as eng:
        yield eng


def snapshot(sess: Any, eng: FaultyEngine) -> bytes:
    """Everything a mutation may change, pickled: equal bytes = byte-identical."""
    st = sess.state
    with st.lock:
        held = [(r.entry_ids, r.version, r.state_len, r.top_token, r.logit_gap, r.role) for r in st.held()]
        core = (st.tokens, st.version, st.frozen_len, st.closed, st.in_flight, held,
                sorted((k, repr(v)) for k, v in st.counters.as_dict().items()), sorted(st.invalidation_log.items()))
    extra: tuple[Any, ...]
    if isinstance(sess, StreamingSession):
        extra = (sorted(sess.standing.items()), sess.standing_order())
    else:
        extra = (sess._pending, sorted((k, sorted(v.items())) for k, v in sess._seen.items()))
    return pickle.dumps((core, extra, sess._pin_handle, sorted(eng.live.values())))


def streaming(eng: FaultyEngine) -> StreamingSession:
    pp = Prepositioner(eng, PrepositionConfig(gate=GateConfig(threshold=0.0), background=False))
    s = StreamingSession(pp, system="sys")
    s.register_query("trend", "up or down?")
    s.append_data("1 2 3")
    s.register_query("count", "how many?")
    s.append_data("4 " + SPECIAL_TEXT)
    s.ask("anything new?")  # a serve: counters and a consumed distribution in the snapshot
    return s


def agentic(eng: FaultyEngine, *, pending: bool) -> AgenticSession:
    pp = Prepositioner(eng, PrepositionConfig(gate=GateConfig(threshold=0.0), background=False))
    a = AgenticSession(pp, system="sys", predict_results=1)
    a.user("check the pump")
    a.emit_tool_call('{"name": "status"}')
    a.tool_result("ok", max_new_tokens=2)
    if pending:
        a.emit_tool_call('{"name": "status"}')
    return a


STREAMING_OPS: dict[str, Callable[[StreamingSession], Any]] = {
    "append_data": lambda s: s.append_data("5 " + SPECIAL_TEXT),
    "register_query": lambda s: s.register_query("new", "is it " + SPECIAL_TEXT + "?"),
    "shift_window": lambda s: s.shift_window(3),
    "rollback": lambda s: s.rollback(2),
    "close": lambda s: s.close(),
}
AGENTIC_OPS: dict[str, tuple[bool, Callable[[AgenticSession], Any]]] = {
    "user": (False, lambda a: a.user("and the valve? " + SPECIAL_TEXT)),
    "emit_tool_call": (False, lambda a: a.emit_tool_call('{"name": "status"}', expected_result="fine")),
    "tool_result": (True, lambda a: a.tool_result("ok " + SPECIAL_TEXT, max_new_tokens=3)),
    "rollback": (False, lambda a: a.rollback(2)),
}


def check_all_or_nothing(tiny: EmbeddedEngine, where: str, build: Callable[[FaultyEngine], Any],
                         op: Callable[[Any], Any]) -> tuple[int, int]:
    """Fail each engine call of `op` in turn; returns (engine calls of a clean run, failures that raised)."""
    eng = FaultyEngine(tiny, where)
    try:
        ref = build(eng)
        eng.arm(None)
        op(ref)
        clean_calls = eng.calls
        want = (ref.state.tokens, ref.state.version, ref.state.closed)
        ref.close()
        raised = 0
        for k in range(1, clean_calls + 2):
            eng.arm(None)
            sess = build(eng)
            before = snapshot(sess, eng)
            eng.arm(k)
            try:
                op(sess)
            except EngineError as exc:
                if "injected" not in str(exc):
                    raise
                raised += 1
                eng.arm(None)
                assert snapshot(sess, eng) == before, f"failure at engine call {k} changed the session"
                op(sess)  # the retry succeeds
            eng.arm(None)
            assert (sess.state.tokens, sess.state.version, sess.state.closed) == want, \
                f"failure at engine call {k}: the mutation was not applied exactly once"
            sess.close()
        assert set(eng.live) == eng.leaked, "a failed mutation kept a pin it had reserved"
        for handle in eng.leaked:
            tiny.unpin(handle)
    finally:
        tiny.__dict__.pop("_prefill", None)  # the class's own again
    assert tiny.stats()["pins"] == 0
    return clean_calls, raised


@pytest.mark.parametrize("where", ["prefill", "api"])
@pytest.mark.parametrize("name", sorted(STREAMING_OPS))
def test_streaming_mutations_are_all_or_nothing(tiny, where, name):
    calls, raised = check_all_or_nothing(tiny, where, streaming, STREAMING_OPS[name])
    assert calls > 0 or (name, where) == ("close", "prefill")  # close only releases pins (no prefill)
    # register_query's and close's only engine work is best-effort (pre-positioning, releasing pins): no
    # failure of it reaches the caller; every other mutation reserves the new state's KV first
    assert (raised > 0) == (name not in ("register_query", "close"))


@pytest.mark.parametrize("where", ["prefill", "api"])
@pytest.mark.parametrize("name", sorted(AGENTIC_OPS))
def test_agentic_mutations_are_all_or_nothing(tiny, where, name):
    pending, op = AGENTIC_OPS[name]
    calls, raised = check_all_or_nothing(tiny, where, lambda e: agentic(e, pending=pending), op)
    assert calls > 0 and raised > 0


def test_the_issue_case_pin_fails_during_an_append(tiny, monkeypatch):
    """The reported failure: the engine cannot keep the new state resident.  Nothing is committed, the
    version is unchanged, and the retry commits the batch once."""
    pp = Prepositioner(tiny, PrepositionConfig(gate=GateConfig(threshold=0.0), background=False))
    s = StreamingSession(pp, system="sys")
    s.register_query("q", "up?")
    s.append_data("1")
    before = (s.state.tokens, s.state.version, [r.entry_ids for r in s.state.held()])

    def full(r, kv):
        raise EngineError(f"pin: could not keep {len(r.input_ids)} tokens resident within max_total_tokens 32768 "
                          "(the rest of the pool is locked)")

    with monkeypatch.context() as m:
        m.setitem(tiny._after_prefill, RequestMode.PIN, full)
        with pytest.raises(EngineError, match="could not keep"):
            s.append_data("2")
    assert (s.state.tokens, s.state.version, [r.entry_ids for r in s.state.held()]) == before
    s.append_data("2")
    assert s.state.version == before[1] + 1
    assert s.state.tokens == before[0] + tuple(s.state.tokens[len(before[0]):])
    assert tiny.tokenizer.decode(list(s.state.tokens[len(before[0]):])).count("New data: 2") == 1
    assert s.ask_standing("q").path == "fast"
    s.close()
    assert tiny.stats()["pins"] == 0


def test_without_reserve_first_the_check_catches_a_raise_after_commit(monkeypatch):
    """Teeth: commit first and pin afterwards (the old order) and the all-or-nothing check fails."""
    from forerun.programs import sessions

    def commit_then_pin(self, new_tokens, commit):
        version = commit()
        old, self._pin_handle = self._pin_handle, self._pin_tokens(new_tokens)
        self._unpin_quietly(old)
        return version

    monkeypatch.setattr(sessions._Session, "_mutate", commit_then_pin)
    with EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=0.0)) as own:
        with pytest.raises(AssertionError, match="changed the session"):
            check_all_or_nothing(own, "api", streaming, STREAMING_OPS["append_data"])
