"""Streaming on an SGLang server (issue 12): the stand-in server streams as SGLang 0.5.23 does, the client turns
the events into rows, and streaming PreSTO over concurrent streamed requests gives the sequential chain."""

from __future__ import annotations

import importlib.util
import json
import threading
from pathlib import Path

import numpy as np
import pytest
import requests

from forerun.programs.sampler_config import PrefetchConfig, SamplerConfig
from forerun.programs.sampler_factory import make_sampler
from forerun.runtime_ext.protocol import SamplingParams, StreamingEngine
from forerun.runtime_ext.runtime import open_runtime
from forerun.runtime_ext.standin.server import ByteModel, StandInServer
from forerun.testing.chains import assert_same_chain


def test_sglangs_own_source_streams_data_lines_and_done():
    """The wire format the stand-in copies, read from SGLang 0.5.23's http_server.py (not imported: it needs the
    GPU runtime)."""
    spec = importlib.util.find_spec("sglang")
    src = (Path(spec.submodule_search_locations[0]) / "srt" / "entrypoints" / "http_server.py").read_text()
    assert 'yield b"data: " + dumps_json(out) + b"\\n\\n"' in src
    assert 'yield b"data: [DONE]\\n\\n"' in src
    assert 'media_type="text/event-stream"' in src


def test_the_fake_server_streams_cumulative_chunks_then_done():
    with StandInServer() as srv:
        ids = srv.tokenizer.encode("hi there")
        body = {"input_ids": ids, "rid": "s1", "stream": True, "return_logprob": True,
                "sampling_params": {"max_new_tokens": 5, "temperature": 0.5, "ignore_eos": True, "sampling_seed": 3}}
        with requests.post(srv.url + "/generate", json=body, stream=True, timeout=10) as resp:
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            lines = [ln.decode() for ln in resp.iter_lines() if ln]
        plain = requests.post(srv.url + "/generate", json=dict(body, stream=False, rid="s2"), timeout=10).json()
    assert all(ln.startswith("data: ") for ln in lines) and lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert [len(c["output_ids"]) for c in chunks] == [1, 2, 3, 4, 5]
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert [len(c["meta_info"]["output_token_logprobs"]) for c in chunks] == [1, 2, 3, 4, 5]
    assert chunks[-1]["output_ids"] == plain["output_ids"]


def test_client_streams_rows_and_a_child_from_the_parents_tokens():
    with StandInServer() as srv, open_runtime(backend_url=srv.url) as runtime:
        client = runtime.engine
        assert isinstance(client, StreamingEngine)
        ids = srv.tokenizer.encode("parent")
        p = SamplingParams(max_new_tokens=8, temperature=0.5, seed=5, ignore_eos=True, return_logprob=True)
        events, done = [], threading.Event()
        child_prompt: list[int] = []

        def listen(batch):
            events.extend(batch)
            for e in batch:
                if e.rid == "parent" and len(e.output_ids) == 3 and not e.finished and not child_prompt:
                    child_prompt.extend(ids + list(e.output_ids))
                    client.submit_stream(child_prompt, SamplingParams(max_new_tokens=4, temperature=0.5, seed=9,
                                                                      ignore_eos=True, return_logprob=True),
                                         rid="child", listener=listen, share_from="parent")
            if {e.rid for e in events if e.finished} == {"parent", "child"}:
                done.set()

        client.submit_stream(ids, p, rid="parent", listener=listen)
        assert done.wait(20)
        final = {e.rid: e for e in events if e.finished}
        assert final["parent"].error is None and final["child"].error is None
        alone = client.generate(ids, p)
        assert final["parent"].output.output_ids == alone.output_ids
        assert list(final["parent"].output.output_logp0) == list(alone.output_logp0)  # the two-pass recipe
        streamed = [b for b in srv.generate_bodies() if b.get("stream")]
        assert [b["input_ids"] for b in streamed] == [ids, child_prompt]
        assert child_prompt[len(ids):] == list(alone.output_ids[:3])


def _aborting_listener(client, rid, events, done):
    """A stream listener that keeps the events, aborts `rid` at its second token and sets `done` when it ends."""
    def listen(batch):
        events.extend(batch)
        if any(len(e.output_ids) == 2 and not e.finished for e in batch):
            client.abort(rid)
        if any(e.finished for e in batch):
            done.set()
    return listen


