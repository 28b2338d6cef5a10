"""Constrained gens, streaming and token usage of `@sgl.function` programs on the embedded backend (issue 32).

    guarantee                                                        test
    a dtype gen is sent as SGLang's stock backend sends it           test_dtype_gens_are_sglangs_own_mapping
    constrained gens reach the engine in SGLang's fields and hold    test_constrained_gens_reach_the_engine_and_hold
    gen(stop_regex=...) ends at the shortest matching prefix         test_stop_regex_ends_at_the_first_match
    SGLang's limits on stop strings and patterns are refused alike     test_stop_limits_are_sglangs
    stream chunks: non-empty, incremental logprobs, token counts,    test_stream_chunks_follow_sglangs_contract
      the same tokens as the non-streamed gen
    text that may still become a stop string is held back            test_stream_holds_back_a_stop_string_prefix
    chunks reach SGLang's reader one at a time                        test_sglangs_stream_reader_sees_every_chunk
    a stream nobody reads costs no wait, and none of its text is      test_unread_streams_cost_no_wait
      lost
    SGLang's whole-text reader gets every gen in pieces                test_a_text_reader_gets_each_gen_streamed
      - through the events' public methods only                       test_the_text_reader_is_paced_through_the_
                                                                      events_public_methods
    token_usage counts every request                                  test_token_usage_counts_prompt_and_completion
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
import re
import threading
import time
from types import SimpleNamespace

import pytest

from forerun.runtime_ext.backends.embedded import EmbeddedBackend
from forerun.runtime_ext.backends.sglang_frontend import SglSamplingParams, function, gen, sgl
from forerun.runtime_ext.backends.token_exact import StreamChunks, dtype_to_regex
from forerun.runtime_ext.backends.token_markers import sampling_seed
from forerun.runtime_ext.engine import EmbeddedEngine, EngineConfig
from forerun.runtime_ext.engine.models import load_model
from forerun.runtime_ext.engine.output import output_text, stop_reason
from forerun.runtime_ext.protocol import GenerateOutput, RowEvent, SamplingParams

IR = sgl.lang.ir


class RecordingEngine(EmbeddedEngine):
    """Records the parameters every request reaches the engine with."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.params: list[SamplingParams] = []
        self.input_lengths: list[int] = []
        self._lock = threading.Lock()

    def _make_request(self, input_ids, params, **kw):
        with self._lock:
            self.params.append(params)
            self.input_lengths.append(len(input_ids))
        return super()._make_request(input_ids, params, **kw)


@pytest.fixture(scope="module")
def backend():
    eng = RecordingEngine(load_model("tiny"), EngineConfig(batch_window_ms=5))
    yield EmbeddedBackend(eng)
    eng.close()


# -- constraints --------------------------------------------------------------------------------------
def test_dtype_gens_are_sglangs_own_mapping():
    for dtype, regex, stops in [(int, IR.REGEX_INT, [" ", "\n"]), ("int", IR.REGEX_INT, [" ", "\n"]),
                                (float, IR.REGEX_FLOAT, [" ", "\n"]), (str, IR.REGEX_STR, []),
                                (bool, IR.REGEX_BOOL, []), ("bool", IR.REGEX_BOOL, [])]:
        p = SglSamplingParams(dtype=dtype, stop=["\n\n"])
        before = copy.deepcopy(p)
        q = dtype_to_regex(p)
        assert (q.regex, q.stop) == (regex, ["\n\n"] + stops)
        assert p == before  # the caller's params are not mutated
    with pytest.warns(UserWarning, match="Only dtype will be used"):
        assert dtype_to_regex(SglSamplingParams(dtype=int, regex="x+")).regex == IR.REGEX_INT
    assert dtype_to_regex(SglSamplingParams(dtype=int, stop="!")).stop == ["!", " ", "\n"]
    plain = SglSamplingParams(regex="x+")
    assert dtype_to_regex(plain) is plain
    with pytest.raises(RuntimeError, match="Invalid dtype"):
        dtype_to_regex(SglSamplingParams(dtype=list))


SCHEMA = json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                     "additionalProperties": False})


@function
def constrained(s):
    s += sampling_seed(11) + "int: " + sgl.gen_int("i", max_tokens=40) + "\n"
    s += sampling_seed(12) + "float: " + gen("f", dtype=float, max_tokens=40) + "\n"
    s += sampling_seed(13) + "bool: " + gen("b", dtype=bool, max_tokens=8) + "\n"
    s += sampling_seed(14) + "word: " + gen("w", regex="(alpha|beta|gamma)", max_tokens=8) + "\n"
    s += sampling_seed(15) + "json: " + gen("j", json_schema=SCHEMA, max_tokens=200) + "\n"


