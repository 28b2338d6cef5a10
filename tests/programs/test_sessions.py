"""Streaming and agentic sessions over a deterministic fake engine and through the SGLang server backend."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from forerun.programs.sessions import AgenticSession, ProgramEngine, SessionFormat, StreamingSession, ToolCallPending
from forerun.runtime_ext.standin.server import byte_tokenizer, StandInServer
from forerun.runtime_ext.preposition.prepositioner import PrepositionConfig, Prepositioner
from forerun.runtime_ext.protocol import GenerateOutput, SamplingParams
from forerun.runtime_ext.preposition.ready_cache import SessionClosed
from forerun.runtime_ext.preposition.gate import GateConfig

VOCAB = 258


def hash_logits(ids) -> np.ndarray:
    digest = hashlib.blake2b(np.asarray(ids, dtype=np.int64).tobytes(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(digest, "little")).normal(size=VOCAB) * 3.0


class PinningHashEngine:
    """Greedy argmax of hash_logits; top-2 log-probs; pin/unpin bookkeeping."""

    def __init__(self):
        self.tokenizer = byte_tokenizer()
        self.pins: dict[int, tuple[int, ...]] = {}
        self._next = 0
        self.calls = []

    def pin(self, ids):
        self._next += 1
        self.pins[self._next] = tuple(ids)
        return self._next

    def unpin(self, handle):
        del self.pins[handle]

    def generate(self, input_ids, params: SamplingParams, *, rid=None, priority=0):
        self.calls.append((priority, params.max_new_tokens))
        seq = list(input_ids)
        out = []
        meta = {"cached_tokens": 0}
        for _ in range(params.max_new_tokens):
            z = hash_logits(seq)
            if params.top_logprobs_num and not out:
                lp = z - np.logaddexp.reduce(z)
                top = np.argsort(-lp)[: params.top_logprobs_num]
                meta["output_top_logprobs"] = [[[float(lp[i]), int(i), None] for i in top]]
            out.append(int(np.argmax(z)))
            seq.append(out[-1])
        return GenerateOutput(tuple(input_ids), tuple(out), self.tokenizer.decode(out), meta)


def _pp(engine, threshold=0.0, **kw):
    return Prepositioner(engine, PrepositionConfig(gate=GateConfig(threshold=threshold), background=False, **kw))


def test_streaming_standing_query_reads_its_own_and_adhoc_the_header_distribution():
    eng = PinningHashEngine()
    s = StreamingSession(_pp(eng), system="sys")
    s.register_query("trend", "Is the trend up or down?")
    s.append_data("1 2 3 4")
    r = s.ask_standing("trend")
    assert r.path == "fast"
    expect = int(np.argmax(hash_logits(list(s.state.tokens) + s.query_entry("Is the trend up or down?"))))
    assert r.token_id == expect
    r2 = s.ask("Up or down?")  # ad-hoc: the generic header's question-independent token (§3.4)
    header_token = int(np.argmax(hash_logits(list(s.state.tokens) + s.header_ids())))
    assert r2.path == "fast_relaxed" and r2.token_id == header_token and r2.token_id != expect
    c = s.pp.counters
    # register_query pre-positioned both entries on the bare state; the update invalidated them (wasted)
    assert c.served_fast == 1 and c.served_fast_relaxed == 1 and c.consumed == 2
    assert c.installed == 4 and c.invalidated == 2


def test_streaming_update_invalidates_and_repositions():
    eng = PinningHashEngine()
    s = StreamingSession(_pp(eng), system="sys", allow_relaxed=False)
    s.append_data("a")
    assert s.ask("q?").path == "fall"  # generic header pre-positioned, ad-hoc not allowed to relax
    v = s.append_data("b")
    assert s.state.version == v and s.pp.counters.installed == 2
    s.shift_window(2)
    s.rollback(1)
    assert s.pp.counters.invalidated == 3 and s.pp.counters.consumed == 0  # a mismatched entry is no hit
    generic = s.header_ids()
    assert [r.entry_ids for r in s.state.held()] == [tuple(generic)]
    s.state.check_counters()


def test_session_pins_state_and_releases_on_close():
    eng = PinningHashEngine()
    s = StreamingSession(_pp(eng), system="sys")
    s.append_data("x")
    state = s.state.tokens
    assert sorted(eng.pins.values()) == sorted([state, state + tuple(s.header_ids())])  # state + pre-paid entry
    s.append_data("y")
    state = s.state.tokens
    assert sorted(eng.pins.values()) == sorted([state, state + tuple(s.header_ids())])  # old entry released
    s.close()
    assert eng.pins == {}
    with pytest.raises(SessionClosed):
        s.append_data("z")
    with pytest.raises(SessionClosed):
        s.register_query("late", "up?")


def test_agentic_delta_only_resume_and_commit():
    eng = PinningHashEngine()
    a = AgenticSession(_pp(eng, threshold=1e9), system="sys")
    a.user("find the weather")
    assert a.emit_tool_call('{"name": "weather"}')
    assert eng.calls[-1] == (-1, 1)  # envelope pre-positioned at the lowest priority
    before = a.state.tokens
    turn = a.tool_result("sunny", max_new_tokens=3)
    framing = len(a.encode(a.fmt.tool_result_open))
    assert turn.first.path == "fall" and turn.first.delta == len(a.result_entry("sunny")) - framing
    expect = []
    seq = list(before) + a.result_entry("sunny")
    for _ in range(3):
        expect.append(int(np.argmax(hash_logits(seq))))
        seq.append(expect[-1])
    assert turn.output_ids == expect
    assert a.state.tokens[: len(before)] == before and len(a.state.tokens) > len(seq)
    with pytest.raises(RuntimeError, match="emit_tool_call"):
        a.tool_result("again")


def test_agentic_expected_result_takes_the_fast_path():
    eng = PinningHashEngine()
    a = AgenticSession(_pp(eng, threshold=0.0), system="sys")
    a.emit_tool_call("save()", expected_result="ok")
    turn = a.tool_result("ok", max_new_tokens=1)
    assert turn.first.path == "fast"
    a.emit_tool_call("save()", expected_result="ok")
    assert a.tool_result("error", max_new_tokens=1).first.path == "fall"


def test_each_standing_query_gets_its_own_answer_and_adhoc_the_headers_or_its_own():
    """§3.4: every registered standing query reads its own pre-positioned distribution (exact match); an
    ad-hoc query the header's question-independent token (relaxed) or, without the relaxation, its own full
    path; never another query's."""
    eng = PinningHashEngine()
    queries = {"trend": "Is the trend up or down?", "price": "What is the last price?", "n": "How many?"}
    s = StreamingSession(_pp(eng), system="sys")
    for name, q in queries.items():
        s.register_query(name, q)
    s.append_data("1 2 3 4")
    state = list(s.state.tokens)
    own = {n: int(np.argmax(hash_logits(state + s.query_entry(q)))) for n, q in queries.items()}
    header = int(np.argmax(hash_logits(state + s.header_ids())))
    assert len(set(own.values()) | {header}) == 4  # this hash seed tells every answer apart
    for name, q in queries.items():
        r = s.ask_standing(name)
        assert r.path == "fast" and r.token_id == own[name] and list(r.entry) == s.query_entry(q)
    r = s.ask("Up or down?")
    assert r.path == "fast_relaxed" and r.token_id == header and list(r.entry) == s.header_ids()
    strict = StreamingSession(_pp(eng), system="sys", allow_relaxed=False)
    for name, q in queries.items():
        strict.register_query(name, q)
    strict.append_data("1 2 3 4")
    assert {r.entry_ids for r in strict.state.held()} == {tuple(strict.query_entry(q)) for q in queries.values()}
    assert strict.ask_standing("price").token_id == own["price"]
    r = strict.ask("Up or down?")  # its own full path
    assert r.path == "fall" and r.token_id == int(np.argmax(hash_logits(state + s.query_entry("Up or down?"))))
    assert strict.ask("How many?").token_id == own["n"]  # the same text is the same entry: its own