def test_abort_stops_a_streamed_row():
    with StandInServer() as srv, open_runtime(backend_url=srv.url) as runtime:
        srv.stream_step_s = 0.02
        client = runtime.engine
        events, done = [], threading.Event()
        listen = _aborting_listener(client, "row", events, done)
        client.submit_stream(srv.tokenizer.encode("x"), SamplingParams(max_new_tokens=50, seed=1, ignore_eos=True),
                             rid="row", listener=listen)
        assert done.wait(20)
        last = events[-1]
        assert last.finished and last.aborted and len(last.output_ids) < 50
        assert "row" in srv.aborted_rids


def _sglang_abort_of_a_running_request() -> dict:
    """The finish_reason SGLang 0.5.23 gives a running request that /abort_request names: http_server's route sends
    no message (tokenizer_manager.abort_request -> AbortReq(rid=..., abort_all=...)), so the scheduler sets
    `req.to_finish = FINISH_ABORT()` (Scheduler.abort_request); its to_json, run from the wheel's source."""
    from forerun.testing.test_modules import sibling

    src = sibling(str(Path(__file__).parent / "sglang_source.py"), "sglang_source")
    assert "req = AbortReq(rid=rid, abort_all=abort_all)" in src.SGLANG.joinpath(
        "srt/managers/tokenizer_manager.py").read_text()
    scheduler = src.SGLANG.joinpath("srt/managers/scheduler.py").read_text()
    running = scheduler[scheduler.index("# Abort method 3: set `to_finish`"):]
    assert "else:\n                    req.to_finish = FINISH_ABORT()" in running[:1200]
    finish_abort = src.compile_class("srt/managers/schedule_batch.py", "FINISH_ABORT",
                                     {"BaseFinishReason": type("BaseFinishReason", (), {})})
    return finish_abort().to_json()


