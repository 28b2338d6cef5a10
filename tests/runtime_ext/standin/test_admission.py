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
