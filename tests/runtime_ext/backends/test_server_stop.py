"""`gen(stop=...)` and `gen(stop_regex=...)` end to end: an `@sgl.function` program on forerun's server backend
against the stand-in server, and the same program on the embedded engine, both checked against one oracle of
SGLang's semantics - the same seeded tokens as without the stop, up to the first token after which the output
(never the prompt), special tokens spelled out, holds a stop string (text cut before it) or a match of a pattern
(text kept whole: these patterns never occur literally); finish_reason {"type": "stop", "matched": the string or
pattern}.

    guarantee                                                              test
    a program's stop / stop_regex gen gives the oracle's ids, text and     test_program_stops_as_sglang_on_both_backends
      finish_reason on both backends
    the server request carries them in SGLang's fields                    test_the_server_hears_sglangs_fields
    batched server requests stop each on their own stops                  test_batched_server_requests_stop_on_their_own
    a streamed server request: events at SGLang's sends only, the final   test_streamed_server_request_with_a_stop
      output that of the plain request
"""

from __future__ import annotations

import re
import threading

import pytest

from forerun.runtime_ext.backends.embedded import EmbeddedBackend
from forerun.runtime_ext.backends.server import SGLangServerBackend
from forerun.runtime_ext.backends.server_client import ServerConfig
from forerun.runtime_ext.backends.sglang_frontend import function, gen
from forerun.runtime_ext.backends.token_markers import sampling_seed
from forerun.runtime_ext.engine import EmbeddedEngine, EngineConfig
from forerun.runtime_ext.engine.models import load_model
from forerun.runtime_ext.protocol import RowEvent, SamplingParams
from forerun.runtime_ext.standin.server import BOS_ID, EOS_ID, ByteModel, StandInServer

MAX_TOKENS = 40


def readable_model() -> ByteModel:
    """The stand-in's model, writing mostly ASCII (so that stops cut from its text are readable), EOS rarely."""
    m = ByteModel()
    m.table[:, 32:127] += 3.0
    return m


@pytest.fixture(scope="module")
def server():
    with StandInServer(model=readable_model()) as srv:
        yield srv


@pytest.fixture(scope="module", params=["server", "embedded"])
def backend(request):
    if request.param == "server":
        srv = request.getfixturevalue("server")
        yield SGLangServerBackend(srv.url, srv.tokenizer, config=ServerConfig(retries=0))
    else:
        engine = EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=5))
        yield EmbeddedBackend(engine)
        engine.close()


def oracle(tok, ids, stops=(), patterns=()):
    """SGLang 0.5.23's semantics over the unstopped output `ids`: (tokens kept, text, finish_reason) at the first
    token after which the output, decoded with the tokenizer's defaults - special tokens spelled out, as
    schedule_batch.py Req.tail_str decodes it - holds a stop string (checked first) or a pattern match; the text is
    the output decoded with skip_special_tokens, cut before the matched stop string's first occurrence in it
    (detokenizer_manager.py trim_matched_stop; kept whole where it does not occur there)."""
    for k in range(1, len(ids) + 1):
        spelled = tok.decode(list(ids[:k]))
        text = tok.decode(list(ids[:k]), skip_special_tokens=True)
        for stop in stops:
            if stop in spelled:
                return k, text[:text.find(stop)] if stop in text else text, {"type": "stop", "matched": stop}
        for pattern in patterns:
            if re.search(pattern, spelled):
                return k, text, {"type": "stop", "matched": pattern}
    return None