def test_an_aborted_stream_ends_with_sglangs_finish_reason():
    """/abort_request on a running stream: its last chunk's finish_reason is FINISH_ABORT()'s ("Aborted", no status),
    then [DONE]; the stand-in wrote the message "Abort request"."""
    with StandInServer() as srv:
        srv.stream_step_s = 0.02
        body = {"input_ids": srv.tokenizer.encode("x"), "rid": "ab", "stream": True,
                "sampling_params": {"max_new_tokens": 60, "ignore_eos": True}}
        chunks = []
        with requests.post(srv.url + "/generate", json=body, stream=True, timeout=10) as resp:
            for ln in resp.iter_lines():
                if not ln or ln == b"data: [DONE]":
                    continue
                chunks.append(json.loads(ln[len(b"data: "):]))
                if len(chunks) == 2:
                    assert requests.post(srv.url + "/abort_request", json={"rid": "ab"}, timeout=5).status_code == 200
    assert len(chunks[-1]["output_ids"]) < 60
    assert [c["meta_info"]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["meta_info"]["finish_reason"] == _sglang_abort_of_a_running_request()


def _sglang_dispatches_an_abort(rid: str, abort_all: bool, in_flight: list[str]) -> bool:
    """Whether SGLang's own `TokenizerManager.abort_request` (from the wheel) sends an abort to its scheduler, with
    `in_flight` the rids of its requests (one tokenizer worker)."""
    from forerun.testing.test_modules import sibling

    src = sibling(str(Path(__file__).parent / "sglang_source.py"), "sglang_source")
    path = "srt/managers/tokenizer_manager.py"
    sent = []
    abort = src.compile_function(src.method_def(path, "TokenizerManager", "abort_request"), {
        "get_serving": lambda: type("S", (), {"tokenizer_worker_num": 1})(), "logger": __import__("logging"),
        "AbortReq": lambda **kw: kw}, path)
    manager = type("M", (), {"enable_metrics": False, "_dispatch_to_scheduler": lambda self, req: sent.append(req)})()
    manager.rid_to_state = {r: type("St", (), {"abort_sent": False})() for r in in_flight}
    abort(manager, rid=rid, abort_all=abort_all)
    return bool(sent)


def _stream_finish(srv, rid, abort_during=None):
    """Stream a 40-token request `rid`; `abort_during` (an /abort_request body) is posted after its second chunk.
    Returns the last chunk's finish_reason and its token count."""
    body = {"input_ids": srv.tokenizer.encode("x"), "rid": rid, "stream": True,
            "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}}
    chunks = []
    with requests.post(srv.url + "/generate", json=body, stream=True, timeout=10) as resp:
        for ln in resp.iter_lines():
            if ln and ln != b"data: [DONE]":
                chunks.append(json.loads(ln[len(b"data: "):]))
                if len(chunks) == 2 and abort_during is not None:
                    requests.post(srv.url + "/abort_request", json=abort_during, timeout=5)
    return chunks[-1]["meta_info"]["finish_reason"], len(chunks[-1]["output_ids"])


def test_abort_request_reaches_only_requests_in_flight():
    """SGLang's tokenizer manager drops an abort for a rid none of its requests in flight has (and an empty one);
    the scheduler aborts the requests in flight whose rid starts with it, or all of them for abort_all.  The
    stand-in kept every rid ever aborted: a later stream reusing it was aborted at its first chunk; abort_all did
    nothing."""
    assert not _sglang_dispatches_an_abort("late", False, in_flight=[])
    assert _sglang_dispatches_an_abort("", True, in_flight=["a"])
    scheduler = Path(importlib.util.find_spec("sglang").submodule_search_locations[0]).joinpath(
        "srt/managers/scheduler.py").read_text()
    assert "if not req.finished() and (\n                recv_req.abort_all or req.rid.startswith(recv_req.rid)" in \
        scheduler
    with StandInServer() as srv:
        srv.stream_step_s = 0.01
        assert requests.post(srv.url + "/abort_request", json={"rid": "late"}, timeout=5).status_code == 200
        assert _stream_finish(srv, "late") == ({"type": "length", "length": 40}, 40)
        finish, n = _stream_finish(srv, "late", abort_during={"rid": "late"})
        assert finish == _sglang_abort_of_a_running_request() and n < 40
        assert _stream_finish(srv, "late") == ({"type": "length", "length": 40}, 40)  # the abort was used up
        finish, n = _stream_finish(srv, "all", abort_during={"abort_all": True})
        assert finish == _sglang_abort_of_a_running_request() and n < 40


def _sglang_stream_sends(n_tokens: int, stream_interval) -> list[int]:
    """The token counts at which SGLang 0.5.23's output streamer sends an unfinished streamed request (no stop
    strings), its `should_output` lines run from the wheel over a request decoding one token per step; the
    finished step always sends."""
    import textwrap
    from types import SimpleNamespace

    from forerun.testing.test_modules import sibling

    src = sibling(str(Path(__file__).parent / "sglang_source.py"), "sglang_source")
    path = "srt/managers/scheduler_components/output_streamer.py"
    lines = src.source_lines(path)
    first = next(i for i, ln in enumerate(lines) if "stream_interval = (" in ln)
    last = next(i for i, ln in enumerate(lines) if "should_output &= not req.check_match_stop_str_prefix()" in ln)
    body = textwrap.dedent("\n".join(lines[first:last + 1]))
    namespace: dict = {}
    exec("def should_output(self, req):\n" + textwrap.indent(body + "\nreturn should_output", "    "), namespace)
    req = SimpleNamespace(sampling_params=SimpleNamespace(stream_interval=stream_interval), send_token_offset=0,
                          check_match_stop_str_prefix=lambda: False)
    streamer = SimpleNamespace(default_stream_interval=1)  # --stream-interval's default
    sends = []
    for t in range(1, n_tokens):
        req.output_ids = list(range(t))
        if namespace["should_output"](streamer, req):
            sends.append(t)
            req.send_token_offset = t
    return sends + [n_tokens]


@pytest.mark.parametrize("stream_interval", [None, 1, 3, 4])
def test_a_stream_sends_at_sglangs_stream_interval(stream_interval):
    """sampling_params.stream_interval k: SGLang sends the first token at once, then a chunk whenever k tokens are
    unsent; the stand-in ignored it and sent every token."""
    sp = {"max_new_tokens": 10, "ignore_eos": True, "temperature": 0.0}
    if stream_interval is not None:
        sp["stream_interval"] = stream_interval
    with StandInServer() as srv:
        srv.stream_step_s = 0.0
        _, _, lines = _raw_stream(srv, {"input_ids": srv.tokenizer.encode("q"), "sampling_params": sp})
    chunks = [json.loads(ln[len("data: "):]) for ln in lines if ln != "data: [DONE]"]
    assert [len(c["output_ids"]) for c in chunks] == _sglang_stream_sends(10, stream_interval)


def test_a_rid_resubmitted_as_its_stream_finishes_can_still_be_aborted():
    """A consumer may start the next stream of a rid from the finished event of the last one (the listener runs
    before that stream's thread ends): the ending thread must not take the new stream's abort event with it, or
    abort(rid) would no longer stop the new stream on the client."""
    with StandInServer() as srv, open_runtime(backend_url=srv.url) as runtime:
        srv.stream_step_s = 0.02
        client = runtime.engine
        events, done = [], threading.Event()
        params = SamplingParams(max_new_tokens=50, seed=1, ignore_eos=True)
        second = _aborting_listener(client, "row", events, done)

        def first(batch):
            if any(e.finished for e in batch):
                client.submit_stream(srv.tokenizer.encode("y"), params, rid="row", listener=second)

        client.submit_stream(srv.tokenizer.encode("x"), SamplingParams(max_new_tokens=1, seed=1, ignore_eos=True),
                             rid="row", listener=first)
        assert done.wait(20)
        last = events[-1]
        assert last.finished and last.aborted and len(last.output_ids) < 50


def test_streaming_presto_on_a_server_gives_the_sequential_chain():
    from forerun.programs.proposals import proposal_model_for

    with StandInServer() as srv, open_runtime(backend_url=srv.url) as runtime:
        ids = srv.tokenizer.encode("stream a chain")
        for seed in range(3):
            cfg = SamplerConfig(kind="power-mh", response_length=12, block_size=6 if seed else 12, steps_per_block=5,
                                seed=seed)
            pm = proposal_model_for(runtime.backend, "power-mh")
            seq = make_sampler(pm, cfg).run(ids)
            res = make_sampler(pm, cfg, presto=True, prefetch=PrefetchConfig(budget=6, streaming=True)).run(ids)
            assert_same_chain(seq, res, seed)
            assert all(c.max_rows <= 6 for c in res.mh_calls)
        streamed = [b["input_ids"] for b in srv.generate_bodies() if b.get("stream")]
        assert streamed and all(s[: len(ids)] == ids for s in streamed)


def test_a_stream_cut_before_its_last_chunk_is_an_error_not_a_short_answer():
    """The server goes away after two cumulative chunks (no finish_reason, no [DONE]): the row finishes with
    an error, never with the two tokens as if the request had completed."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from forerun.runtime_ext.backends.server_client import SGLangServerClient
    from forerun.runtime_ext.standin.server import byte_tokenizer

    class Cut(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # the body ends when the connection closes

        def log_message(self, *args):
            pass

        def do_GET(self):
            body = json.dumps({"model_path": "m"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for k in (1, 2):
                chunk = {"text": "ab"[:k], "output_ids": [97, 98][:k], "meta_info": {"id": "r", "finish_reason": None}}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Cut)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        client = SGLangServerClient(f"http://127.0.0.1:{srv.server_port}", tokenizer=byte_tokenizer())
        events, done = [], threading.Event()

        def listen(batch):
            events.extend(batch)
            if any(e.finished for e in batch):
                done.set()

        client.submit_stream([1, 2, 3], SamplingParams(max_new_tokens=10, temperature=0.0), rid="r", listener=listen)
        assert done.wait(10)
    finally:
        srv.shutdown()
        srv.server_close()
    last = events[-1]
    assert last.finished and last.output is None
    assert "before it finished" in str(last.error)


def test_a_streamed_program_gen_on_the_server_backend_arrives_in_chunks():
    """`.run(stream=True)` on SGLangServerBackend streams the gen as SGLang's RuntimeEndpoint does (one server
    request, several chunks), not the whole text at once; the chunks' text and merged per-token entries are the
    final ones."""
    import asyncio

    from forerun.runtime_ext.backends.server import SGLangServerBackend
    from forerun.runtime_ext.backends.sglang_frontend import sgl

    async def read_chunks(state):
        return [chunk async for chunk in state.text_async_iter("x", return_meta_data=True)]

    @sgl.function
    def prog(s):
        s += "Hello there"
        s += sgl.gen("x", max_tokens=12, temperature=0, return_logprob=True, ignore_eos=True)

    with StandInServer() as srv:
        srv.stream_step_s = 0.05
        backend = SGLangServerBackend(srv.url, tokenizer=srv.tokenizer)
        state = prog.run(stream=True, backend=backend)
        chunks = asyncio.run(read_chunks(state))
        streamed = [body for path, body in srv.requests if path == "/generate" and body.get("stream")]
    assert len(streamed) == 1 and len(chunks) > 1
    assert "".join(text for text, _ in chunks) == state["x"]
    entries = [e for _, meta in chunks for e in meta.get("output_token_logprobs", [])]
    assert entries == state.get_meta_info("x")["output_token_logprobs"] and len(entries) == 12


def test_a_rejected_stream_names_the_servers_reason():
    """A stream the scheduler aborts (its last chunk, status 400) fails with the server's message and status, as a plain
    request does."""
    with StandInServer() as srv, open_runtime(backend_url=srv.url) as rt:
        errors = []
        done = threading.Event()

        def listener(events):
            errors.extend(e.error for e in events if e.error is not None)
            if any(e.finished for e in events):
                done.set()

        ids = srv.tokenizer.encode("hi")
        rt.engine.submit_stream(ids, SamplingParams(max_new_tokens=2, return_logprob=True, logprob_start_len=50),
                                rid="bad", listener=listener)
        assert done.wait(10)
    assert len(errors) == 1 and "is higher than the number of input tokens" in str(errors[0])
    assert errors[0].status == 400


def test_sglangs_own_source_streams_a_refusal_as_an_error_event_and_an_abort_as_a_chunk():
    """The failure wire format the stand-in copies, read from SGLang 0.5.23's source: a streamed request that the
    tokenizer manager refuses (ValueError) is HTTP 200 with one error event, then [DONE]; a scheduler abort is
    raised only for a request that does not stream (a stream gets the aborted output as its last chunk)."""
    root = Path(importlib.util.find_spec("sglang").submodule_search_locations[0]) / "srt"
    server = (root / "entrypoints" / "http_server.py").read_text()
    stream_part = server[server.index("async def stream_results"):server.index("return StreamingResponse(")]
    assert "except ValueError as e:" in stream_part and '"type": "invalid_request_error"' in stream_part
    assert '"code": getattr(e, "status_code", 400)' in stream_part and '"retryable": False' in stream_part
    manager = (root / "managers" / "tokenizer_manager.py").read_text()
    abort = manager[manager.index("async def _handle_abort_finish_reason"):]
    assert "if not is_stream:" in abort[:abort.index("return out")]


def _raw_stream(srv, body):
    with requests.post(srv.url + "/generate", json=dict(body, stream=True), stream=True, timeout=10) as resp:
        return resp.status_code, resp.headers.get("Content-Type", ""), [ln.decode() for ln in resp.iter_lines() if ln]


def test_the_fake_server_streams_a_refused_request_as_sglang_does():
    """min_new_tokens above max_new_tokens (SamplingParams.verify, a ValueError): a plain request is HTTP 400 with
    the message; streamed, HTTP 200, one error event with SGLang's four fields, then [DONE]."""
    body = {"input_ids": [5, 6, 7], "rid": "r1", "sampling_params": {"max_new_tokens": 2, "min_new_tokens": 3}}
    with StandInServer() as srv:
        plain = requests.post(srv.url + "/generate", json=body, timeout=10)
        status, kind, lines = _raw_stream(srv, body)
    assert plain.status_code == 400 and "min_new_tokens must be in" in plain.json()["error"]["message"]
    assert status == 200 and kind.startswith("text/event-stream") and lines[-1] == "data: [DONE]" and len(lines) == 2
    error = json.loads(lines[0][len("data: "):])["error"]
    assert error == {"message": plain.json()["error"]["message"], "type": "invalid_request_error", "code": 400,
                     "retryable": False}


def test_sglang_aborts_before_the_prefill_with_a_one_token_prompt_that_still_samples():
    """What an abort chunk carries, pinned to SGLang 0.5.23's source: `Req.set_finish_with_abort` turns the prompt
    into the one token 0 and switches logprobs off; the prefill result appends its token before
    `update_finish_state` takes the abort; a prefill-only batch's token is a dummy 0 (tp_worker)."""
    import ast

    from forerun.testing.test_modules import sibling

    src = sibling(str(Path(__file__).parent / "sglang_source.py"), "sglang_source")
    batch = "srt/managers/schedule_batch.py"
    abort = ast.unparse(src.method_def(batch, "Req", "set_finish_with_abort"))
    assert "self.origin_input_ids = array('q', [0])" in abort and "self.return_logprob = False" in abort
    prefill = ast.unparse(src.method_def("srt/managers/scheduler_components/batch_result_processor.py",
                                         "SchedulerBatchResultProcessor", "process_batch_result_prefill"))
    assert "req.output_ids.append(next_token_id)\n" in prefill
    assert prefill.index("req.output_ids.append(next_token_id)") < prefill.index("req.update_finish_state()")
    update = ast.unparse(src.method_def(batch, "Req", "update_finish_state"))
    assert "if self.to_finish:\n        self.finished_reason = self.to_finish" in update
    worker = (src.SGLANG / "srt" / "managers" / "tp_worker.py").read_text()
    assert "# For prefill-only requests, create dummy token IDs on CPU" in worker


@pytest.mark.parametrize("max_new_tokens", [2, 0])
def test_the_fake_server_streams_a_scheduler_abort_as_a_last_chunk(max_new_tokens):
    """logprob_start_len past the prompt (the scheduler's set_finish_with_abort, status 400): a plain request is
    HTTP 400; streamed, HTTP 200 and one chunk whose finish_reason is the abort, then [DONE].  That chunk is the
    output of the one-token prefill SGLang still runs (the test above): one token, the greedy pick after [0] (the
    dummy 0 for a prefill-only request), prompt_tokens 1, empty logprob lists; the stand-in sent no token and the
    original prompt length."""
    body = {"input_ids": [5, 6, 7], "rid": "r2", "return_logprob": True, "logprob_start_len": 9,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0}}
    with StandInServer() as srv:
        plain = requests.post(srv.url + "/generate", json=body, timeout=10)
        status, _, lines = _raw_stream(srv, body)
    assert plain.status_code == 400
    assert status == 200 and len(lines) == 2 and lines[-1] == "data: [DONE]"
    last = json.loads(lines[0][len("data: "):])
    stub = int(np.argmax(ByteModel().logits([0]))) if max_new_tokens else 0
    assert last["output_ids"] == [stub] and last["text"] == bytes([stub]).decode("utf-8", errors="replace")
    meta = last["meta_info"]
    assert meta["id"] == "r2" and meta["prompt_tokens"] == 1 and meta["completion_tokens"] == 1
    assert meta["input_token_logprobs"] == meta["output_token_logprobs"] == []
    assert meta["finish_reason"] == {"type": "abort", "message": plain.json()["error"]["message"],
                                     "status_code": 400, "err_type": "BadRequestError"}


