"""The contract (issue 9, point 7; issue 29, point 3): every body the client sends validates against SGLang
0.5.23's own request models, every response the stand-in server sends against SGLang's own response model, and
each behaviour of the real server that the client avoids or the stand-in reproduces is pinned to the line of
SGLang's source that causes it, so neither the client nor the stand-in can drift from the real server.

    what the real server does with a request                             checked here with
    FastAPI/pydantic parses /generate as io_struct.GenerateReqInput       a pydantic model of the dataclass's fields,
    (dataclass); /open_session, /close_session, /abort_request as         parsed from the installed io_struct.py
    msgspec structs (OpenSessionReqInput, CloseSessionReqInput, AbortReq) (importing it needs zmq and the scheduler);
                                                                          unknown keys refused (stricter: the server
                                                                          would silently ignore a misspelled key)
    http_server.generate_request: api_contract.generate_contract_error    api/v1/api_types.GenerateRequest
    tokenizer_manager: SamplingParams(**sampling_params).verify(vocab),   sglang.srt.sampling.sampling_params
    msgpack IPC to the scheduler (typed decode)                           (imports on CPU), msgspec round trip
    tokenizer_manager: SessionParams(**session_params)                    a model of io_struct.SessionParams
    the response                                                          api_types.GenerateResponse / MetaInfo
    the gateway routes a chain by its header                              every request of a keyed client carries it

`PINNED` lists the lines; each behaviour's test below also runs SGLang's own code for it where that code runs
outside the server (the session controller's loop, the scheduler's logprob_start_len rule).
"""

from __future__ import annotations

import importlib
import threading
import typing
from types import SimpleNamespace

import msgspec
import pydantic
import pytest
import requests

from forerun.runtime_ext.backends import sglang_frontend  # noqa: F401  (registers the no-triton stub first)
from forerun.runtime_ext.backends.server import SGLangServerBackend
from forerun.runtime_ext.backends.server_client import ROUTING_KEY_HEADER, ServerConfig, SGLangServerError
from forerun.runtime_ext.protocol import RowEvent, SamplingParams
from forerun.runtime_ext.standin.server import BOS_ID, VOCAB_SIZE, StandInServer
from forerun.testing.test_modules import sibling



src = sibling(__file__, "sglang_source")
IO_STRUCT = "srt/managers/io_struct.py"
SESSIONS = "srt/session/session_controller.py"
SCHEDULER = "srt/managers/scheduler.py"

PINNED = {
    # behaviour: (file under site-packages/sglang, line, the line's text)
    "replace without rid iterates the session's request dict": (SESSIONS, 245,
                                                                 "for _, req_node in self.req_nodes.items():"),
    "... and clears each node while iterating": (SESSIONS, 246, "req_node.clear(self.req_nodes)"),
    "... which deletes the node from that dict": (SESSIONS, 62, "del req_dict[self.req.rid]"),
    "a scheduler exception takes the server down": (SCHEDULER, 6373, "parent_process.send_signal(signal.SIGQUIT)"),
    "logprob_start_len -1 with return_logprob starts at the prompt length":
        (SCHEDULER, 3264, "req.logprob_start_len = len(req.origin_input_ids)"),
    "logprob_start_len beyond the prompt is aborted": (SCHEDULER, 3275,
                                                       "if req.logprob_start_len > len(req.origin_input_ids):"),
    "input logprobs are the extend positions from the start on": (
        "srt/managers/scheduler_components/logprob_result_processor.py", 189,
        "return extend_input_len - extend_logprob_start_len"),
    "an abort defaults to status 400": ("srt/managers/schedule_batch.py", 2224,
                                        "status_code: int = HTTPStatus.BAD_REQUEST,"),
    "a non-streamed abort with status 400 becomes a ValueError": ("srt/managers/tokenizer_manager.py", 1918,
                                                                   'raise ValueError(finish_reason["message"])'),
    "... which the HTTP server answers with 400": ("srt/entrypoints/http_server.py", 2249,
                                                   'status_code=getattr(e, "status_code", HTTPStatus.BAD_REQUEST),'),
    "session_params must be SessionParams' keys": (
        "srt/managers/tokenizer_manager.py", 1573, "SessionParams(**obj.session_params) if obj.session_params else None"),
    "an unseeded request samples with seed 42 under deterministic inference": (
        "srt/sampling/sampling_batch_info.py", 163, "else 42"),
}