def stops_from(text: str, n: int) -> list[str]:
    """n two-character alphanumeric stop strings cut from `text` at spread-out places (each hits)."""
    words = [text[i:i + 2] for i in range(len(text) - 1) if text[i:i + 2].isalnum() and text[i:i + 2].isascii()]
    return [words[(j * len(words)) // n] for j in range(n)] if words else []


@function
def count(s, seed, stops, pattern):  # not `stop`: run() takes that keyword itself
    s += sampling_seed(seed) + "Count: " + gen("o", max_tokens=MAX_TOKENS, temperature=1.0, stop=stops,
                                               stop_regex=pattern, return_logprob=True)


def _run(backend, seed, stop=None, pattern=None):
    st = count.run(seed=seed, stops=stop, pattern=pattern, backend=backend)
    assert st.error() is None
    meta = st.get_meta_info("o")
    return st["o"], [e[1] for e in meta["output_token_logprobs"]], meta["finish_reason"]


def test_program_stops_as_sglang_on_both_backends(backend):
    tok = backend.tokenizer
    cases = 0
    for seed in (3, 4, 5):
        free_text, free, free_finish = _run(backend, seed)
        # a chat template's stop string ends the free run too (the embedded backend's chatml: "<|im_end|>", matched
        # with special tokens spelled out as on SGLang)
        template_stops = tuple(getattr(getattr(backend, "chat_template", None), "stop_str", None) or ())
        assert (len(free) == MAX_TOKENS or free[-1] in (EOS_ID, tok.eos_token_id)
                or free_finish in [{"type": "stop", "matched": st} for st in template_stops])
        requests = [(stop, None) for stop in stops_from(free_text, 3)]  # one string: gen(stop="ab")
        requests += [(None, pattern) for pattern in (r"[0-9]", r"q.X", r"[#|]")]
        requests += [(stops_from(free_text, 2), [r"[0-9]"])]  # lists of both
        for stop, pattern in requests:
            stops = [stop] if isinstance(stop, str) else stop or []
            patterns = [pattern] if isinstance(pattern, str) else pattern or []
            want = oracle(tok, free, stops, patterns)
            text, ids, finish = _run(backend, seed, stop, pattern)
            if want is None:
                assert (text, ids) == (free_text, free), (stop, pattern)
                continue
            k, want_text, want_finish = want
            assert (ids, text, finish) == (free[:k], want_text, want_finish), (stop, pattern)
            cases += 1
    assert cases >= 10


def test_the_server_hears_sglangs_fields(server):
    backend = SGLangServerBackend(server.url, server.tokenizer, config=ServerConfig(retries=0))
    first = len(server.generate_bodies())
    _run(backend, 3, ["ab", "cd"], [r"[0-9]"])
    _run(backend, 3, "ab")
    sent = [body["sampling_params"] for body in server.generate_bodies()[first:]]
    assert [(sp.get("stop"), sp.get("stop_regex")) for sp in sent] == [(["ab", "cd"], [r"[0-9]"]), (["ab"], None)]


def _free_text_and_ids(client, prompt, seed):
    out = client.generate(prompt, SamplingParams(max_new_tokens=MAX_TOKENS, temperature=1.0, seed=seed,
                                                 ignore_eos=True))
    return out.text, list(out.output_ids)


def test_batched_server_requests_stop_on_their_own(server):
    backend = SGLangServerBackend(server.url, server.tokenizer, config=ServerConfig(retries=0, batch_mode="batched"))
    tok = server.tokenizer
    first = len(server.generate_bodies())
    prompts = [[BOS_ID] + list(f"row {i}: ".encode()) for i in range(3)]
    frees = [_free_text_and_ids(backend.engine, p, seed=10 + i) for i, p in enumerate(prompts)]
    params = [SamplingParams(max_new_tokens=MAX_TOKENS, temperature=1.0, seed=10 + i, ignore_eos=True,
                             stop=tuple(stops_from(text, 1)), stop_regex=(r"[0-9]",) if i == 2 else ())
              for i, (text, _) in enumerate(frees)]
    outs = backend.run_batch(list(zip(prompts, params)))
    assert len(server.generate_bodies()) - first == 3 + 1  # three free runs, then one body for the batch
    for (text, ids), p, out in zip(frees, params, outs):
        k, want_text, want_finish = oracle(tok, ids, p.stop, p.stop_regex)
        assert (list(out.output_ids), out.text, out.meta_info["finish_reason"]) == (ids[:k], want_text, want_finish)


def test_streamed_server_request_with_a_stop(server):
    """SGLang sends no chunk while the output ends with the start of the stop string, so the client's row events
    skip those lengths; the last event's output is the plain request's (text cut before the stop)."""
    client = SGLangServerBackend(server.url, server.tokenizer, config=ServerConfig(retries=0)).engine
    tok = server.tokenizer
    prompt = [BOS_ID] + list(b"Stream: ")
    checked = 0
    for seed in (20, 21, 22, 23):
        text, ids = _free_text_and_ids(client, prompt, seed)
        for stop in stops_from(text, 2):
            p = SamplingParams(max_new_tokens=MAX_TOKENS, temperature=1.0, seed=seed, ignore_eos=True, stop=(stop,),
                               return_logprob=True)
            events: list[RowEvent] = []
            done = threading.Event()

            def listen(batch, events=events, done=done):
                events.extend(batch)
                if any(e.finished for e in batch):
                    done.set()

            client.submit_stream(prompt, p, rid=f"s{seed}-{stop}", listener=listen)
            assert done.wait(20)
            plain = client.generate(prompt, p)
            # SGLang's stop check and its hold-back (check_match_stop_str_prefix) read Req.tail_str: specials spelled
            k = next(k for k in range(1, len(ids) + 1) if stop in tok.decode(ids[:k]))
            held = [t for t in range(1, k) if any(tok.decode(ids[:t]).endswith(stop[:i])
                                                  for i in range(1, len(stop)))]
            assert [len(e.output_ids) for e in events if not e.finished] == [t for t in range(1, k) if t not in held]
            final = events[-1]
            assert final.finished and final.error is None
            assert (final.output.output_ids, final.output.text, final.output.meta_info["finish_reason"]) == (
                plain.output_ids, plain.text, plain.meta_info["finish_reason"])
            assert plain.output_ids == tuple(ids[:k]) and stop not in plain.text
            checked += bool(held)
    assert checked >= 2  # some streams did hold a chunk back
