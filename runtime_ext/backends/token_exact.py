"""A token-exact SGLang frontend backend on top of any `Engine`-like `run(ids, params)` callable.

Stock `RuntimeEndpoint` sends `s.text_` and lets the server re-tokenize it; forerun backends send ids:

* `token_ids(...)` markers in the program text are decoded to exactly those ids
  (see `token_markers`), `sampling_seed(...)` markers set the request seed;
* text this backend generated earlier is remembered with its ids (a bounded LRU keyed by the full
  program text after the generation), so a later request whose text extends it reuses those ids
  exactly - this is what keeps forks and multi-gen programs exact without markers;  each program stream
  (`StreamExecutor`) also keeps its own latest generation, which its next gen and its fork children's first gens
  extend however many other programs' generations pushed it out of the LRU (`generation_memory`);
* any other text is tokenized.

Constraints (issue 32): `gen(regex=...)`, `gen(json_schema=...)` and the dtype gens (`gen_int`, `gen_string`,
`gen(dtype=int|float|bool|str)`) reach the engine as SGLang's own request fields: a dtype becomes SGLang's regex
for it exactly as the stock `RuntimeEndpoint._handle_dtype_to_regex` does (`dtype_to_regex`).

Streaming (`generate_stream`) follows SGLang's contract when the backend can stream (`run_stream`; see
`StreamChunks`); `token_usage` counts the prompt and completion tokens of every request (SGLang's `TokenUsage`
interface: `prompt_tokens`, `completion_tokens`, `reset()`).

Subclasses implement `run(input_ids, params) -> GenerateOutput` and `tokenizer`; streaming ones `run_stream`.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..protocol import EngineError, GenerateOutput, RowEvent, SamplingParams
from .sglang_frontend import (
    BaseBackend,
    ChoicesDecision,
    SglSamplingParams,
    StreamExecutor,
    refuse_kept_special_tokens,
    sgl,
    token_length_normalized,
)
from .generation_memory import GenerationMemory
from .text_ids import continuation_ids
from .token_markers import Directives, IdsSegment, parse_marked_text, parse_marked_text_directives


def dtype_to_regex(p: SglSamplingParams) -> SglSamplingParams:
    """A copy of `p` as SGLang's stock backend sends a dtype gen (gen_int, gen_string, gen(dtype=...)): SGLang's own
    `RuntimeEndpoint._handle_dtype_to_regex` run on the copy (it mutates its argument and never reads `self`) -
    the regex of `sglang.lang.ir` for the dtype (REGEX_INT, REGEX_FLOAT, REGEX_STR, REGEX_BOOL; it wins over an
    explicit regex, with SGLang's warning) and, for int and float, " " and "\\n" added to the stop strings.
    A str `stop` becomes a list first (SGLang would fail on `str.extend`).  No dtype: `p` itself."""
    if p.dtype is None:
        return p
    out = copy.deepcopy(p)
    if isinstance(out.stop, str):
        out.stop = [out.stop]
    elif isinstance(out.stop, tuple):
        out.stop = list(out.stop)
    sgl.RuntimeEndpoint._handle_dtype_to_regex(None, out)
    return out


@dataclass
class TokenUsage:
    """Tokens a backend's requests used (the interface of SGLang's `lang.backend.openai.TokenUsage`, which
    `test_completion_speculative` reads); thread-safe."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def reset(self) -> None:
        with self._lock:
            self.prompt_tokens = self.completion_tokens = 0

    def add(self, prompt_tokens: int, completion_tokens: int) -> None:
        with self._lock:
            self.prompt_tokens += int(prompt_tokens)
            self.completion_tokens += int(completion_tokens)


PER_TOKEN_KEYS = ("output_token_logprobs", "output_top_logprobs")
"""meta_info keys SGLang streams incrementally (each chunk: the entries of the chunk's new tokens; the frontend's
`_INCREMENTAL_STREAMING_META_INFO_KEYS`)."""


