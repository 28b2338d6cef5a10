"""The stand-in server honours SGLang's regex / json_schema / ebnf constraints: outputs in the language, logprobs
of the masked logits, SGLang's refusals.  Oracles: `re.fullmatch` / `json.loads` on the text, and log-softmax over
the allowed bytes computed here from `ByteModel`'s logits (the allowed sets written out by hand)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import requests

from forerun.runtime_ext.backends import sglang_frontend  # noqa: F401  (registers the no-triton stub first)
from forerun.runtime_ext.backends.server import SGLangServerBackend
from forerun.runtime_ext.backends.sglang_frontend import function, gen, sgl
from forerun.runtime_ext.standin.server import BOS_ID, EOS_ID, StandInServer

DIGITS = list(range(ord("0"), ord("9") + 1))


@pytest.fixture(scope="module")
def srv():
    with StandInServer() as s:
        yield s


def _generate(srv, sp, ids=(BOS_ID, 65), **extra):
    return requests.post(srv.url + "/generate", json={"input_ids": list(ids), "sampling_params": sp, **extra},
                         timeout=30)


@pytest.mark.parametrize("pattern", [r"(yes|no), [0-9]{1,3}!", r"[a-c]{2,5}\.", r"é{1,6}x"])
def test_regex_outputs_are_in_the_language_and_end_on_eos(srv, pattern):
    for seed in range(8):
        out = _generate(srv, {"max_new_tokens": 40, "temperature": 1.5, "sampling_seed": seed, "regex": pattern}).json()
        assert re.fullmatch(pattern, out["text"]), (seed, out["text"])
        assert out["output_ids"][-1] == EOS_ID and out["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS_ID}
    # the same requests without the constraint leave the language: the constraint is what holds them in it
    free = [_generate(srv, {"max_new_tokens": 12, "temperature": 1.5, "sampling_seed": s}).json()["text"] for s in range(8)]
    assert not any(re.fullmatch(pattern, t) for t in free)


def test_json_schema_and_ebnf_outputs_parse(srv):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
              "required": ["n", "ok"], "additionalProperties": False}
    finished = 0
    for seed in range(5):  # any whitespace is allowed (SGLang's default): a length cut may end a document early
        out = _generate(srv, {"max_new_tokens": 400, "temperature": 1.0, "sampling_seed": seed,
                              "json_schema": json.dumps(schema)}).json()
        any_json = _generate(srv, {"max_new_tokens": 400, "temperature": 0.7, "sampling_seed": seed,
                                   "json_schema": "$$ANY$$"}).json()
        for o in (out, any_json):
            if o["meta_info"]["finish_reason"]["type"] == "stop":
                finished += 1
                value = json.loads(o["text"])
                if o is out:
                    assert set(value) == {"n", "ok"} and type(value["n"]) is int and type(value["ok"]) is bool
        ebnf = _generate(srv, {"max_new_tokens": 30, "temperature": 1.5, "sampling_seed": seed,
                               "ebnf": 'root ::= "a" [0-9]+ "b"'}).json()
        assert re.fullmatch(r"a[0-9]+b", ebnf["text"]), ebnf["text"]
    assert finished >= 5


def test_reported_logprobs_are_of_the_masked_logits(srv):
    """SGLang applies the grammar's -inf mask before its sampler: log q_τ, the top-k and the plugin's log p0 are
    all of the masked logits (here the first token must be a digit)."""
    tau, prompt = 0.8, [BOS_ID, 70, 71]
    out = _generate(srv, {"max_new_tokens": 1, "temperature": tau, "sampling_seed": 3, "regex": "[0-9]{3}"}, prompt,
                    return_logprob=True, top_logprobs_num=12).json()
    t = out["output_ids"][0]
    assert t in DIGITS
    z = srv.model.logits(prompt)[DIGITS] / tau
    masked = z - np.logaddexp.reduce(z)
    lq, _, _ = out["meta_info"]["output_token_logprobs"][0]
    assert lq == pytest.approx(masked[DIGITS.index(t)], abs=1e-12)
    top = out["meta_info"]["output_top_logprobs"][0]
    assert sorted(i for _, i, _ in top[:10]) == DIGITS and all(v is None for v, _, _ in top[10:])  # orjson: null


def test_the_json_is_strict_with_minus_inf_as_null_as_orjson_writes_it(srv):
    """SGLang's responses are orjson's: -inf (a masked top-k entry) is null, never the non-JSON -Infinity."""
    def refuse(constant):
        raise AssertionError(f"non-strict JSON constant {constant}")

    resp = _generate(srv, {"max_new_tokens": 2, "temperature": 1.0, "sampling_seed": 3, "regex": "[0-9]{2}"},
                     return_logprob=True, top_logprobs_num=20)
    top = json.loads(resp.content, parse_constant=refuse)["meta_info"]["output_top_logprobs"]
    assert [sum(v is None for v, _, _ in pos) for pos in top] == [10, 10]
    streamed = requests.post(srv.url + "/generate", json={"input_ids": [BOS_ID, 65], "stream": True,
                             "return_logprob": True, "top_logprobs_num": 20, "sampling_params": {
                                 "max_new_tokens": 2, "temperature": 1.0, "sampling_seed": 3, "regex": "[0-9]{2}"}},
                             timeout=30)
    chunks = [json.loads(line[5:], parse_constant=refuse) for line in streamed.text.splitlines()
              if line.startswith("data:") and line.strip() != "data: [DONE]"]
    assert chunks and all(v is None for c in chunks for pos in c["meta_info"]["output_top_logprobs"]
                          for v, _, _ in pos[10:])


def test_a_terminated_grammar_stops_the_request_under_ignore_eos(srv):
    out = _generate(srv, {"max_new_tokens": 20, "temperature": 1.0, "sampling_seed": 1, "regex": "ab",
                          "ignore_eos": True}).json()
    assert out["output_ids"] == [97, 98, EOS_ID]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS_ID}
    short = _generate(srv, {"max_new_tokens": 1, "temperature": 1.0, "sampling_seed": 1, "regex": "ab"}).json()
    assert short["output_ids"] == [97] and short["meta_info"]["finish_reason"] == {"type": "length", "length": 1}


@pytest.mark.parametrize("sp, status, message", [
    ({"regex": "a+", "ebnf": 'root ::= "a"'}, 400, "Only one of json_schema, regex, ebnf, or structural_tag can be set."),
    ({"regex": "(unclosed"}, 400, "Failed to compile regex grammar"),
    ({"json_schema": "{not json"}, 400, "Failed to compile json_schema grammar"),
    ({"structural_tag": "{}"}, 400, "structural_tag"),
    ({"regex": "ab", "min_new_tokens": 3}, 500, "Grammar accept_token failed"),
])
def test_refusals(srv, sp, status, message):
    r = _generate(srv, {"max_new_tokens": 5, **sp})
    assert r.status_code == status and message in r.json()["error"]["message"]
    assert _generate(srv, {"max_new_tokens": 2, "regex": "[0-9]+"}).status_code == 200  # the server goes on


@function
def answer(s):
    s += "Answer: " + gen("a", regex=r"(yes|no)\.", max_tokens=8, temperature=1.5) + "\n"
    s += "Count: " + sgl.gen_int("n", max_tokens=4, temperature=1.5)


def test_an_sgl_program_against_the_stand_in_gets_constrained_outputs():
    with StandInServer() as server:
        backend = SGLangServerBackend(server.url, server.tokenizer)
        for _ in range(4):
            st = answer.run(backend=backend)
            assert st.error() is None
            assert re.fullmatch(r"(yes|no)\.", st["a"]), st["a"]
            assert re.fullmatch(sgl.lang.ir.REGEX_INT, st["n"]), st["n"]