def test_the_pinned_lines_are_still_there():
    """A version bump that moves or changes any of these lines fails here: re-derive the behaviour, then re-pin."""
    moved = {what: (path, n, src.line(path, n)) for what, (path, n, text) in PINNED.items()
             if src.line(path, n) != text}
    assert moved == {}


# -- the request and response models ---------------------------------------------------------------------
def generate_req_input_model() -> type[pydantic.BaseModel]:
    """pydantic model of io_struct.GenerateReqInput's fields, from the installed source (names SGLang defines
    elsewhere, like MultimodalDataInputFormat, become Any; Annotated validators are dropped)."""
    model = src.request_model(IO_STRUCT, "GenerateReqInput", all_optional=True)
    assert {"input_ids", "sampling_params", "return_logprob", "logprob_start_len", "session_params",
            "rid"} <= set(model.model_fields)
    return model


ROUTE_MODELS = {"/open_session": "OpenSessionReqInput", "/close_session": "CloseSessionReqInput",
                "/abort_request": "AbortReq"}


def _sampling_params_checks(sp: dict) -> None:
    from sglang.srt.sampling.sampling_params import SamplingParams as SrtSamplingParams

    p = SrtSamplingParams(**sp)  # unknown keys: TypeError, as in tokenizer_manager
    p.verify(VOCAB_SIZE)
    msgspec.msgpack.decode(msgspec.msgpack.encode(p), type=SrtSamplingParams)  # the scheduler's typed IPC decode


def check_body(body: dict, model: type[pydantic.BaseModel]) -> None:
    api = importlib.import_module("sglang.api.v1.api_types")
    model.model_validate(body)
    api.GenerateRequest.from_json_value(body)
    sps = body.get("sampling_params")
    for sp in sps if isinstance(sps, list) else [sps or {}]:
        _sampling_params_checks(sp)
    if body.get("session_params") is not None:  # tokenizer_manager: SessionParams(**session_params)
        src.request_model(IO_STRUCT, "SessionParams").model_validate(body["session_params"])


def check_response(out: typing.Any) -> None:
    api = importlib.import_module("sglang.api.v1.api_types")
    for o in out if isinstance(out, list) else [out]:
        api.GenerateResponse.from_json_value(o)
        api.GenerateMetaInfo.from_json_value(o["meta_info"])


def _stream(b: SGLangServerBackend, ids: list[int], p: SamplingParams, rid: str) -> None:
    done = threading.Event()

    def listener(events: list[RowEvent]) -> None:
        if any(e.finished for e in events):
            done.set()

    b.engine.submit_stream(ids, p, rid=rid, listener=listener)
    assert done.wait(30)


def _exercise(b: SGLangServerBackend, plugin: bool) -> None:
    """Every kind of request the client makes: single, batched, scoring pass, sessions (continue, offset, replace,
    drop), priority, seeds, unseeded (a fresh seed), plugin, streamed, aborted."""
    p = SamplingParams(max_new_tokens=4, temperature=0.7, top_k=20, top_p=0.9, seed=2**63 - 1, ignore_eos=True,
                       return_logprob=True, logprob_start_len=1, top_logprobs_num=2, stop=("x",), stop_token_ids=(5,),
                       logprob_temperatures=(1.0, 0.5) if plugin else ())
    b.run([BOS_ID, 1, 2, 3], p, rid="one")
    b.run_batch([([BOS_ID, 4], p), ([BOS_ID, 5, 6], SamplingParams(max_new_tokens=2, temperature=0.0))])
    b.score([BOS_ID, 7, 8, 9], 2, top_logprobs_num=3)
    b.engine.generate([BOS_ID, 1], SamplingParams(max_new_tokens=1, seed=-5), priority=-1)
    b.engine.generate([BOS_ID, 2], SamplingParams(max_new_tokens=2, return_logprob=True))  # unseeded
    sid = b.open_session(1024)
    b.run([BOS_ID, 1], p, rid="s1", session_params={"id": sid})
    b.run([BOS_ID, 2], p, rid="s2", session_params={"id": sid, "rid": "s1", "offset": -1, "replace": False})
    b.run([BOS_ID, 3], p, rid="s3", session_params={"id": sid, "rid": "s1", "replace": True})
    b.run([BOS_ID, 4], p, rid="s4", session_params={"id": sid, "rid": "s3", "drop_previous_output": True})
    with b.session_params({"id": sid, "rid": "s4"}):
        b.run([BOS_ID, 5], SamplingParams(max_new_tokens=1, seed=1), rid="s5")
    b.close_session(sid)
    _stream(b, [BOS_ID, 6, 7], SamplingParams(max_new_tokens=3, temperature=0.5, seed=3, return_logprob=True,
                                               logprob_temperatures=(0.5,) if plugin else ()), "streamed")
    b.engine.abort("no-such-rid")


