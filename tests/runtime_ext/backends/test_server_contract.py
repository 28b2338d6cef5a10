"""The contract (issue 9, point 7): every /generate body the client sends validates against SGLang 0.5.23's own
request models, and every response the fake server sends against SGLang's own response model, so neither the
client nor the fake can drift from the real server.

    what the real server does with a /generate body                      checked here with
    FastAPI/pydantic parses it as io_struct.GenerateReqInput (dataclass)  a pydantic model of the dataclass's fields,
                                                                          parsed from the installed io_struct.py
                                                                          (importing it needs zmq and the scheduler);
                                                                          unknown keys refused (stricter: the server
                                                                          would silently ignore a misspelled key)
    http_server.generate_request: api_contract.generate_contract_error    api/v1/api_types.GenerateRequest
    tokenizer_manager: SamplingParams(**sampling_params).verify(vocab),   sglang.srt.sampling.sampling_params
    msgpack IPC to the scheduler (typed decode)                           (imports on CPU), msgspec round trip
    the response                                                          api_types.GenerateResponse / MetaInfo
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import typing
from pathlib import Path

import msgspec
import pydantic
import pytest

from forerun.runtime_ext.backends import sglang_frontend  # noqa: F401  (registers the no-triton stub first)
from forerun.runtime_ext.backends.server import SGLangServerBackend
from forerun.runtime_ext.backends.server_client import ServerConfig
from forerun.runtime_ext.protocol import SamplingParams
from forerun.testing.fake_sglang_server import BOS_ID, VOCAB_SIZE, FakeSGLangServer

SGLANG = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])


class _AnyForUnknown(dict):
    def __missing__(self, key: str) -> typing.Any:
        return typing.Any


def generate_req_input_model() -> type[pydantic.BaseModel]:
    """pydantic model of io_struct.GenerateReqInput's fields, from the installed source (names SGLang defines
    elsewhere, like MultimodalDataInputFormat, become Any; Annotated validators are dropped)."""
    tree = ast.parse((SGLANG / "srt" / "managers" / "io_struct.py").read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GenerateReqInput")
    names = _AnyForUnknown({k: getattr(typing, k) for k in typing.__all__})
    names.update(PlainValidator=lambda fn: None, List=list, Dict=dict, Tuple=tuple, Optional=typing.Optional)
    fields = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            fields[node.target.id] = (eval(ast.unparse(node.annotation), {}, names), None)  # noqa: S307
    assert {"input_ids", "sampling_params", "return_logprob", "logprob_start_len", "session_params", "rid"} <= set(fields)
    return pydantic.create_model("GenerateReqInput", __config__=pydantic.ConfigDict(extra="forbid"), **fields)


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


def check_response(out: typing.Any) -> None:
    api = importlib.import_module("sglang.api.v1.api_types")
    for o in out if isinstance(out, list) else [out]:
        api.GenerateResponse.from_json_value(o)
        api.GenerateMetaInfo.from_json_value(o["meta_info"])


def _exercise(b: SGLangServerBackend, plugin: bool) -> None:
    """Every kind of request the client makes: single, batched, scoring pass, session, priority, seeds, plugin."""
    p = SamplingParams(max_new_tokens=4, temperature=0.7, top_k=20, top_p=0.9, seed=2**63 - 1, ignore_eos=True,
                       return_logprob=True, logprob_start_len=1, top_logprobs_num=2, stop=("x",), stop_token_ids=(5,),
                       logprob_temperatures=(1.0, 0.5) if plugin else ())
    b.run([BOS_ID, 1, 2, 3], p, rid="one")
    b.run_batch([([BOS_ID, 4], p), ([BOS_ID, 5, 6], SamplingParams(max_new_tokens=2, temperature=0.0))])
    b.score([BOS_ID, 7, 8, 9], 2, top_logprobs_num=3)
    b.engine.generate([BOS_ID, 1], SamplingParams(max_new_tokens=1, seed=-5), priority=-1)
    sid = b.open_session(1024)
    b.run([BOS_ID, 1], p, rid="s1", session_params={"id": sid})
    b.run([BOS_ID, 2], p, rid="s2", session_params={"id": sid, "rid": "s1", "offset": -1, "replace": False})


@pytest.mark.parametrize("plugin", [False, True])
def test_every_request_body_and_response_matches_sglangs_models(plugin, monkeypatch):
    model = generate_req_input_model()
    responses = []
    from forerun.testing import fake_http

    real_send = fake_http.Handler._send

    def record(self, status, payload, content_type="application/json"):
        if self.path.startswith("/generate") and status == 200:
            responses.append(payload)
        return real_send(self, status, payload, content_type)

    monkeypatch.setattr(fake_http.Handler, "_send", record)
    with FakeSGLangServer(plugin=plugin) as srv:
        _exercise(SGLangServerBackend(srv.url, srv.tokenizer, config=ServerConfig(batch_mode="batched")), plugin)
        bodies = srv.generate_bodies()
    assert len(bodies) >= (6 if plugin else 9) and len(responses) == len(bodies)
    for body in bodies:
        check_body(body, model)
    for out in responses:
        check_response(out)


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
    ]
    for bad in bad_bodies:
        with pytest.raises(Exception):
            check_body(bad, model)
    with pytest.raises(Exception):
        check_response({"text": "", "output_ids": [1], "meta_info": {"prompt_tokens": "3"}})