def test_constrained_gens_reach_the_engine_and_hold(backend):
    backend.engine.params.clear()
    st = constrained.run(backend=backend)
    st.sync()
    assert st.error() is None
    sent = [(p.regex, p.json_schema) for p in backend.engine.params]
    assert sent == [(IR.REGEX_INT, None), (IR.REGEX_FLOAT, None), (IR.REGEX_BOOL, None),
                    ("(alpha|beta|gamma)", None), (None, SCHEMA)]
    assert [p.seed for p in backend.engine.params] == [11, 12, 13, 14, 15]
    assert re.fullmatch(r"[-+]?[0-9]+", st["i"]) and int(st["i"]) == int(st["i"])  # stop " "/"\n" cut the tail
    assert re.fullmatch(r"[-+]?[0-9]*\.?[0-9]+", st["f"])
    assert st["b"] in ("True", "False") and st["w"] in ("alpha", "beta", "gamma")
    assert isinstance(json.loads(st["j"])["ok"], bool)
    assert st.get_meta_info("w")["output_token_logprobs_masked"] is True


@function
def count_to_a_match(s, pattern):
    s += sampling_seed(3) + "Count: " + gen("o", max_tokens=40, temperature=1.0, stop_regex=pattern,
                                            return_logprob=True)


def test_stop_regex_ends_at_the_first_match(backend):
    """SGLang's `stop_regex`: the same seeded tokens as without it, up to the first token after which the output
    holds a match (the oracle: re.search over the prefixes of the unstopped output decoded as SGLang's
    Req.tail_str decodes them, special tokens spelled out: "[#|]" matches the "|" of "<|pad|>"); text (without
    special tokens) kept whole, finish reason `stop` naming the pattern; on a server it is sent in SGLang's field;
    a bad pattern is an error."""
    free = count_to_a_match.run(pattern=None, backend=backend)
    tok = backend.tokenizer
    full = [e[1] for e in free.get_meta_info("o")["output_token_logprobs"]]
    assert len(full) == 40
    stopped_any = 0
    for pattern in (r"[0-9]", r"q.X", r"[#|]", r"zzzz"):
        st = count_to_a_match.run(pattern=pattern, backend=backend)
        text, meta = st["o"], st.get_meta_info("o")
        first = next((k for k in range(1, len(full) + 1)
                      if re.search(pattern, tok.decode(full[:k]))), None)
        if first is None:
            assert text == free["o"] and meta["finish_reason"] == free.get_meta_info("o")["finish_reason"]
        else:
            stopped_any += 1
            assert meta["finish_reason"] == {"type": "stop", "matched": pattern}
            assert [e[1] for e in meta["output_token_logprobs"]] == full[:first]
            assert text == tok.decode(full[:first], skip_special_tokens=True)
    assert stopped_any >= 2
    assert SamplingParams(stop_regex=r"\d").to_srt_json()["stop_regex"] == [r"\d"]
    assert SamplingParams(stop_regex=["", None and "x"]).stop_regex == ()
    with pytest.raises(ValueError, match="invalid stop_regex"):
        SamplingParams(stop_regex="[")


# -- streaming ------------------------------------------------------------------------------------------
def sglang_normalize_error(stop, stop_regex) -> str | None:
    """Oracle: SGLang 0.5.23's own SamplingParams.normalize (srt/sampling/sampling_params.py imports on CPU) - its
    ValueError message, None where it accepts."""
    from sglang.srt.sampling.sampling_params import SamplingParams as SrtSamplingParams

    try:
        SrtSamplingParams(stop=list(stop), stop_regex=list(stop_regex)).normalize(None if not stop and not stop_regex
                                                                                  else _ByteTokenizer())
    except ValueError as exc:
        return str(exc)
    return None


class _ByteTokenizer:
    """What normalize asks of a tokenizer (a stop string's token count)."""

    def encode(self, text, add_special_tokens=False):
        return list(text.encode("utf-8"))


@function
def many_stops(s, stops, patterns):
    s += "Say:" + gen("x", max_tokens=3, stop=stops, stop_regex=patterns)