@pytest.mark.parametrize("plugin", [False, True])
def test_every_request_body_and_response_matches_sglangs_models_and_carries_the_routing_key(plugin, monkeypatch):
    model = generate_req_input_model()
    responses = []
    from forerun.runtime_ext.standin import routes

    real_send = routes.Handler._send

    def record(self, status, payload, content_type="application/json"):
        if self.path.startswith("/generate") and status == 200:
            responses.append(payload)
        return real_send(self, status, payload, content_type)

    monkeypatch.setattr(routes.Handler, "_send", record)
    with StandInServer(plugin=plugin) as srv:
        backend = SGLangServerBackend(srv.url, srv.tokenizer, config=ServerConfig(batch_mode="batched"))
        first = len(srv.requests)  # /server_info at connect, before any key is set
        _exercise(backend.with_routing_key("chain-7"), plugin)
        sent = srv.requests[first:]
        headers = srv.request_headers[first:]
    routes = {path for path, _ in sent}
    assert {"/generate", "/open_session", "/close_session", "/abort_request"} <= routes
    generate_bodies = [body for path, body in sent if path == "/generate"]
    assert len(generate_bodies) >= (11 if plugin else 15)
    for path, body in sent:
        if path == "/generate":
            check_body(body, model)
        elif path in ROUTE_MODELS:
            src.request_model(IO_STRUCT, ROUTE_MODELS[path]).model_validate(body)
    assert len(responses) == len(generate_bodies) - 1  # the streamed one answers with events
    for out in responses:
        check_response(out)
    assert [path for path, h in headers if h.get(ROUTING_KEY_HEADER) != "chain-7"] == []


def test_the_checks_have_teeth():
    model = generate_req_input_model()
    good = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}}
    check_body(good, model)
    bad_bodies = [
        {**good, "input_idz": [1]},                                           # misspelled field
        {**good, "return_logprob": "yes"},                                    # wrong type
        {**good, "sampling_params": {"max_new_tokens": 1, "seed": 3}},        # not SGLang's name (sampling_seed)
        {**good, "sampling_params": {"max_new_tokens": 1, "sampling_seed": 2**63}},
        {**good, "sampling_params": {"custom_params": {"forerun": {"nested": [1.0]}}}},  # not a CustomParamValue
        {**good, "session_params": {"id": "s", "parent": "r"}},               # not a SessionParams key
    ]
    for bad in bad_bodies:
        with pytest.raises(Exception):
            check_body(bad, model)
    with pytest.raises(pydantic.ValidationError):
        src.request_model(IO_STRUCT, "OpenSessionReqInput").model_validate({"session_id": "s"})  # capacity required
    with pytest.raises(pydantic.ValidationError):
        src.request_model(IO_STRUCT, "AbortReq").model_validate({"rid": "r", "abort": True})
    with pytest.raises(Exception):
        check_response({"text": "", "output_ids": [1], "meta_info": {"prompt_tokens": "3"}})


# -- what real SGLang mishandles: never sent; the stand-in does what SGLang does -----------------------------
def _session_controller_loop() -> typing.Callable:
    """SGLang's own code: SessionReqNode (from session_controller.py) and Session.create_req's replace-without-rid
    loop (lines 245-246) over `self.req_nodes`."""
    node = src.compile_class(SESSIONS, "SessionReqNode", {"FINISH_ABORT": type("FINISH_ABORT", (), {})})
    loop = src.compile_statements(SESSIONS, 245, 246, "self", {})

    def replace_without_rid(rids: list[str]) -> None:
        session = SimpleNamespace(req_nodes={rid: node(SimpleNamespace(rid=rid, finished_reason="done"))
                                             for rid in rids})
        loop(session)

    return replace_without_rid