def test_standing_queries_are_prepositioned_most_recently_used_first_within_the_budget():
    eng = PinningHashEngine()
    s = StreamingSession(_pp(eng), system="sys", max_prepositioned_queries=2)
    for name in ("a", "b", "c"):
        s.register_query(name, f"query {name}?")
    s.ask_standing("a")  # a is now the most recently used: a, c, b
    assert s.standing_order() == ["a", "c", "b"]
    s.append_data("5")
    held = {r.entry_ids for r in s.state.held()}
    assert held == {tuple(s.query_entry("query a?")), tuple(s.query_entry("query c?")), tuple(s.header_ids())}
    state = list(s.state.tokens)
    r = s.ask_standing("b")  # not pre-positioned: the header's token, never a's or c's
    assert r.path == "fast_relaxed" and list(r.entry) == s.header_ids()
    assert r.token_id == int(np.argmax(hash_logits(state + s.header_ids())))
    # the engine's budget B: room for one query entry only -> the most recently used one (b, just asked)
    eng2 = PinningHashEngine()
    entry_len = len(s.query_entry("query a?"))

    def headroom():  # B shrinks with every entry pinned on the current state
        cur = tight.state.tokens
        used = sum(len(p) - len(cur) for p in eng2.pins.values() if len(p) > len(cur) and p[: len(cur)] == cur)
        return entry_len + 1 - used

    tight = StreamingSession(Prepositioner(eng2, PrepositionConfig(gate=GateConfig(threshold=0.0), background=False),
                                           headroom_fn=headroom), system="sys", allow_relaxed=False)
    for name in ("a", "b", "c"):
        tight.register_query(name, f"query {name}?")
    tight.ask_standing("b")
    tight.append_data("6")
    assert [r.entry_ids for r in tight.state.held()] == [tuple(tight.query_entry("query b?"))]
    assert tight.state.counters.skipped >= 2