@pytest.mark.parametrize("stop, stop_regex", [
    ([f"s{i}" for i in range(31)], ["y"] * 32),  # 31 + the chatml template's "<|im_end|>": 32 stop strings
    ([f"s{i}" for i in range(32)], []),  # + "<|im_end|>": 33
    ([], ["y"] * 33),
    ([], ["\\d" + "é" * 127]),  # 256 bytes
    ([], ["\\d" + "é" * 128]),  # 258 bytes
])
def test_stop_limits_are_sglangs(backend, stop, stop_regex):
    """SGLang refuses more than 32 stop strings, more than 32 stop_regex patterns and a pattern over 256 UTF-8 bytes
    (normalize: a ValueError, HTTP 400); a program gen on the embedded backend is refused with SGLang's message
    where SGLang's own normalize refuses the stop strings the interpreter sends (the user's and the chat
    template's), and runs where it accepts them."""
    sent = stop + list(backend.chat_template.stop_str)
    want = sglang_normalize_error(sent, stop_regex)
    st = many_stops.run(stops=stop, patterns=stop_regex or None, backend=backend)
    with pytest.warns(UserWarning) if want else contextlib.nullcontext():
        st.sync()
    if want is None:
        assert st.error() is None and st.get_meta_info("x")["finish_reason"] is not None
    else:
        assert isinstance(st.error(), ValueError) and str(st.error()) == want


@function
def streamed(s, seed):
    s += sampling_seed(seed) + "Once upon a time"
    s += gen("story", max_tokens=40, temperature=1.0, return_logprob=True)


async def _collect(state, name):
    return [(c, m) async for c, m in state.text_async_iter(name, return_meta_data=True)]


def test_stream_chunks_follow_sglangs_contract(backend):
    for seed in (1, 2, 3):
        whole = streamed.run(seed=seed, backend=backend)
        chunks = asyncio.run(_collect(streamed.run(seed=seed, backend=backend, stream=True), "story"))
        assert len(chunks) > 1 and all(text for text, _ in chunks)
        assert "".join(text for text, _ in chunks) == whole["story"]
        prev = 0
        entries = []
        for _, meta in chunks:
            n = meta["completion_tokens"]
            assert meta["output_token_logprobs_length"] == n
            assert len(meta["output_token_logprobs"]) == n - prev
            entries += meta["output_token_logprobs"]
            prev = n
        assert entries == whole.get_meta_info("story")["output_token_logprobs"]  # same ids and log q
        assert chunks[-1][1]["finish_reason"] == whole.get_meta_info("story")["finish_reason"]


def test_stream_holds_back_a_stop_string_prefix(backend):
    tok = backend.tokenizer
    params = SamplingParams(stop=("Q:",), return_logprob=True)
    chunks = StreamChunks(tok, params, prompt_tokens=3)
    ids = list(tok.encode("ab Q"))
    sent = []
    for k in range(1, len(ids) + 1):
        got = chunks.update(RowEvent("r", tuple(ids[:k]), output_logq=tuple([-1.0] * k)))
        if got is not None:
            sent.append(got[0])
    assert "".join(sent) == "ab "  # "Q" may still become "Q:"
    snowman = list("☃".encode())  # three bytes: nothing printable until the character is whole
    assert chunks.update(RowEvent("r", tuple(ids + snowman[:2]), output_logq=tuple([-1.0] * (len(ids) + 2)))) is None
    text, meta = chunks.update(RowEvent("r", tuple(ids + snowman), output_logq=tuple([-1.0] * (len(ids) + 3))))
    assert text == "Q☃" and meta["completion_tokens"] == len(ids) + 3 and len(meta["output_token_logprobs"]) == 4


@pytest.mark.parametrize("text, pattern, final", [("The answer is 4", "answer is", "The "),
                                                   ("x answer y", "answer is", "x answer y"),
                                                   ("a 12 b", r"\d+", "a 12 b")])
def test_stream_holds_back_what_a_stop_regex_may_cut(backend, text, pattern, final):
    """A stop_regex match cuts the final text where the pattern's source occurs literally: the chunks hold back a
    suffix that may begin it and the text from a whole occurrence on, so they still concatenate to the final text
    (streamed 'The answer' used to be sent before the cut at 'answer is')."""
    tok = backend.tokenizer
    chunks = StreamChunks(tok, SamplingParams(stop_regex=(pattern,), return_logprob=True), prompt_tokens=3)
    ids = list(tok.encode(text))
    sent = [got[0] for k in range(1, len(ids) + 1)
            if (got := chunks.update(RowEvent("r", tuple(ids[:k]), output_logq=tuple([-1.0] * k)))) is not None]
    assert final.startswith("".join(sent))
    out = GenerateOutput(tuple([1, 2, 3]), tuple(ids), final, {"output_token_logprobs": [[-1.0, i, None] for i in ids]})
    assert "".join(sent) + chunks.final(out)[0] == final