def test_replace_without_rid_crashes_sglang_so_the_client_refuses_it_and_the_fake_goes_down():
    replace_without_rid = _session_controller_loop()
    replace_without_rid([])  # an empty session: the loop does nothing, the request runs
    with pytest.raises(RuntimeError, match="dictionary changed size during iteration"):
        replace_without_rid(["t1"])  # SGLang's own code crashes on one request already
    with StandInServer() as srv:
        b = SGLangServerBackend(srv.url, srv.tokenizer, config=ServerConfig(retries=0))
        sid = b.open_session(1024)
        p = SamplingParams(max_new_tokens=2, seed=1)
        b.run([BOS_ID, 1], p, rid="t1", session_params={"id": sid})
        sent = len(srv.generate_bodies())
        with pytest.raises(ValueError, match=r"replace=True without rid .*session_controller.py:245"):
            b.run([BOS_ID, 2], p, rid="t2", session_params={"id": sid, "replace": True})
        with pytest.raises(ValueError, match="replace=True without rid"):
            with b.session_params({"id": sid, "replace": True}):
                pass
        with pytest.raises(ValueError, match="SessionParams does not define"):
            b.run([BOS_ID, 2], p, session_params={"id": sid, "rid": "t1", "parent": "t0"})
        assert len(srv.generate_bodies()) == sent  # nothing was sent
        fresh = requests.post(srv.url + "/open_session", json={"capacity_of_str_len": 64}, timeout=5).json()
        body = {"input_ids": [BOS_ID, 3], "sampling_params": {"max_new_tokens": 1}}
        ok = requests.post(srv.url + "/generate", timeout=5,
                           json={**body, "session_params": {"id": fresh, "replace": True}})
        assert ok.status_code == 200  # an empty session: as on SGLang, it runs
        with pytest.raises(requests.exceptions.ConnectionError):  # the scheduler died: no answer
            requests.post(srv.url + "/generate", json={**body, "session_params": {"id": sid, "replace": True}},
                          timeout=5)
        assert "dictionary changed size during iteration" in srv.crashed
        with pytest.raises(SGLangServerError, match="cannot connect"):  # and the server is gone for everyone
            b.run([BOS_ID, 1], p)


def _scheduler_logprob_start(return_logprob: bool, logprob_start_len: int, prompt_len: int, max_new: int) -> int:
    """SGLang's own code: the scheduler's logprob_start_len rule (scheduler.py lines 3256-3273)."""
    block = src.compile_statements(SCHEDULER, 3256, 3273, "recv_req, req", {})
    recv_req = SimpleNamespace(return_logprob=return_logprob, logprob_start_len=logprob_start_len,
                               token_ids_logprob=None)
    req = SimpleNamespace(origin_input_ids=list(range(prompt_len)), is_prefill_only=max_new == 0,
                          logprob_start_len=None)
    block(recv_req, req)
    return req.logprob_start_len


def _input_logprobs_returned(start: int, prompt_len: int) -> int:
    """SGLang's own code: how many input logprobs one prefill returns for that start (no cached prefix)."""
    batch = "srt/managers/schedule_batch.py"
    extend = src.compile_function(src.function_def(batch, "compute_extend_logprob_start_len"), {}, batch)
    extend_start = extend(logprob_start_len=start, prefix_len=0, extend_len=prompt_len,
                          full_untruncated_fill_len=prompt_len)
    return prompt_len - extend_start  # logprob_result_processor.py:189