class StreamChunks:
    """SGLang's streaming contract, from the `RowEvent`s of one request:

    - every chunk's text is non-empty and the chunks concatenate to the final text (text that may still turn
      into a stop string - a suffix that begins one, a stop string that special tokens split or a stop_regex
      pattern's source, where a match would cut the text - or an incomplete UTF-8 character is held back until
      it is resolved); only the last chunk may be empty, when the final tokens spell no text (EOS).  SGLang
      itself holds back no stop_regex text and no split stop string: there a streamed gen can end with text its
      final text cuts;
    - each chunk's meta_info has `completion_tokens` = tokens so far and, under return_logprob (as in SGLang),
      `output_token_logprobs_length` = the same and the entries of SGLang's incremental keys (`PER_TOKEN_KEYS`) for
      the chunk's new tokens only;
    - the last chunk carries the request's whole meta_info (finish_reason, forerun's per-token extras such as
      output_token_logp0 in full) with the incremental keys sliced the same way.
    """

    def __init__(self, tokenizer: Any, params: SamplingParams, prompt_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.params = params
        self.prompt_tokens = prompt_tokens
        self.text = ""
        """Text sent so far."""
        self.tokens = 0
        """Tokens whose meta entries were sent so far (progress events without per-token entries - a server's
        stream reports ids only - leave theirs to the last chunk)."""

    def _printable(self, ids: Sequence[int]) -> str:
        text = self.tokenizer.decode(list(ids), skip_special_tokens=True)
        end = len(text)
        while end > 0 and text[end - 1] == "\ufffd":  # an incomplete UTF-8 character may complete later
            end -= 1
        # A matched stop string or stop_regex cuts the final text at its first literal occurrence in the text without
        # special tokens (`engine.output`, SGLang's trim_matched_stop) - for a stop string, one that special tokens
        # split ("a<|im_end|>b"), which did not stop the output: text from such an occurrence on is held back too,
        # until the request finishes.
        for literal in self.params.stop + self.params.stop_regex:
            at = text.find(literal, 0, end) if literal else -1
            end = at if at >= 0 else end
        for stop in self.params.stop + self.params.stop_regex:  # a suffix that may still become one of them
            for k in range(min(len(stop) - 1, end), 0, -1):
                if text[:end].endswith(stop[:k]):
                    end -= k
                    break
        return text[:end]

    def _token_entries(self, event: RowEvent, start: int) -> list[list[Any]]:
        assert event.output_logq is not None
        ids = event.output_ids
        return [[event.output_logq[t], ids[t], self.tokenizer.decode([ids[t]])] for t in range(start, len(ids))]

    def update(self, event: RowEvent) -> tuple[str, dict[str, Any]] | None:
        """The chunk this progress event makes (None when it adds no printable text yet)."""
        text = self._printable(event.output_ids)
        if len(text) <= len(self.text) or not text.startswith(self.text):
            return None
        n = len(event.output_ids)
        meta: dict[str, Any] = {"prompt_tokens": self.prompt_tokens, "completion_tokens": n, "finish_reason": None}
        if self.params.return_logprob:
            meta["output_token_logprobs_length"] = n
        if event.output_logq is not None:
            meta["output_token_logprobs"] = self._token_entries(event, self.tokens)
        if event.output_top_logprobs is not None:
            meta["output_top_logprobs"] = list(event.output_top_logprobs[self.tokens:])
        chunk = text[len(self.text):]
        self.text = text
        if event.output_logq is not None or event.output_top_logprobs is not None:
            self.tokens = n
        return chunk, meta

    def final(self, out: GenerateOutput) -> tuple[str, dict[str, Any]]:
        """The last chunk: the rest of the final text and the whole meta_info (incremental keys sliced)."""
        meta = dict(out.meta_info)
        for key in PER_TOKEN_KEYS:
            if isinstance(meta.get(key), list):
                meta[key] = meta[key][self.tokens:]
        n = len(out.output_ids)
        meta["completion_tokens"] = n
        if self.params.return_logprob:
            meta["output_token_logprobs_length"] = n
        chunk = out.text[len(self.text):]  # the sent text is a prefix of the final text (see `_printable`)
        self.text, self.tokens = out.text, n
        return chunk, meta


class ReaderPacing:
    """Hands a streamed gen's chunks to SGLang's stream readers one at a time, without a fixed wait for a reader.

    A reader (`ProgramState.text_iter` / `text_async_iter`, in another thread) waits on an event the interpreter
    sets per chunk, clears it, then reads the variable's new text and its meta_info - which the interpreter
    *replaces* per chunk.  Two chunks landing before one read show both chunks' text with the second chunk's
    meta_info only: the first chunk's incremental entries (`output_token_logprobs`) are lost.  A server's decode
    step is slower than a reader's wake-up; the embedded engine's can be faster.  So a chunk is sent only once a
    reader took what was set last - cleared this gen's variable event (set by the interpreter before the first
    chunk and with every chunk) or the text event since the pacing set it when the gen began (only the events'
    public methods: no count of waiting threads, which no public API gives); until then the engine's progress events are
    merged into a later chunk (each event holds all tokens so far, and `StreamChunks` gives a chunk the entries of
    all its tokens).  A stream nobody reads is thus sent as one last chunk, costing no time (it used to wait a
    second per gen before giving up on a reader), and a reader that comes later finds its whole text.  Only the
    last chunk of a stream a reader has taken chunks of waits for that reader to take the previous one (at most
    `wait_s`: a reader that stopped reading), since it cannot be merged into a later one.
    """

    def __init__(self, s: StreamExecutor, wait_s: float = 1.0) -> None:
        self.s = s
        self.wait_s = wait_s
        self.active = getattr(s, "stream_var_event", None) is not None
        self.var_event: threading.Event | None = None
        self.text_event: threading.Event | None = None
        self.text_was_set = False
        if self.active:
            # this gen: the one variable assigned ("" before the first chunk) whose gen has not finished
            running = [name for name in list(s.variables) if name in s.variable_event
                       and not s.variable_event[name].is_set() and name in s.stream_var_event]
            self.var_event = s.stream_var_event[running[0]] if len(running) == 1 else None
            self.text_event = s.stream_text_event
            self.text_was_set = False
            if self.text_event is not None:
                # A whole-text reader usually cleared the event the worker set after the previous expression (or the
                # gen opened the program: never set), and now waits on it.  Setting it as the worker does after
                # every expression wakes such a reader once (it reads no new text and waits again): its clearing
                # the event then says a reader takes chunks, with the event's public methods only.
                self.text_event.set()
                self.text_was_set = True

    def _taken(self) -> bool:
        """Whether a reader cleared this gen's variable event, or the text event (set when this pacing began)."""
        if self.var_event is not None and not self.var_event.is_set():
            return True
        return self.text_was_set and self.text_event is not None and not self.text_event.is_set()

    def may_send(self, sent_text: str) -> bool:
        """Whether the next (not the last) chunk may be sent now, after `sent_text` was sent."""
        if not self.active:
            return True
        if not self._taken():
            return False
        if sent_text:
            time.sleep(0.001)  # the reader reads the text and meta_info right after clearing the event
        return True

    def before_last(self, sent_text: str) -> None:
        """Before the last chunk: wait (at most wait_s) until a reader took the chunks sent so far, if any were."""
        if not self.active or not sent_text:
            return
        deadline = time.monotonic() + self.wait_s
        while not self._taken():
            if time.monotonic() > deadline:
                return
            time.sleep(0.0005)
        time.sleep(0.001)


def latest_event(events: "queue.Queue[RowEvent]", event: RowEvent) -> RowEvent:
    """The newest queued progress event (each one holds all tokens so far), stopping at a final one."""
    while not (event.finished or event.error is not None):
        try:
            event = events.get_nowait()
        except queue.Empty:
            break
    return event


def refuse_images(s: StreamExecutor) -> None:
    """forerun's backends send token ids only: a program with `sgl.image(...)` or `sgl.video(...)` (the interpreter
    keeps both in `images_`) gets a clear error, never an answer to its text with the media dropped."""
    if getattr(s, "images_", None):
        raise NotImplementedError("sgl.image / sgl.video: forerun backends send the prompt as token ids and carry no "
                                  "images or videos; run multimodal programs on SGLang's own RuntimeEndpoint")


class TokenExactBackend(BaseBackend):
    """SGLang frontend backend whose requests are token ids, never re-tokenized text."""

    streams = False
    """Whether `run_stream` is implemented (else `generate_stream` yields the whole generation at once)."""
    is_chat_model = False
    """A completion-style backend (token ids in, tokens out): the interpreter's API speculative execution then
    generates ahead with `_spec_gen` (SGLang's OpenAI backend sets this attribute; the interpreter reads it)."""

    def __init__(self, tokenizer: Any, *, memory_size: int = 4096, add_special_tokens: bool = True) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.add_special_tokens = add_special_tokens
        self.memory = GenerationMemory(memory_size)
        """The generations this backend remembers (text -> exact ids): `generation_memory`."""
        self.token_usage = TokenUsage()

    # -- to implement -------------------------------------------------------------------------
    def run(self, input_ids: Sequence[int], params: SamplingParams) -> GenerateOutput:
        raise NotImplementedError

    def run_batch(self, requests: Sequence[tuple[Sequence[int], SamplingParams]]) -> list[GenerateOutput]:
        """Default: one `run` per request; engines override to share one batched call."""
        return [self.run(ids, p) for ids, p in requests]

    def run_stream(self, input_ids: Sequence[int], params: SamplingParams, *, rid: str,
                   listener: Callable[[list[RowEvent]], None]) -> None:
        """Start one request whose progress `listener` hears (`protocol.StreamingEngine.submit_stream`)."""
        raise NotImplementedError

    # -- text -> ids --------------------------------------------------------------------------
    def _tokenize(self, text: str, at_start: bool) -> list[int]:
        """Ids of program text: at the start, as the tokenizer encodes it (its BOS where it adds one); after earlier
        ids, as the same text inside the whole program text (`text_ids.continuation_ids`)."""
        if at_start:
            return list(self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens))
        return continuation_ids(self.tokenizer, text)

    def _decode(self, ids: Sequence[int]) -> str | None:
        """The literal text of `ids` (special tokens included); None if the tokenizer cannot decode."""
        decode = getattr(self.tokenizer, "decode", None)
        if decode is None:
            return None
        try:
            return decode(list(ids), skip_special_tokens=False)
        except TypeError:  # minimal tokenizers without the keyword
            return decode(list(ids))

    def _remember_generation(self, text_before: str, ids_before: Sequence[int], out: GenerateOutput,
                             stream: Any = None) -> None:
        """Remember `text_before + out.text` as `ids_before + the output ids that spell exactly out.text` (and as
        `stream`'s latest generation).

        The output ids can spell more than `out.text` (a stop string cuts the text but keeps the token that
        completed it; EOS is skipped in the text), and an empty text would re-key `text_before` itself.  Only
        a prefix of the output ids whose decoding is exactly `out.text` is remembered; if none is, nothing is,
        and later requests tokenize that text instead (correct, merely not id-exact).  The prefix is looked for
        among the last 8 token counts, and further back by the matched stop string's UTF-8 bytes (each token
        spells at least one byte).
        """
        if not out.text:
            return
        n = len(out.output_ids)
        matched = ((out.meta_info or {}).get("finish_reason") or {}).get("matched")
        back = 8 + (len(matched.encode("utf-8", "surrogatepass")) if isinstance(matched, str) else 0)
        for k in range(n, max(n - back, 0), -1):
            if self._decode(out.output_ids[:k]) == out.text:
                self.memory.remember(text_before + out.text, list(ids_before) + list(out.output_ids[:k]), stream)
                return

    def input_ids_of(self, text: str, stream: Any = None) -> tuple[list[int], int | None]:
        """Exact ids of a program text, and the sampling seed its markers set (None if none)."""
        ids, directives = self.request_of(text, stream)
        return ids, directives.seed

    def request_of(self, text: str, stream: Any = None) -> tuple[list[int], Directives]:
        """Exact ids of a program text (of program stream `stream`, when given), and the request settings its
        markers set."""
        _, directives = parse_marked_text_directives(text)
        known, ids = self.memory.longest(text, stream)
        out = list(ids)
        segments, _ = parse_marked_text(text[len(known):])
        for seg in segments:
            if isinstance(seg, IdsSegment):
                out.extend(seg.ids)
            elif seg.text:
                out.extend(self._tokenize(seg.text, at_start=not out))
        if not out:  # a program that starts with a gen: SGLang tokenizes "" (a BOS where the tokenizer adds one)
            out = self._tokenize("", at_start=True)
        if not out and not text:
            raise ValueError("empty prompt: the program has no text before its first gen or select, and this "
                             "model's tokenizer adds no BOS token to \"\", so there is no token to continue from; "
                             "start the program with some text (or token_ids)")
        return out, directives

    # -- BaseBackend ---------------------------------------------------------------------------
    def _request(self, text: str, sampling_params: SglSamplingParams, stream: Any = None
                 ) -> tuple[list[int], SamplingParams]:
        """The exact ids of a program text and the engine parameters of a gen (a dtype gen's regex set)."""
        refuse_kept_special_tokens()
        ids, directives = self.request_of(text, stream)
        params = SamplingParams.from_sgl(
            dtype_to_regex(sampling_params), seed=directives.seed,
            logprob_temperatures=directives.logprob_temperatures,
        )
        return ids, params

    def _count(self, out: GenerateOutput) -> None:
        self.token_usage.add(len(out.input_ids), len(out.output_ids))

    def generate(self, s: StreamExecutor, sampling_params: SglSamplingParams, **_: Any):
        refuse_images(s)
        ids, params = self._request(s.text_, sampling_params, s)
        out = self.run(ids, params)
        self._count(out)
        self._remember_generation(s.text_, ids, out, s)
        return out.text, out.meta_info

    def generate_stream(self, s: StreamExecutor, sampling_params: SglSamplingParams) -> Iterator[tuple[str, dict]]:
        """Chunks as an SGLang server streams them (`StreamChunks`); the whole generation at once when the
        backend cannot stream."""
        refuse_images(s)
        text_before = s.text_  # the interpreter appends each chunk to s.text_ while this runs
        ids, params = self._request(text_before, sampling_params, s)
        if not self.streams or params.max_new_tokens == 0:
            out = self.run(ids, params)
            self._count(out)
            self._remember_generation(text_before, ids, out, s)
            yield out.text, out.meta_info
            return
        events: "queue.Queue[RowEvent]" = queue.Queue()
        rid = uuid.uuid4().hex
        self.run_stream(ids, params, rid=rid, listener=lambda evs: [events.put(e) for e in evs if e.rid == rid])
        chunks = StreamChunks(self.tokenizer, params, len(ids))
        pacing = ReaderPacing(s)
        while True:
            event = latest_event(events, events.get())
            if event.error is not None:
                raise EngineError(f"request {rid}: {event.error}") from event.error
            if event.finished:
                if event.output is None:
                    raise EngineError(f"request {rid}: the stream finished without an output")
                self._count(event.output)
                self._remember_generation(text_before, ids, event.output, s)
                pacing.before_last(chunks.text)
                yield chunks.final(event.output)
                return
            if not pacing.may_send(chunks.text):
                continue  # merged into a later chunk: each event holds all tokens so far
            chunk = chunks.update(event)
            if chunk is not None:
                yield chunk

    def select(self, s: StreamExecutor, choices: list[str], temperature: float, choices_method=None):
        """Score every choice appended to the exact prompt ids (prompt log p0) and pick by `choices_method`.  Only
        greedy: SGLang's RuntimeEndpoint asserts temperature <= 1e-5, so a sampled select is refused, not run greedy.
        normalized_prompt_logprobs average the choice's tokens only; 0.5.23's RuntimeEndpoint averages in the last prompt
        token too (its removal of it tests the wrong entry), so on unequal lengths it may pick another choice."""
        refuse_images(s)
        if not temperature <= 1e-5:
            raise ValueError(f"select: temperature {temperature} is not supported: a select is greedy (SGLang's "
                             "RuntimeEndpoint asserts temperature <= 1e-5)")
        choices_method = choices_method or token_length_normalized
        prompt_ids, seed = self.input_ids_of(s.text_, s)
        requests = []
        spans = []
        for c in choices:
            c_ids = self._tokenize(c, at_start=not prompt_ids)
            ids = prompt_ids + c_ids
            start = max(len(prompt_ids) - 1, 0)
            requests.append(
                (ids, SamplingParams(max_new_tokens=0, temperature=0.0, return_logprob=True,
                                     logprob_start_len=start, seed=seed))
            )
            spans.append(len(c_ids))
        outs = self.run_batch(requests)
        for out in outs:
            self._count(out)
        input_token_logprobs = []
        normalized = []
        for out, n in zip(outs, spans):
            entries = [e for e in out.meta_info["input_token_logprobs"] if e[0] is not None][-n:] if n else []
            input_token_logprobs.append(entries)
            normalized.append(float(np.mean([e[0] for e in entries])) if entries else float("-inf"))
        unconditional = None
        if getattr(choices_method, "requires_unconditional_logprobs", False):
            choice_ids = [[int(e[1]) for e in entries] for entries in input_token_logprobs]
            unconditional = self._unconditional_logprobs(choice_ids, seed)
        decision: ChoicesDecision = choices_method(
            choices=choices,
            normalized_prompt_logprobs=normalized,
            input_token_logprobs=input_token_logprobs,
            output_token_logprobs=[[] for _ in choices],
            unconditional_token_logprobs=unconditional,
        )
        return decision

    def _unconditional_logprobs(self, choice_ids: list[list[int]], seed: int | None) -> list[list[Any]]:
        """Each choice's tokens scored alone (SGLang's `unconditional_likelihood_normalized`): its
        input_token_logprobs from position 0, the first entry [None, id, ...] as SGLang's shift gives it."""
        scored = [i for i, ids in enumerate(choice_ids) if ids]
        outs = self.run_batch([(choice_ids[i], SamplingParams(max_new_tokens=0, temperature=0.0, return_logprob=True,
                                                              logprob_start_len=0, seed=seed)) for i in scored])
        result: list[list[Any]] = [[] for _ in choice_ids]
        for i, out in zip(scored, outs):
            self._count(out)
            result[i] = list(out.meta_info["input_token_logprobs"])
        return result
