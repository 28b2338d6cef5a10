"""TokenExactBackend: markers, remembered generations and plain text become exact ids."""

from __future__ import annotations

import threading

from forerun.runtime_ext.protocol import GenerateOutput, SamplingParams
from forerun.runtime_ext.backends.sglang_frontend import function, gen
from forerun.runtime_ext.backends.token_exact import TokenExactBackend
from forerun.runtime_ext.backends.token_markers import sampling_seed, token_ids


class ByteTokenizer:
    def encode(self, text, add_special_tokens=False):
        return list(text.encode("utf-8"))

    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")


class RecordingBackend(TokenExactBackend):
    """Generates `max_new_tokens` copies of (seed % 26 + 'a') and records every request."""

    def __init__(self):
        super().__init__(ByteTokenizer(), add_special_tokens=False)
        self.requests: list[tuple[list[int], SamplingParams]] = []
        self.lock = threading.Lock()

    def run(self, input_ids, params):
        with self.lock:
            self.requests.append((list(input_ids), params))
        tok = ord("a") + ((params.seed or 0) % 26)
        out = (tok,) * params.max_new_tokens
        return GenerateOutput(tuple(input_ids), out, bytes(out).decode(), {"prompt_tokens": len(input_ids)})


def test_fork_from_token_cuts_sends_exact_prefixes():
    root = list("héllo wörld €".encode("utf-8"))
    cuts = [0, 2, 3, len(root) - 2]  # 2 and len-2 split multi-byte characters

    @function
    def branches(s, root, cuts):
        forks = s.fork(len(cuts))
        for f, c in zip(forks, cuts):
            f += token_ids(root[:c]) + sampling_seed(c)
            f += gen("out", max_tokens=3)
        forks.join()

    backend = RecordingBackend()
    state = branches.run(root=root, cuts=cuts, backend=backend)
    assert state.error() is None
    sent = sorted(backend.requests, key=lambda r: len(r[0]))
    assert [ids for ids, _ in sent] == [root[:c] for c in cuts]
    assert [p.seed for _, p in sent] == cuts


def test_second_gen_reuses_exact_ids_of_first():
    # 0xC3 alone is not valid UTF-8: its text round-trip would not give the ids back
    @function
    def two_turns(s):
        s += token_ids([0xC3]) + sampling_seed(1)
        s += gen("a", max_tokens=2)
        s += " then"
        s += gen("b", max_tokens=1)

    backend = RecordingBackend()
    two_turns.run(backend=backend).sync()
    (ids_a, _), (ids_b, _) = backend.requests
    assert ids_a == [0xC3]
    assert ids_b == [0xC3, ord("b"), ord("b")] + list(b" then")


def test_plain_text_programs_still_work():
    @function
    def plain(s):
        s += "Q: hi\nA:"
        s += gen("a", max_tokens=1)

    backend = RecordingBackend()
    state = plain.run(backend=backend)
    state.sync()
    assert backend.requests[0][0] == list(b"Q: hi\nA:")
    assert state["a"] == "a"


class EmptyOrStopBackend(RecordingBackend):
    """Output ids spell more than the returned text: an empty text, or a text cut at a stop string."""

    def __init__(self, texts):
        super().__init__()
        self.texts = list(texts)

    def run(self, input_ids, params):
        with self.lock:
            self.requests.append((list(input_ids), params))
            text = self.texts.pop(0)
        out = tuple(text.encode()) + (ord("#"),)  # the '#' is the stop token, cut from the text
        return GenerateOutput(tuple(input_ids), out, text, {})


def test_empty_generation_is_not_remembered_as_the_prompt():
    @function
    def ask(s):
        s += "Q:"
        s += gen("a", max_tokens=1)

    backend = EmptyOrStopBackend(["", ""])
    ask.run(backend=backend).sync()
    ask.run(backend=backend).sync()
    assert [ids for ids, _ in backend.requests] == [list(b"Q:"), list(b"Q:")]


@function
def answer_then_follow_up(s, first_tokens):
    """'Q:', a generation, '!', a one-token generation: the second request shows which ids the first left."""
    s += "Q:"
    s += gen("a", max_tokens=first_tokens)
    s += "!"
    s += gen("b", max_tokens=1)