@pytest.mark.parametrize("max_new", [0, 3])
def test_logprob_start_len_minus_one_returns_no_input_logprobs_as_sglang(max_new):
    n = 4
    start = _scheduler_logprob_start(True, -1, n, max_new)
    assert start == n and _input_logprobs_returned(start, n) == 0  # SGLang: none
    assert _input_logprobs_returned(_scheduler_logprob_start(True, 1, n, max_new), n) == n - 1
    with StandInServer() as srv:
        b = SGLangServerBackend(srv.url, srv.tokenizer)
        p = SamplingParams(max_new_tokens=max_new, temperature=1.0, return_logprob=True, top_logprobs_num=2)
        out = b.run([BOS_ID, 1, 2, 3], p)
        assert out.meta_info["input_token_logprobs"] == [] and out.input_logp0 == ()
        body = {"input_ids": [BOS_ID, 1, 2, 3], "sampling_params": {"max_new_tokens": max_new},
                "return_logprob": True}
        for s in (1, 3):
            meta = requests.post(srv.url + "/generate", json={**body, "logprob_start_len": s}, timeout=5).json()
            assert len(meta["meta_info"]["input_token_logprobs"]) == _input_logprobs_returned(s, n)
        too_far = requests.post(srv.url + "/generate", json={**body, "logprob_start_len": n + 1}, timeout=5)
        assert too_far.status_code == 400 and "Please use a smaller logprob_start_len" in too_far.text


def test_a_session_abort_is_an_http_400_with_sglangs_message():
    with StandInServer() as srv:
        sid = requests.post(srv.url + "/open_session", json={"capacity_of_str_len": 64}, timeout=5).json()
        r = requests.post(srv.url + "/generate", timeout=5, json={
            "input_ids": [BOS_ID, 1], "sampling_params": {"max_new_tokens": 1}, "session_params": {"id": sid,
                                                                                                   "rid": "nope"}})
        assert r.status_code == 400 and r.json() == {"error": {"message": "Invalid request session id"}}
        r = requests.post(srv.url + "/generate", timeout=5, json={
            "input_ids": [BOS_ID, 1], "sampling_params": {"max_new_tokens": 1}, "session_params": {"id": "gone"}})
        assert r.status_code == 400 and "session id gone does not exist" in r.text


def test_unseeded_requests_get_fresh_seeds_which_are_recorded():
    """SGLang samples an unseeded request with seed 42 under deterministic inference (the stand-in too), so the
    client sends each one a fresh seed and records it; replaying that seed replays the tokens."""
    prompt = [BOS_ID, 9, 9]
    with StandInServer(deterministic=True) as srv:
        raw = [requests.post(srv.url + "/generate", timeout=5, json={
            "input_ids": prompt, "sampling_params": {"max_new_tokens": 12, "ignore_eos": True}}).json()["output_ids"]
            for _ in range(2)]
        assert raw[0] == raw[1]  # the server's default seed: every unseeded request draws the same tokens
        b = SGLangServerBackend(srv.url, srv.tokenizer)
        p = SamplingParams(max_new_tokens=12, temperature=1.0, ignore_eos=True)
        outs = [b.run(prompt, p) for _ in range(3)]
        sent = [body["sampling_params"]["sampling_seed"] for body in srv.generate_bodies()[2:]]
        assert [o.meta_info["sampling_seed"] for o in outs] == sent and len(set(sent)) == 3
        assert len({o.output_ids for o in outs}) == 3  # fresh noise each time
        again = b.run(prompt, SamplingParams(max_new_tokens=12, temperature=1.0, ignore_eos=True, seed=sent[1]))
        assert again.output_ids == outs[1].output_ids and again.meta_info["sampling_seed"] == sent[1]
    with StandInServer(deterministic=False) as srv:  # the server ignores seeds: none is sent, none recorded
        out = SGLangServerBackend(srv.url, srv.tokenizer).run(prompt, p)
        assert "sampling_seed" not in srv.generate_bodies()[0]["sampling_params"]
        assert out.meta_info["sampling_seed"] is None