def test_agentic_predicts_results_from_history():
    """§3.5 without a caller-supplied result: the results a call returned before are pre-positioned whole."""
    eng = PinningHashEngine()
    a = AgenticSession(_pp(eng, threshold=0.0), system="sys", predict_results=2)
    a.emit_tool_call('{"name": "status", "arguments": {}}')
    first = a.tool_result("ok", max_new_tokens=1)
    assert first.first.path == "fall" and not first.predicted  # nothing known yet: envelope pre-paid only
    assert a.predicted_results('{"name": "status", "arguments": {}}') == ["ok"]
    assert a.predicted_results('{"name": "status", "arguments": {"x": 1}}') == ["ok"]  # same tool
    a.emit_tool_call('{"name": "status", "arguments": {}}')
    held = {r.entry_ids for r in a.state.held()}
    assert held == {tuple(a.envelope_ids()), tuple(a.result_entry("ok"))}
    turn = a.tool_result("ok", max_new_tokens=1)
    assert turn.first.path == "fast" and turn.predicted
    assert turn.first.token_id == int(np.argmax(hash_logits(list(turn.first.state) + a.result_entry("ok"))))
    a.emit_tool_call('{"name": "status", "arguments": {}}')
    turn = a.tool_result("degraded", max_new_tokens=1)
    assert turn.first.path == "fall" and not turn.predicted and turn.first.match == "prefix"


class ScriptedEngine(PinningHashEngine):
    """PinningHashEngine whose greedy token after `t` is script[t] where given; a generation ends at EOS (kept in
    the ids, as every engine does), so an answer can end exactly where a test wants."""

    def __init__(self, script):
        super().__init__()
        self.script = script

    def generate(self, input_ids, params: SamplingParams, *, rid=None, priority=0):
        self.calls.append((priority, params.max_new_tokens))
        seq, out, meta = list(input_ids), [], {"cached_tokens": 0}
        eos = self.tokenizer.eos_token_id
        for _ in range(params.max_new_tokens):
            z = hash_logits(seq)
            if seq[-1] in self.script:
                z[self.script[seq[-1]]] = 50.0
            if params.top_logprobs_num and not out:
                lp = z - np.logaddexp.reduce(z)
                meta["output_top_logprobs"] = [[[float(lp[i]), int(i), None] for i in np.argsort(-lp)[:2]]]
            out.append(int(np.argmax(z)))
            seq.append(out[-1])
            if out[-1] == eos:
                break
        return GenerateOutput(tuple(input_ids), tuple(out), self.tokenizer.decode(out, skip_special_tokens=True), meta)


@pytest.mark.parametrize("script, ids, text", [({10: ord("4"), ord("4"): 257}, [ord("4"), 257], "4"),
                                                ({10: 257}, [257], "")])