def test_stream_holds_back_a_stop_string_split_by_a_special_token(backend):
    """"a", <|im_end|>, "b" does not stop a gen with stop "ab" (SGLang matches with special tokens spelled out), but
    once a later "ab" does, the final text is cut before the first "ab" of the text without special tokens - the
    split one (detokenizer_manager.py trim_matched_stop).  The chunks hold that text back, so they still
    concatenate to the final text, which the engine itself produces."""
    tok = backend.tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    ids = list(tok.encode("x a")) + [im_end] + list(tok.encode("b y ab"))
    params = SamplingParams(stop=("ab",), ignore_eos=True, return_logprob=True)
    chunks = StreamChunks(tok, params, prompt_tokens=3)
    sent = [got[0] for k in range(1, len(ids) + 1)
            if (got := chunks.update(RowEvent("r", tuple(ids[:k]), output_logq=tuple([-1.0] * k)))) is not None]
    final = "x "  # the oracle: "x ab y ab" cut before its first "ab"
    r = SimpleNamespace(params=params, output_ids=[], grammar=None, stop_text_cut=None, finish_reason=None)
    for t in ids:  # the engine's own stop rule and text on these ids: it stops at the last token only
        r.output_ids.append(t)
        r.finish_reason = stop_reason(r, t, (tok.eos_token_id,), tok)
        assert (r.finish_reason is None) == (len(r.output_ids) < len(ids))
    assert output_text(r, tok) == final
    assert final.startswith("".join(sent))
    out = GenerateOutput(tuple([1, 2, 3]), tuple(ids), final, {"output_token_logprobs": [[-1.0, i, None] for i in ids]})
    assert "".join(sent) + chunks.final(out)[0] == final


def test_sglangs_stream_reader_sees_every_chunk(backend):
    """SGLang's own reader (text_async_iter with meta data) on fast tiny-model steps: each chunk it yields carries
    exactly the logprob entries of its new tokens (the pacing in `token_exact.ReaderPacing`)."""
    for seed in range(8):
        chunks = asyncio.run(_collect(streamed.run(seed=100 + seed, backend=backend, stream=True), "story"))
        prev = 0
        for _, meta in chunks:
            assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] - prev
            prev = meta["completion_tokens"]


@function
def three_streams(s):
    for k, name in enumerate(("a", "b", "c")):
        s += sampling_seed(30 + k) + f" part {k}:" + gen(name, max_tokens=12, temperature=1.0, ignore_eos=True)


def test_unread_streams_cost_no_wait(backend):
    """A streamed program whose gens nobody reads finishes in about the time of the same program not streamed (SGLang's
    interpreter never waits for a reader; the pacing here once waited a second per gen before giving up: 3 s for
    these three gens of 12 tiny-model tokens, which take milliseconds), and a reader that comes after the program
    ended still finds every gen's whole text (the same text as the non-streamed run: the same seeds).  (SGLang's
    text_iter(name) called after the program ended yields "" only - its own rule - so the oracle is the variable.)"""
    whole = three_streams.run(backend=backend)
    start = time.monotonic()
    st = three_streams.run(backend=backend, stream=True)
    st.sync()
    elapsed = time.monotonic() - start
    assert elapsed < 1.0, f"three unread streamed gens took {elapsed:.2f} s"
    for name in ("a", "b", "c"):
        assert st[name] == whole[name]
    assert st.text() == whole.text()


@function
def three_long_streams(s):
    for k, name in enumerate(("a", "b", "c")):
        s += sampling_seed(64 + k) + f" part {k}:" + gen(name, max_tokens=150, temperature=1.0, ignore_eos=True)


def test_a_text_reader_gets_each_gen_streamed(backend):
    """SGLang's reader of the whole program text (`text_iter()`, no variable) takes each chunk by clearing the text
    event; it usually clears the text before a gen starts too (the worker sets the event after every expression), so
    the gen must still see it as a reader: each long gen reaches it in pieces - some piece ends inside the gen's
    text - not only as one last chunk.  (A short gen may legitimately arrive whole: the engine can run ahead of the
    reader.)"""
    for _ in range(3):
        st = three_long_streams.run(backend=backend, stream=True)
        assert_each_gen_arrives_in_pieces(st)
        assert all(st.get_meta_info(name)["completion_tokens"] == 150 for name in "abc")  # no "<|im_end|>" drawn