@pytest.mark.parametrize("rid", ["x", ["a", "b"], ["a"], ["a", "b", "c"]])
def test_a_batchs_rids_are_normalised_as_sglangs_own_normalize_rid_does(rid):
    """SGLang's `GenerateReqInput._normalize_rid`, run on a stand-in object: one string becomes rid_i, a list of
    another length than the batch is a ValueError (HTTP 400).  The stand-in answered x-0 / crashed the handler."""
    normalize = src.compile_function(src.method_def(IO_STRUCT, "GenerateReqInput", "_normalize_rid"),
                                     {"uuid": __import__("uuid")}, IO_STRUCT)
    obj = SimpleNamespace(rid=list(rid) if isinstance(rid, list) else rid, batch_size=2)
    try:
        normalize(obj, 2)
        want: typing.Any = obj.rid
    except ValueError as exc:
        want = (400, str(exc))
    with StandInServer() as srv:
        body = {"input_ids": [[BOS_ID, 5], [BOS_ID, 6]], "rid": rid, "sampling_params": {"max_new_tokens": 1}}
        resp = requests.post(srv.url + "/generate", json=body, timeout=10)
    got = [o["meta_info"]["id"] for o in resp.json()] if resp.ok else (resp.status_code, resp.json()["error"]["message"])
    assert got == want


def sglang_refusal(temperature, top_k, top_p, min_p):
    """SGLang's own __post_init__ normalisation (a greedy temperature: top_k 1; top_k -1: all) and `verify`, compiled
    from its source and run on a stand-in object: None when SGLang accepts the parameters, else its message."""
    path = "srt/sampling/sampling_params.py"
    assert src.line(path, 245) == "if 0 <= self.temperature < _SAMPLING_EPS:"
    normalise = src.compile_statements(path, 245, 250, "self", {"_SAMPLING_EPS": 1e-6, "TOP_K_ALL": 1 << 30})
    verify = src.compile_function(src.method_def(path, "SamplingParams", "verify"), {
        "math": __import__("math"), "get_request_reasoning_end_token_ids": lambda *a, **k: None}, path)
    sp = SimpleNamespace(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, beam_width=None,
                         frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0, min_new_tokens=0,
                         max_new_tokens=1, logit_bias=None, sampling_seed=None, custom_params=None,
                         json_schema=None, regex=None, ebnf=None, structural_tag=None)
    normalise(sp)
    try:
        verify(sp, VOCAB_SIZE)
    except ValueError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("temperature, top_k, top_p, min_p", [
    (1.0, 0, 1.0, 0.0), (1.0, -5, 1.0, 0.0), (1.0, -1, 1.0, 0.0), (0.0, 0, 1.0, 0.0), (0.7, 5, 0.0, 0.0),
    (0.7, 5, 1.5, 0.0), (0.7, 5, 0.9, 0.2), (0.7, 5, 0.9, 1.2), (-1.0, -1, 1.0, 0.0), (1e-7, -3, 1.0, 0.0)])
def test_sampling_params_are_verified_as_sglangs_own_verify_does(temperature, top_k, top_p, min_p):
    """SGLang's __post_init__ normalisation (greedy temperature: top_k 1; top_k -1: all) and its `verify`, run on
    a stand-in object, decide 200 or 400 and the message; the stand-in accepted top_k 0 and top_p 0 or 1.5."""
    refusal = sglang_refusal(temperature, top_k, top_p, min_p)
    want: typing.Any = 200 if refusal is None else (400, refusal)
    with StandInServer() as srv:
        body = {"input_ids": [BOS_ID, 5], "sampling_params": {"max_new_tokens": 1, "temperature": temperature,
                                                              "top_k": top_k, "top_p": top_p, "min_p": min_p}}
        resp = requests.post(srv.url + "/generate", json=body, timeout=10)
    assert (200 if resp.ok else (resp.status_code, resp.json()["error"]["message"])) == want


@pytest.mark.parametrize("body", [
    {"input_ids": [BOS_ID, 5], "sampling_params": [1]},
    {"input_ids": [BOS_ID, 5], "sampling_params": {"temperature": "hot"}},
    {"input_ids": [BOS_ID, 5], "return_logprob": True, "top_logprobs_num": "a"},
    {"input_ids": [BOS_ID, 5], "sampling_params": {"stop": 5}},
    {"input_ids": [True, 5]}])