def test_stop_token_not_in_text_is_not_replayed():
    backend = EmptyOrStopBackend(["ab", "c"])
    answer_then_follow_up.run(first_tokens=3, backend=backend).sync()
    # the second request continues exactly the text "Q:ab!" — not the hidden stop token
    assert backend.requests[1][0] == list(b"Q:ab!")


class LongStopBackend(RecordingBackend):
    """The first output: a byte that is no UTF-8 character by itself, 'a', then a stop string of 15 tokens that
    the text is cut before (as SGLang and the engine report it); later outputs: one 'c'."""

    STOP = "<<END-OF-TURN>>"

    def run(self, input_ids, params):
        with self.lock:
            self.requests.append((list(input_ids), params))
            first = len(self.requests) == 1
        if not first:
            return GenerateOutput(tuple(input_ids), (ord("c"),), "c", {})
        out = (0xC3, ord("a")) + tuple(self.STOP.encode())
        return GenerateOutput(tuple(input_ids), out, bytes(out[:2]).decode("utf-8", errors="replace"),
                              {"finish_reason": {"type": "stop", "matched": self.STOP}})


def test_ids_before_a_long_stop_string_are_replayed_exactly():
    """The ids that spell a generation's text are found however many tokens its stop string took, so the next
    request continues with those ids, not with a re-tokenization of the text (here U+FFFD for the lone byte)."""
    backend = LongStopBackend()
    answer_then_follow_up.run(first_tokens=20, backend=backend).sync()
    assert backend.requests[1][0] == list(b"Q:") + [0xC3, ord("a")] + list(b"!")


def test_a_program_that_starts_with_a_gen_sends_the_empty_texts_ids():
    """SGLang's RuntimeEndpoint sends the text "" and its server tokenizes it: a BOS where the tokenizer adds one
    (the stand-in's byte tokenizer, Llama's), so such a program runs there; forerun sent no ids at all."""
    from forerun.runtime_ext.standin.server import BOS_ID, byte_tokenizer

    class BosBackend(RecordingBackend):
        def __init__(self):
            super().__init__()
            self.tokenizer, self.add_special_tokens = byte_tokenizer(), True

    @function
    def prog(s):
        s += gen("x", max_tokens=2)

    backend = BosBackend()
    assert backend.tokenizer.encode("") == [BOS_ID]
    state = prog.run(backend=backend)
    assert state["x"] == "aa" and backend.requests[0][0] == [BOS_ID]


def test_a_program_that_starts_with_a_gen_on_a_tokenizer_without_bos_is_refused_clearly():
    """Where the tokenizer adds no BOS (the tiny model's, Qwen's), "" is no ids at all: there is no token to continue
    from.  The backend sent an empty prompt on (the engine then said only "empty prompt (input_ids is empty)");
    it now refuses the program before any request, saying why and what to do."""
    @function
    def prog(s):
        s += gen("x", max_tokens=2)

    backend = RecordingBackend()
    assert backend.tokenizer.encode("", add_special_tokens=True) == []
    state = prog.run(backend=backend)
    assert "no text before its first gen" in str(state.error()) and "adds no BOS" in str(state.error())
    assert backend.requests == []  # nothing sent


def test_kept_special_tokens_setting_is_refused_not_ignored():
    """SGLang's RuntimeEndpoint sends `skip_special_tokens = global_config.skip_special_tokens_in_output` with every
    gen (lang/backend/runtime_endpoint.py, generate and generate_stream): set False, the text keeps special tokens.
    forerun's texts always skip them, so the setting must fail the gen, streamed or not, rather than be ignored."""
    from forerun.runtime_ext.backends.sglang_frontend import sgl

    @function
    def one_gen(s):
        s += "Hi " + gen("out", max_tokens=2)

    backend = RecordingBackend()
    sgl.global_config.skip_special_tokens_in_output = False
    try:
        for stream in (False, True):
            state = one_gen.run(backend=backend, stream=stream)
            if stream:
                list(state.text_iter())
            error = state.error()
            assert isinstance(error, NotImplementedError) and "skip_special_tokens_in_output" in str(error)
        assert backend.requests == []
    finally:
        sgl.global_config.skip_special_tokens_in_output = True
    assert one_gen.run(backend=backend).error() is None
