"""The stand-in server's admission (`runtime_ext/standin/admission.py`) against SGLang 0.5.23's own code: what its
tokenizer manager refuses before a request (or any item of a batch) reaches the scheduler."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from forerun.runtime_ext.standin.server import BOS_ID, StandInServer
from forerun.testing.test_modules import sibling

src = sibling(str(Path(__file__).parents[1] / "backends" / "sglang_source.py"), "sglang_source")
TOKENIZER_MANAGER = "srt/managers/tokenizer_manager.py"


@pytest.fixture()
def srv():
    with StandInServer() as s:
        yield s


def _post(srv, body):
    return requests.post(srv.url + "/generate", json=body, timeout=10)


def _sglang_sends_of_a_batch(batch_size: int, refused_item: int) -> list[int]:
    """The items SGLang's own `TokenizerManager._handle_batch_request` sends to its scheduler for a batch of
    `input_ids` (no text, no DP attention, no parallel sampling) whose item `refused_item` its tokenization refuses
    (a ValueError: HTTP 400), run on a stand-in manager that records the sends."""
    names = ("_handle_batch_request", "_should_use_batch_tokenization", "_batch_has_text",
             "_batch_tokenize_and_process")
    namespace = {"get_serving": lambda: SimpleNamespace(enable_tokenizer_batch_encode=False),
                 "get_parallel": lambda: SimpleNamespace(attn_dp_enabled=False), "logger": logging.getLogger("t"),
                 "get_bool_env_var": lambda name: False, "nullcontext": contextlib.nullcontext, "asyncio": asyncio,
                 "input_blocker_guard_region": contextlib.nullcontext}
    manager_cls = type("Manager", (), {
        n: src.compile_function(src.method_def(TOKENIZER_MANAGER, "TokenizerManager", n), namespace, TOKENIZER_MANAGER)
        for n in names})
    sent: list[int] = []

    class Manager(manager_cls):
        is_generation = True
        rid_to_state: dict = {}

        async def _tokenize_one_request(self, obj):
            if obj.index == refused_item:
                raise ValueError("refused")
            return SimpleNamespace(index=obj.index, input_ids=[BOS_ID])

        async def _send_batch_request(self, tokenized):
            sent.extend(t.index for t in tokenized)

        async def _send_one_request(self, tokenized):
            sent.append(tokenized.index)

    items = [SimpleNamespace(index=i, text=None, rid=f"r{i}", return_prompt_token_ids=False,
                             contains_mm_input=lambda: False) for i in range(batch_size)]
    batch = type("Batch", (), {"batch_size": batch_size, "parallel_sample_num": 1,
                               "__getitem__": lambda self, i: items[i]})()
    with pytest.raises(ValueError, match="refused"):
        asyncio.run(Manager()._handle_batch_request(batch, None, {}).__anext__())
    return sent


@pytest.mark.parametrize("bad", [
    {"top_p": 0.0},  # SamplingParams.verify
    {"max_new_tokens": 2, "min_new_tokens": 3},  # SamplingParams.verify
    {"max_new_tokens": 40000},  # _validate_one_request: past the context
    {"stop": ["x"] * 33},  # SamplingParams.normalize: too many stop strings
])
def test_a_batch_with_a_refused_item_runs_none_of_its_items(srv, bad):
    """SGLang tokenizes and checks every item of an input_ids batch before it sends any to its scheduler, so a bad
    item refuses the batch with nothing run; the stand-in ran the items before it (the prefix cache and the
    counters showed them) and then answered 400."""
    assert _sglang_sends_of_a_batch(3, refused_item=2) == []
    good = {"max_new_tokens": 2, "temperature": 0.0}
    prompts = [[BOS_ID, 7, 8, 9], [BOS_ID, 7, 8, 10], [BOS_ID, 7, 8, 11]]
    before = dict(srv.counters)
    r = _post(srv, {"input_ids": prompts, "sampling_params": [good, good, {**good, **bad}]})
    assert r.status_code == 400
    assert srv.counters == before
    again = _post(srv, {"input_ids": prompts[0], "sampling_params": good}).json()
    assert again["meta_info"]["cached_tokens"] == 0  # item 0 never ran: nothing of it in the prefix cache


SAMPLING_PARAMS = "srt/sampling/sampling_params.py"
IO_STRUCT = "srt/managers/io_struct.py"


def _sglang_beam_verdict(beam_width) -> str | int:
    """SGLang's own reading of `beam_width` in a request otherwise valid: its `SamplingParams.verify` message, else
    the request's beam width (`GenerateReqInput._sampling_params_beam_width`: 1 is not a beam request)."""
    verify = src.compile_function(src.method_def(SAMPLING_PARAMS, "SamplingParams", "verify"),
                                  {"math": __import__("math"),
                                   "get_request_reasoning_end_token_ids": lambda *a, **k: None}, SAMPLING_PARAMS)
    params = SimpleNamespace(beam_width=beam_width, temperature=1.0, top_p=1.0, min_p=0.0, top_k=1 << 30,
                             frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0, min_new_tokens=0,
                             max_new_tokens=3, logit_bias=None, sampling_seed=None, custom_params=None,
                             json_schema=None, regex=None, ebnf=None, structural_tag=None)
    try:
        verify(params, 256)
    except ValueError as exc:
        return str(exc)
    width = src.compile_function(src.method_def(IO_STRUCT, "GenerateReqInput", "_sampling_params_beam_width"), {},
                                 IO_STRUCT)
    return width(SimpleNamespace(sampling_params={} if beam_width is None else {"beam_width": beam_width}))