def test_a_body_of_the_wrong_json_types_is_answered_400_with_sglangs_contract_text(body):
    """http_server.generate_request refuses what api_contract's schema decoder rejects (400, its text); the stand-in
    dropped the connection unanswered on these (the client then retried them as a transient failure)."""
    assert src.line("srt/entrypoints/http_server.py", 939) == \
        'return ORJSONResponse(status_code=400, content={"error": contract_error})'
    api = importlib.import_module("sglang.api.v1.api_types")
    with pytest.raises(api.JsonContractError) as refused:
        api.GenerateRequest.from_json_value(body)
    with StandInServer() as srv:
        resp = requests.post(srv.url + "/generate", json=body, timeout=10)
    assert (resp.status_code, resp.json()) == (400, {"error": str(refused.value)})


@pytest.mark.parametrize("low_first", [False, True])
def test_under_priority_scheduling_a_background_request_queues_behind_a_normal_one(low_first):
    """SGLang's own `_set_or_validate_priority` and `_sort_by_priority_and_fcfs`, run on the bodies the client sent:
    the normal request (arrived second) is scheduled before the background one (priority -1).  The client used to
    send no priority for a normal request, which SGLang ranks last (-2**63), behind every pre-position."""
    from forerun.runtime_ext.backends.server_client import SGLangServerClient

    set_priority = src.compile_function(src.method_def(SCHEDULER, "Scheduler", "_set_or_validate_priority"),
                                        {"sys": __import__("sys")}, SCHEDULER)
    policy = "srt/managers/schedule_policy.py"
    sort = src.compile_function(src.method_def(policy, "SchedulePolicy", "_sort_by_priority_and_fcfs"), {}, policy)
    with StandInServer() as srv:
        info = srv.server_info
        srv.server_info = lambda: dict(info(), enable_priority_scheduling=True,
                                       schedule_low_priority_values_first=low_first)
        client = SGLangServerClient(srv.url, tokenizer=srv.tokenizer)
        client.generate([BOS_ID, 1], SamplingParams(max_new_tokens=1), priority=-1)  # a pre-position
        client.generate([BOS_ID, 2], SamplingParams(max_new_tokens=1))  # a user request
        bodies = srv.generate_bodies()
    sched = SimpleNamespace(enable_priority_scheduling=True, schedule_low_priority_values_first=low_first,
                            abort_on_priority_when_disabled=False)
    queue = [SimpleNamespace(priority=b.get("priority"), ids=b["input_ids"],
                             time_stats=SimpleNamespace(wait_queue_entry_time=t)) for t, b in enumerate(bodies)]
    assert all(set_priority(sched, r) for r in queue)
    sort(queue, 1 if low_first else -1)
    assert [r.ids for r in queue] == [[BOS_ID, 2], [BOS_ID, 1]]


def test_closing_an_unknown_or_closed_session_answers_200_as_sglang_does():
    """http_server.close_session answers 200 once tokenizer_manager has sent the close to the scheduler, which only
    logs a warning for an id it does not know; the stand-in answered 400 (a second close raised in the client)."""
    http = src.source_lines("srt/entrypoints/http_server.py")
    at = http.index("        await _global_state.tokenizer_manager.close_session(obj, request)")
    assert http[at + 1].strip() == "return Response(status_code=200)"
    assert "does not exist, cannot delete" in src.line(SESSIONS, 410) and "logger.warning" in src.line(SESSIONS, 410)
    with StandInServer() as srv:
        backend = SGLangServerBackend(srv.url)
        sid = backend.engine.open_session(64)
        backend.engine.close_session(sid)
        backend.engine.close_session(sid)  # already closed: no error
        resp = requests.post(srv.url + "/close_session", json={"session_id": "never-opened"}, timeout=10)
    assert resp.status_code == 200


@pytest.mark.parametrize("temperature, top_k", [(0.0, 0), (1e-7, -3), (0.7, 0), (0.7, -3), (0.0, 5), (0.7, 5)])
def test_forerun_accepts_the_top_k_sglang_accepts(temperature, top_k):
    """SGLang's __post_init__ makes a greedy request's top_k 1 before its `verify` (run here from SGLang's source, as
    above), so a greedy gen with top_k 0 runs there; forerun's SamplingParams refused it for every temperature."""
    sglang_accepts = sglang_refusal(temperature, top_k, 1.0, 0.0) is None
    try:
        SamplingParams(max_new_tokens=1, temperature=temperature, top_k=top_k)
        forerun_accepts = True
    except ValueError:
        forerun_accepts = False
    assert forerun_accepts == sglang_accepts
