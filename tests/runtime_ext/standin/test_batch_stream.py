"""A streamed batch on the stand-in server (n > 1 too): each item's cumulative chunks with its "index", interleaved,
as SGLang 0.5.23's tokenizer manager sends them; an abort of the batch's rid ends every unfinished item."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import requests

from forerun.runtime_ext.standin.server import StandInServer


def _events(srv, body, abort_after=None):
    """The chunks of a streamed /generate (the [DONE] line checked), posting `abort_after` = (count, abort body)."""
    chunks, lines = [], []
    with requests.post(srv.url + "/generate", json=body, stream=True, timeout=20) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        for ln in resp.iter_lines():
            if not ln:
                continue
            lines.append(ln)
            if ln != b"data: [DONE]":
                chunks.append(json.loads(ln[len(b"data: "):]))
                if abort_after is not None and len(chunks) == abort_after[0]:
                    requests.post(srv.url + "/abort_request", json=abort_after[1], timeout=5)
    assert lines[-1] == b"data: [DONE]" and lines.count(b"data: [DONE]") == 1
    return chunks


def test_sglang_marks_each_streamed_item_with_its_index():
    spec = importlib.util.find_spec("sglang")
    src = (Path(spec.submodule_search_locations[0]) / "srt" / "managers" / "tokenizer_manager.py").read_text()
    assert 'result["index"] = rid_to_index[result["meta_info"]["id"]]' in src
    assert "async for response in self._stream_batch_responses(generators, rids):" in src


def test_a_streamed_batch_sends_each_items_chunks_with_its_index_ending_as_the_json_answer():
    with StandInServer() as srv:
        prompts = [srv.tokenizer.encode("first"), srv.tokenizer.encode("second one")]
        body = {"input_ids": prompts, "rid": "b", "stream": True, "return_logprob": True,
                "sampling_params": [{"max_new_tokens": 4, "ignore_eos": True, "sampling_seed": 1, "temperature": 0.7},
                                    {"max_new_tokens": 6, "ignore_eos": True, "sampling_seed": 2, "temperature": 0.7}]}
        chunks = _events(srv, body)
        whole = requests.post(srv.url + "/generate", json=dict(body, stream=False, rid="w"), timeout=20).json()
    assert [c["index"] for c in chunks[:2]] == [0, 1]  # interleaved, not one item after the other
    for i, answer in enumerate(whole):
        mine = [c for c in chunks if c["index"] == i]
        assert [len(c["output_ids"]) for c in mine] == list(range(1, len(answer["output_ids"]) + 1))
        assert [c["meta_info"]["finish_reason"] for c in mine[:-1]] == [None] * (len(mine) - 1)
        assert mine[-1]["output_ids"] == answer["output_ids"] and mine[-1]["text"] == answer["text"]
        assert mine[-1]["meta_info"]["finish_reason"] == answer["meta_info"]["finish_reason"]
        assert mine[-1]["meta_info"]["id"] == f"b_{i}"
        assert len(mine[-1]["meta_info"]["output_token_logprobs"]) == len(answer["output_ids"])


def test_parallel_samples_stream_one_index_per_sample():
    with StandInServer() as srv:
        body = {"input_ids": srv.tokenizer.encode("sample me"), "stream": True,
                "sampling_params": {"n": 3, "max_new_tokens": 3, "ignore_eos": True, "temperature": 0.9}}
        chunks = _events(srv, body)
    assert sorted({c["index"] for c in chunks}) == [0, 1, 2]
    assert all(len([c for c in chunks if c["index"] == i]) == 3 for i in range(3))


def test_aborting_the_batchs_rid_ends_every_unfinished_item_once():
    with StandInServer() as srv:
        srv.stream_step_s = 0.02
        prompts = [srv.tokenizer.encode("a"), srv.tokenizer.encode("b"), srv.tokenizer.encode("c")]
        body = {"input_ids": prompts, "rid": "batch", "stream": True,
                "sampling_params": [{"max_new_tokens": 2, "ignore_eos": True},
                                    {"max_new_tokens": 60, "ignore_eos": True},
                                    {"max_new_tokens": 60, "ignore_eos": True}]}
        chunks = _events(srv, body, abort_after=(7, {"rid": "batch"}))
    finish = {i: [c["meta_info"]["finish_reason"] for c in chunks if c["index"] == i] for i in range(3)}
    assert finish[0][-1]["type"] == "length" and len(finish[0]) == 2  # done before the abort: untouched
    for i in (1, 2):
        assert finish[i][-1]["type"] == "abort" and finish[i][:-1] == [None] * (len(finish[i]) - 1)
        assert len(finish[i]) < 60