@pytest.mark.parametrize("beam_width", [None, 1, 2, 4, 0, -1])
def test_beam_width_is_refused_where_sglang_would_run_beam_search(srv, beam_width):
    """SGLang runs a request with beam_width > 1 as beam search and refuses beam_width < 1 (SamplingParams.verify);
    the stand-in ignored beam_width and sampled one sequence.  It now refuses a beam search (it has none) and a
    beam_width < 1 with SGLang's message, running nothing; beam_width 1 or none answers as before."""
    plain = {"max_new_tokens": 3, "temperature": 1.0, "sampling_seed": 5}
    sp = plain if beam_width is None else {**plain, "beam_width": beam_width}
    want = _sglang_beam_verdict(beam_width)
    before = dict(srv.counters)
    r = _post(srv, {"input_ids": [BOS_ID, 5], "sampling_params": sp})
    if isinstance(want, str):
        assert r.status_code == 400 and r.json()["error"]["message"] == want
        assert srv.counters == before
    elif want > 1:
        assert r.status_code == 400 and f"beam search (beam_width = {beam_width})" in r.json()["error"]["message"]
        assert srv.counters == before
    else:
        assert r.status_code == 200
        assert r.json()["output_ids"] == _post(srv, {"input_ids": [BOS_ID, 5], "sampling_params": plain}).json()[
            "output_ids"]


def test_a_batch_naming_a_rid_twice_is_refused_with_sglangs_message(srv):
    """SGLang's normalize refuses a rid list with a duplicate (`GenerateReqInput._validate_rid_uniqueness`) before
    anything runs; the stand-in ran both items under the one rid."""
    from collections import Counter

    check = src.compile_function(src.method_def(IO_STRUCT, "GenerateReqInput", "_validate_rid_uniqueness"),
                                 {"Counter": Counter}, IO_STRUCT)
    rids = ["a", "b", "a", "b", "c"]
    with pytest.raises(ValueError) as sglang:
        check(SimpleNamespace(rid=rids))
    before = dict(srv.counters)
    r = _post(srv, {"input_ids": [[BOS_ID, 5]] * 5, "rid": rids, "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 400 and r.json()["error"]["message"] == str(sglang.value)
    assert srv.counters == before
    ok = _post(srv, {"input_ids": [[BOS_ID, 5]] * 2, "rid": ["a", "b"], "sampling_params": {"max_new_tokens": 1}})
    assert ok.status_code == 200 and [o["meta_info"]["id"] for o in ok.json()] == ["a", "b"]