def test_an_answer_that_ends_on_eos_is_committed_once_and_returned_as_a_fresh_request_returns_it(script, ids, text):
    """The answer's EOS is the turn's end: the conversation gets entry + answer + the template's turn end (one
    `<|im_end|>`, not two), the caller the ids and text a fresh greedy request gives; after a first EOS nothing
    more is generated."""
    eng = ScriptedEngine(script)  # the entry ends with the assistant header's "\n" (byte 10)
    a = AgenticSession(_pp(eng, threshold=1e9), system="sys")
    a.emit_tool_call("f()")
    before, entry = list(a.state.tokens), a.result_entry("7")
    assert entry[-1] == 10
    fresh = eng.generate(before + entry, SamplingParams(max_new_tokens=16, temperature=0.0))
    calls = len(eng.calls)
    turn = a.tool_result("7", max_new_tokens=16)
    assert turn.output_ids == list(fresh.output_ids) == ids and turn.text == fresh.text == text
    end = list(byte_tokenizer().encode(a.fmt.turn_end, add_special_tokens=False))
    assert list(a.state.tokens) == before + entry + [t for t in ids if t != 257] + end
    assert len(eng.calls) - calls == (1 if ids == [257] else 2)  # the serve (fall path), then the tail if any


def test_agentic_protocol_errors_are_clear():
    eng = PinningHashEngine()
    a = AgenticSession(_pp(eng), system="sys")
    a.emit_tool_call("f()")
    with pytest.raises(ToolCallPending, match="f\\(\\)' is pending"):
        a.emit_tool_call("g()")
    with pytest.raises(ToolCallPending):
        a.user("hello")
    a.tool_result("1")
    a.user("hello")


@pytest.mark.parametrize("bad", [0, -3, 1.0, True])
def test_tool_result_with_no_room_for_an_answer_is_rejected_before_anything_runs(bad):
    """max_new_tokens < 1 used to serve and commit one token anyway; now nothing is served or committed."""
    eng = PinningHashEngine()
    a = AgenticSession(_pp(eng), system="sys")
    a.emit_tool_call("f()")
    version, tokens, calls = a.state.version, a.state.tokens, list(eng.calls)
    with pytest.raises(ValueError, match="max_new_tokens"):
        a.tool_result("1", max_new_tokens=bad)
    assert (a.state.version, a.state.tokens, eng.calls) == (version, tokens, calls)
    turn = a.tool_result("1", max_new_tokens=1)  # the call is still pending: the retry applies it once
    assert len(turn.output_ids) == 1


def test_bad_format_rejected():
    with pytest.raises(ValueError, match="query template"):
        SessionFormat(query="no placeholder")
    with pytest.raises(ValueError, match="exactly once"):
        SessionFormat(data="{data} and {data}")


def test_through_the_sglang_server_backend_and_programs():
    """Stock server APIs (top_logprobs_num=2, priority) and the @sgl.function programs on the stand-in server."""
    from forerun.runtime_ext.backends.server import SGLangServerBackend

    with StandInServer() as srv:
        info = srv.server_info  # a server that schedules by priority: the client then sends them
        srv.server_info = lambda: dict(info(), enable_priority_scheduling=True)
        backend = SGLangServerBackend(srv.url, tokenizer=byte_tokenizer())
        model = srv.model
        for engine in (backend.engine, ProgramEngine(backend)):
            s = StreamingSession(_pp(engine, threshold=0.0), tokenizer=byte_tokenizer(), system="s")
            s.register_query("t", "up?")
            s.append_data("1 2 3")
            r = s.ask_standing("t")
            full = list(s.state.tokens) + s.query_entry("up?")
            assert r.path == "fast" and r.token_id == int(np.argmax(model.logits(full)))
            gap = np.sort(model.logits(full))[-2:]
            assert r.logit_gap == pytest.approx(gap[1] - gap[0], abs=1e-9)
            r = s.ask("down?")
            assert r.path == "fast_relaxed"
            assert r.token_id == int(np.argmax(model.logits(list(s.state.tokens) + s.header_ids())))
            s.pp = _pp(engine, threshold=1e9)
            s.append_data("4")
            r = s.ask_standing("t")
            # entry pre-paid: all of it cached but the last token, which SGLang recomputes for its logits
            # (schedule_batch.Req._compute_max_prefix_len)
            assert r.path == "fall" and r.cached_tokens == len(r.state) + len(r.entry) - 1
        sent = [b for b in srv.generate_bodies() if b.get("top_logprobs_num") == 2]
        assert sent and any(b.get("priority") == -1 for b in sent)