def test_the_fake_server_cuts_a_stream_whose_request_crashes_the_handler():
    """An invalid stop_regex raises re.error, not a ValueError: SGLang's stream generator does not catch it, so
    the stream has its 200 headers and no event."""
    with StandInServer() as srv:
        status, _, lines = _raw_stream(srv, {"input_ids": [5, 6], "sampling_params": {"stop_regex": "("}})
    assert status == 200 and lines == []


def test_a_stream_refused_in_an_error_event_fails_with_the_servers_message_and_status():
    """The client reads the error event as the HTTP error a plain request gets: the message and status 400."""
    from forerun.runtime_ext.backends.server_wire import SGLangServerError

    with StandInServer() as srv, open_runtime(backend_url=srv.url) as rt:
        errors, done = [], threading.Event()

        def listener(events):
            errors.extend(e.error for e in events if e.error is not None)
            if any(e.finished for e in events):
                done.set()

        rt.engine.submit_stream([5, 9999], SamplingParams(max_new_tokens=2), rid="oov", listener=listener)
        assert done.wait(10)
    assert len(errors) == 1 and isinstance(errors[0], SGLangServerError)
    assert errors[0].status == 400 and "input_ids contain an id outside" in str(errors[0])
    assert "{'message'" not in str(errors[0])


