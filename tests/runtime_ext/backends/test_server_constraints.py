"""The token-exact server backend forwards constraints in SGLang's own request fields (issue 32, point 2):
`sampling_params.regex` / `json_schema` / `ebnf`, a dtype gen as its SGLang regex (with the stock backend's stop
strings), every body checked against SGLang's models like the other bodies (`test_server_contract.check_body`)."""

from __future__ import annotations

import json

import pytest
import requests

from forerun.runtime_ext.backends import sglang_frontend  # noqa: F401  (registers the no-triton stub first)
from forerun.runtime_ext.backends.server import SGLangServerBackend
from forerun.runtime_ext.backends.server_client import ServerConfig
from forerun.runtime_ext.backends.sglang_frontend import function, gen, sgl
from forerun.runtime_ext.protocol import SamplingParams
from forerun.runtime_ext.standin.server import BOS_ID, StandInServer
from forerun.testing.test_modules import sibling



contract = sibling(__file__, "test_server_contract")
IR = sgl.lang.ir
SCHEMA = json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
EBNF = 'root ::= "yes" | "no"'


def test_to_srt_json_carries_sglangs_constraint_fields():
    assert SamplingParams(regex="a+").to_srt_json()["regex"] == "a+"
    assert SamplingParams(json_schema=SCHEMA).to_srt_json()["json_schema"] == SCHEMA
    assert SamplingParams(ebnf=EBNF).to_srt_json()["ebnf"] == EBNF
    plain = SamplingParams().to_srt_json()
    assert not {"regex", "json_schema", "ebnf"} & set(plain)


@function
def typed(s):
    s += "n: " + sgl.gen_int("n", max_tokens=4) + "\n"
    s += "x: " + gen("x", dtype=float, max_tokens=4) + "\n"
    s += "w: " + gen("w", regex="(a|b)+", max_tokens=4) + "\n"
    s += "j: " + gen("j", json_schema=SCHEMA, max_tokens=4)


@pytest.mark.parametrize("batch_mode", ["batched", "concurrent"])
def test_constraints_are_forwarded_in_sglangs_fields(batch_mode):
    model = contract.generate_req_input_model()
    with StandInServer() as srv:
        backend = SGLangServerBackend(srv.url, srv.tokenizer, config=ServerConfig(batch_mode=batch_mode))
        first = len(srv.generate_bodies())
        st = typed.run(backend=backend)
        st.sync()
        assert st.error() is None
        backend.engine.generate([BOS_ID, 1], SamplingParams(max_new_tokens=3, ebnf=EBNF, seed=1))
        backend.run_batch([([BOS_ID, 2], SamplingParams(max_new_tokens=2, regex="[0-9]+", seed=2)),
                           ([BOS_ID, 3], SamplingParams(max_new_tokens=2, json_schema=SCHEMA, seed=3))])
        bodies = srv.generate_bodies()[first:]
    for body in bodies:
        contract.check_body(body, model)
    sps = [sp for body in bodies
           for sp in (body["sampling_params"] if isinstance(body["sampling_params"], list) else [body["sampling_params"]])]
    constraints = [sorted((k, sp[k]) for k in ("regex", "json_schema", "ebnf") if k in sp) for sp in sps]
    assert constraints[:5] == [[("regex", IR.REGEX_INT)], [("regex", IR.REGEX_FLOAT)], [("regex", "(a|b)+")],
                               [("json_schema", SCHEMA)], [("ebnf", EBNF)]]
    assert sorted(constraints[5:]) == [[("json_schema", SCHEMA)], [("regex", "[0-9]+")]]  # concurrent: any order
    assert [" ", "\n"] == sps[0]["stop"][-2:] == sps[1]["stop"][-2:]  # the stock backend's dtype stops


def test_the_contract_check_refuses_two_constraints():
    model = contract.generate_req_input_model()
    good = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1, "regex": "a+"}}
    contract.check_body(good, model)
    with pytest.raises(Exception):
        contract.check_body({**good, "sampling_params": {"max_new_tokens": 1, "regex": "a+", "ebnf": EBNF}}, model)
    with pytest.raises(Exception):
        contract.check_body({**good, "sampling_params": {"max_new_tokens": 1, "regexp": "a+"}}, model)


def test_a_constrained_requests_log_p0_comes_from_the_scoring_pass():
    """SGLang masks the logits before its logprobs: at τ = 1 a constrained request's output logprobs are of the
    masked distribution, so the client scores prompt + output unconstrained for log p0 and says so in meta_info."""
    with StandInServer() as srv:
        backend = SGLangServerBackend(srv.url, srv.tokenizer)
        first = len(srv.generate_bodies())
        free = backend.engine.generate([BOS_ID, 1], SamplingParams(max_new_tokens=3, seed=1, return_logprob=True))
        mid = len(srv.generate_bodies())
        bound = backend.engine.generate([BOS_ID, 1], SamplingParams(max_new_tokens=3, seed=1, return_logprob=True,
                                                                    regex="[0-9]+"))
        bodies = srv.generate_bodies()
    assert mid - first == 1 and free.meta_info["output_token_logprobs_masked"] is False
    scoring = bodies[mid + 1:]
    assert len(scoring) == 1 and scoring[0]["sampling_params"]["max_new_tokens"] == 0
    assert "regex" not in scoring[0]["sampling_params"]  # log p0 of the raw logits
    assert bound.meta_info["output_token_logprobs_masked"] is True and bound.output_logp0 is not None


def test_min_p_and_the_penalties_reach_the_server_and_are_never_ignored():
    """min_p, frequency_penalty and presence_penalty are SglSamplingParams fields: `from_sgl` keeps them and the
    server body carries them (checked against SGLang's models); the stand-in applies min_p and the two penalties
    and refuses the repetition penalty it lacks."""
    from sglang.lang.ir import SglSamplingParams

    p = SamplingParams.from_sgl(SglSamplingParams(min_p=0.9, frequency_penalty=2.0, presence_penalty=-1.0))
    assert (p.min_p, p.frequency_penalty, p.presence_penalty) == (0.9, 2.0, -1.0)
    body = {"input_ids": [1, 2], "sampling_params": p.to_srt_json()}
    assert {k: body["sampling_params"][k] for k in ("min_p", "frequency_penalty", "presence_penalty")} == {
        "min_p": 0.9, "frequency_penalty": 2.0, "presence_penalty": -1.0}
    contract.check_body(body, contract.generate_req_input_model())
    assert not {"min_p", "frequency_penalty", "presence_penalty"} & set(SamplingParams().to_srt_json())
    with StandInServer() as srv:
        backend = SGLangServerBackend(srv.url, srv.tokenizer)
        greedy = backend.engine.generate([BOS_ID, 5], SamplingParams(max_new_tokens=6, temperature=0.0))
        hot = backend.engine.generate([BOS_ID, 5], SamplingParams(max_new_tokens=6, temperature=2.0, min_p=1.0, seed=4))
        assert hot.output_ids == greedy.output_ids
        penalized = backend.engine.generate([BOS_ID, 5], SamplingParams(max_new_tokens=2, frequency_penalty=1.0))
        assert len(penalized.output_ids) == 2  # applied, as SGLang's penalizers (values: test_server.py)
        refused = requests.post(srv.url + "/generate", json={"input_ids": [BOS_ID, 5], "sampling_params": {
            "max_new_tokens": 2, "repetition_penalty": 1.2}}, timeout=30)
        assert refused.status_code == 400 and "does not implement repetition_penalty" in refused.text