def assert_each_gen_arrives_in_pieces(st) -> None:
    """Read `st`'s whole text as SGLang's text_iter gives it: the pieces spell the text, and some piece ends inside
    each of the gens a, b and c."""
    pieces = list(st.text_iter())
    text = st.text()
    assert "".join(pieces) == text
    ends = set(itertools.accumulate(len(p) for p in pieces))
    for name in ("a", "b", "c"):
        start = text.index(st[name])
        assert any(start < end < start + len(st[name]) for end in ends), (name, pieces)


class PublicApiEvent:
    """A threading.Event with only its documented methods, over a Condition of its own: another Python's Event (or a
    later CPython's) need not keep its waiting threads in `_cond._waiters`."""

    def __init__(self) -> None:
        self._guard = threading.Condition(threading.Lock())
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        with self._guard:
            self._flag = True
            self._guard.notify_all()

    def clear(self) -> None:
        with self._guard:
            self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        with self._guard:
            return self._guard.wait_for(lambda: self._flag, timeout)


def test_the_text_reader_is_paced_through_the_events_public_methods(backend, monkeypatch):
    """The pacing sees SGLang's whole-text reader through the text event's public methods only: with events that
    lack CPython's private `_cond._waiters` (which the pacing once read to tell a waiting reader from none), each
    long gen still reaches the reader in pieces; before, it arrived as one last chunk."""
    import sglang.lang.interpreter as interpreter

    monkeypatch.setattr(interpreter, "threading", SimpleNamespace(
        Event=PublicApiEvent, Thread=threading.Thread, Lock=threading.Lock))
    for _ in range(3):
        st = three_long_streams.run(backend=backend, stream=True)
        assert isinstance(st.stream_executor.stream_text_event, PublicApiEvent)
        assert_each_gen_arrives_in_pieces(st)


# -- token usage --------------------------------------------------------------------------------------------
def test_token_usage_counts_prompt_and_completion(backend):
    """The counts are the engine's own: every request's input ids, every generated token. The oracle is what the
    engine received, not a re-tokenization of the program text: 5 sampled tokens need not decode and re-encode to
    5 ids (the backend then tokenizes the text, correct but not id-exact), so the prompt length of the scoring
    requests depends on the sample (CI once read 40 where a fixed 38 was expected).  The gen runs under ignore_eos
    but with the chatml template's stop string "<|im_end|>", which SGLang 0.5.23 matches in the output with special
    tokens spelled out, ignore_eos or not (schedule_batch.py _check_str_based_finish): a gen that draws <|im_end|>
    ends there (seed 4 draws it first), the others run their 5 tokens."""
    @function
    def two(s, seed):
        s += sampling_seed(seed) + "Hello" + gen("a", max_tokens=5, ignore_eos=True, return_logprob=True)
        s += " and " + sgl.select("c", ["x", "yy"])

    engine = backend.engine
    for seed in (0, 4, 21, 115):  # 21, 115: the generated ids are not re-used (40, 36 prompt tokens in all); 4: 28
        usage = backend.token_usage
        usage.reset()
        first = len(engine.input_lengths)
        st = two.run(seed, backend=backend)
        st.sync()
        lengths = engine.input_lengths[first:]
        a = st.get_meta_info("a")
        ids = [e[1] for e in a["output_token_logprobs"]]
        im_end = backend.tokenizer.convert_tokens_to_ids("<|im_end|>")
        want = ids.index(im_end) + 1 if im_end in ids else 5
        assert usage.completion_tokens == want == len(ids) == a["completion_tokens"]
        assert len(lengths) == 3 and lengths[0] == len(backend.tokenizer.encode("Hello"))
        prefix = min(lengths[1:])
        assert sorted(lengths[1:]) == [prefix, prefix + 1]  # one scoring per choice: "x" one id, "yy" two
        assert prefix >= lengths[0] + len(backend.tokenizer.encode(" and "))  # "Hello", the generated text, " and "
        assert usage.prompt_tokens == sum(lengths)
        usage.reset()
        assert (usage.prompt_tokens, usage.completion_tokens) == (0, 0)