def test_streamed_gens_nobody_reads_cost_no_wait_on_a_server():
    """`@sgl.function` streamed gens on the server backend that no reader takes: the program finishes about as fast
    as not streamed (SGLang's interpreter never waits for a reader; the backend once waited a second per gen before
    giving up: 2 s for these two gens), with the same text (the same seeds)."""
    import time

    from forerun.runtime_ext.backends.server import SGLangServerBackend
    from forerun.runtime_ext.backends.sglang_frontend import function, gen
    from forerun.runtime_ext.backends.token_markers import sampling_seed

    @function
    def two(s):
        s += sampling_seed(3) + "Once" + gen("a", max_tokens=20, temperature=1.0, ignore_eos=True)
        s += sampling_seed(4) + " then" + gen("b", max_tokens=20, temperature=1.0, ignore_eos=True)

    with StandInServer() as srv:
        backend = SGLangServerBackend(srv.url, tokenizer=srv.tokenizer)
        start = time.monotonic()
        whole = two.run(backend=backend)
        whole.sync()
        plain_s = time.monotonic() - start
        start = time.monotonic()
        st = two.run(backend=backend, stream=True)
        st.sync()
        streamed_s = time.monotonic() - start
    assert st.error() is None and (st["a"], st["b"]) == (whole["a"], whole["b"])
    assert streamed_s < plain_s + 0.8, f"streamed {streamed_s:.2f} s, not streamed {plain_s:.2f} s"
