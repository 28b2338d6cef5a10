"""The stand-in server's admission (`runtime_ext/standin/admission.py`) against SGLang 0.5.23's own code: what its
tokenizer manager refuses before a request (or any item of a batch) reaches the scheduler."""

from __future__ import annotations

import ast
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


def sglang_manager_methods(names: tuple[str, ...]) -> type:
    """A class holding SGLang's own `TokenizerManager` methods `names`, compiled from the installed source with
    their module globals replaced (no serving/parallel config, no DP attention, no input blocker)."""
    namespace = {"get_serving": lambda: SimpleNamespace(enable_tokenizer_batch_encode=False),
                 "get_parallel": lambda: SimpleNamespace(attn_dp_enabled=False), "logger": logging.getLogger("t"),
                 "get_bool_env_var": lambda name: False, "nullcontext": contextlib.nullcontext, "asyncio": asyncio,
                 "input_blocker_guard_region": contextlib.nullcontext}
    return type("Manager", (), {
        n: src.compile_function(src.method_def(TOKENIZER_MANAGER, "TokenizerManager", n), namespace, TOKENIZER_MANAGER)
        for n in names})


def _sglang_sends_of_a_batch(batch_size: int, refused_item: int) -> list[int]:
    """The items SGLang's own `TokenizerManager._handle_batch_request` sends to its scheduler for a batch of
    `input_ids` (no text, no DP attention, no parallel sampling) whose item `refused_item` its tokenization refuses
    (a ValueError: HTTP 400), run on a stand-in manager that records the sends."""
    names = ("_handle_batch_request", "_should_use_batch_tokenization", "_batch_has_text",
             "_batch_tokenize_and_process")
    manager_cls = sglang_manager_methods(names)
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


class _Item:
    """One item of a batch as `GenerateReqInput.__getitem__` gives it, with what `_handle_batch_request` touches."""

    def __init__(self, index: int, rid: str) -> None:
        self.index, self.rid, self.text = index, rid, None
        self.lora_path = self.lora_id = None
        self.return_prompt_token_ids = False

    def regenerate_rid(self) -> str:
        import uuid

        self.rid = uuid.uuid4().hex
        return self.rid


def _sglang_parallel_sampling_run(batch_size: int, n: int) -> tuple[list[tuple[int, int | None, str]], list[dict]]:
    """What SGLang's own `TokenizerManager._handle_batch_request` sends to its scheduler for a batch of `batch_size`
    prompts with parallel_sample_num `n` > 1 - (prompt index, max_new_tokens it sets or None, rid) per send - and the
    order of the outputs it answers with, run on a stand-in manager that records the sends."""
    import copy

    names = ("_handle_batch_request", "_collect_batch_responses")
    namespace = {"logger": logging.getLogger("t"), "copy": copy, "asyncio": asyncio}
    manager_cls = type("Manager", (), {
        n_: src.compile_function(src.method_def(TOKENIZER_MANAGER, "TokenizerManager", n_), namespace,
                                 TOKENIZER_MANAGER)
        for n_ in names})
    sent: list[tuple[int, int | None, str]] = []

    def state():
        return SimpleNamespace(time_stats=SimpleNamespace(set_finished_time=lambda: None), lora_released=False)

    class Manager(manager_cls):
        def __init__(self):
            self.rid_to_state = {}

        def _init_req_state(self, obj):
            self.rid_to_state[obj.rid] = state()

        async def _tokenize_one_request(self, obj):
            return SimpleNamespace(index=obj.index, input_ids=[BOS_ID], rid=obj.rid, stream=False,
                                   sampling_params=SimpleNamespace(max_new_tokens=None))

        async def _send_one_request(self, tokenized):
            sent.append((tokenized.index, tokenized.sampling_params.max_new_tokens, tokenized.rid))

        async def _wait_one_response(self, obj, request):
            yield {"index": obj.index, "rid": obj.rid}

    items = [_Item(i, f"r{i}") for i in range(batch_size)]
    batch = type("Batch", (), {"batch_size": batch_size, "parallel_sample_num": n, "stream": False,
                               "rid": [it.rid for it in items], "__getitem__": lambda self, i: items[i]})()
    manager = Manager()
    request_states = {it.rid: state() for it in items}
    manager.rid_to_state.update(request_states)
    outputs = asyncio.run(manager._handle_batch_request(batch, None, request_states).__anext__())
    return sent, outputs


@pytest.mark.parametrize("batch_size, n", [(1, 3), (2, 2)])
def test_parallel_sampling_runs_as_sglangs_batch_path_does(srv, batch_size, n):
    """SGLang answers sampling_params.n > 1 (a single request becomes a batch of one, `_handle_parallel_sampling`):
    per prompt a prefill-only warm-up, then n samples, each a request of its own with a fresh rid; the answer lists
    the samples prompt by prompt.  The stand-in refused n > 1 with HTTP 400.  On a deterministic server the n
    samples share the request's sampling_seed, so each is the plain request's output."""
    sent, outputs = _sglang_parallel_sampling_run(batch_size, n)
    warmups = [(i, 0) for i in range(batch_size)]
    assert [(i, m) for i, m, _ in sent if m == 0] == warmups
    assert [i for i, m, _ in sent if m is None] == [i for i in range(batch_size) for _ in range(n)]
    assert len({rid for _, _, rid in sent}) == len(sent) and not {f"r{i}" for i in range(batch_size)} & {
        rid for _, _, rid in sent}  # every send has a fresh rid
    assert [o["index"] for o in outputs] == [i for i in range(batch_size) for _ in range(n)]

    sp = {"max_new_tokens": 3, "temperature": 1.0, "sampling_seed": 7}
    prompts = [[BOS_ID, 20 + i, 30] for i in range(batch_size)]
    plain = [_post(srv, {"input_ids": p, "sampling_params": sp}).json()["output_ids"] for p in prompts]
    srv.cache.clear()
    before = dict(srv.counters)
    ids = prompts[0] if batch_size == 1 else prompts
    r = _post(srv, {"input_ids": ids, "rid": "given" if batch_size == 1 else None, "sampling_params": {**sp, "n": n}})
    assert r.status_code == 200
    out = r.json()
    assert [o["output_ids"] for o in out] == [plain[o["index"]] for o in outputs]
    assert len({o["meta_info"]["id"] for o in out}) == len(out) and all(o["meta_info"]["id"] != "given" for o in out)
    assert all(o["meta_info"]["cached_tokens"] == len(prompts[0]) - 1 for o in out)  # the warm-up's prefix
    assert srv.counters["num_requests_total"] - before["num_requests_total"] == len(sent)


def test_parallel_sampling_refusals_are_sglangs():
    """n that differs between the items of a batch is refused by `_handle_parallel_sampling` (its message), per-item
    logprob lists with n > 1 by `_normalize_logprob_params`; n < 1 in a batch fails later, indexing an empty
    expansion (HTTP 500)."""
    io_struct = "srt/managers/io_struct.py"
    handle = src.compile_function(src.method_def(io_struct, "GenerateReqInput", "_handle_parallel_sampling"), {},
                                  io_struct)
    width = src.compile_function(src.method_def(io_struct, "GenerateReqInput", "_sampling_params_beam_width"), {},
                                 io_struct)
    beam = src.compile_function(src.method_def(io_struct, "GenerateReqInput", "_handle_beam_search_parallel_sampling"),
                                {}, io_struct)
    req = type("Req", (), {"_handle_parallel_sampling": handle, "_sampling_params_beam_width": width,
                           "_handle_beam_search_parallel_sampling": beam})()
    req.sampling_params, req.is_single = [{"n": 2}, {"n": 3}], False
    with pytest.raises(ValueError) as mixed:
        req._handle_parallel_sampling()
    logprobs = src.compile_function(src.method_def(io_struct, "GenerateReqInput", "_normalize_logprob_params"),
                                    {"copy": __import__("copy")}, io_struct)
    lists = SimpleNamespace(parallel_sample_num=2, return_logprob=[True, True], logprob_start_len=None,
                            top_logprobs_num=None, return_sampling_mask=None, sampling_logprobs_mode=None,
                            token_ids_logprob=None)
    with pytest.raises(ValueError) as listed:
        logprobs(lists, 4)
    with StandInServer() as srv:
        two = [[BOS_ID, 5], [BOS_ID, 6]]
        r = _post(srv, {"input_ids": two, "sampling_params": [{"n": 2}, {"n": 3}]})
        assert r.status_code == 400 and r.json()["error"]["message"] == str(mixed.value)
        r = _post(srv, {"input_ids": two, "return_logprob": [True, True], "sampling_params": {"n": 2}})
        assert r.status_code == 400 and r.json()["error"]["message"] == str(listed.value)
        assert _post(srv, {"input_ids": two, "sampling_params": {"n": 0}}).status_code == 500
        assert srv.counters["num_requests_total"] == 0


VERIFY_CASES = [
    {"temperature": -1}, {"top_p": 0}, {"top_p": 1.5}, {"min_p": -0.1}, {"min_p": 2}, {"top_k": 0}, {"top_k": -2},
    {"frequency_penalty": 3}, {"presence_penalty": -3}, {"frequency_penalty": 2.5, "presence_penalty": 9},
    {"repetition_penalty": 0}, {"repetition_penalty": 3}, {"min_new_tokens": -1}, {"max_new_tokens": -1},
    {"min_new_tokens": 5, "max_new_tokens": 2}, {"min_new_tokens": -1, "max_new_tokens": -1},
    {"logit_bias": {"300": 1.0}}, {"sampling_seed": 2**64}, {"regex": "a", "json_schema": "{}"},
    {"temperature": -1, "top_p": 0}, {"temperature": 0, "top_k": 0}, {"beam_width": 0, "top_p": 0},
    {"stop": ["x"] * 33, "temperature": -1},
    {"top_k": -1}, {"frequency_penalty": 1.0, "presence_penalty": -2}, {"temperature": 0.0}, {"min_p": 1},
]


@pytest.mark.parametrize("sp", VERIFY_CASES)
def test_bad_sampling_params_are_refused_with_sglangs_message(srv, sp):
    """Every sampling_params SGLang's own `SamplingParams` (normalize, then verify: tokenizer_manager
    `_create_tokenized_object`) refuses is HTTP 400 with its message, and what it accepts runs.  The stand-in ran
    frequency / presence penalties outside [-2, 2], ignored logit_bias keys outside the vocabulary, wrote the values
    converted ("got 3.0" for 3), named a negative max_new_tokens before a negative min_new_tokens, and gave
    repetition_penalty 3 its own "does not implement" message."""
    import forerun.runtime_ext.backends.sglang_frontend  # noqa: F401  (sglang imports without its GPU runtime)
    from forerun.runtime_ext.standin.server import VOCAB_SIZE, byte_tokenizer
    from sglang.srt.sampling.sampling_params import SamplingParams

    sp = {"max_new_tokens": 4, **sp}
    try:
        params = SamplingParams(**sp)
        params.normalize(byte_tokenizer())
        params.verify(VOCAB_SIZE)
        want = None
    except ValueError as exc:
        want = str(exc)
    before = dict(srv.counters)
    r = _post(srv, {"input_ids": [BOS_ID, 5], "sampling_params": sp})
    if want is None:
        assert r.status_code == 200
    else:
        assert (r.status_code, r.json()["error"]["message"]) == (400, want)
        assert srv.counters == before


def _sglang_batch_with_a_scheduler_abort(batch_size: int, aborted: int) -> tuple[list[int], str]:
    """SGLang's own `_handle_batch_request` and `_collect_batch_responses` (an input_ids batch that passes
    tokenization) when its scheduler aborts item `aborted` with status 400 (`_handle_abort_finish_reason` raises
    the message as a ValueError for a request that does not stream): the items sent, and what the batch raises."""
    names = ("_handle_batch_request", "_should_use_batch_tokenization", "_batch_has_text",
             "_batch_tokenize_and_process", "_collect_batch_responses")
    manager_cls = sglang_manager_methods(names)
    sent: list[int] = []

    class Manager(manager_cls):
        is_generation = True

        def __init__(self):
            self.rid_to_state = {f"r{i}": SimpleNamespace() for i in range(batch_size)}

        async def _tokenize_one_request(self, obj):
            return SimpleNamespace(index=obj.index, input_ids=[BOS_ID])

        async def _send_batch_request(self, tokenized):
            sent.extend(t.index for t in tokenized)

        async def _wait_one_response(self, obj, request):
            await asyncio.sleep(0)
            if obj.index == aborted:
                raise ValueError("aborted by the scheduler")
            yield {"index": obj.index}

    items = [SimpleNamespace(index=i, text=None, rid=f"r{i}", return_prompt_token_ids=False,
                             contains_mm_input=lambda: False) for i in range(batch_size)]
    batch = type("Batch", (), {"batch_size": batch_size, "parallel_sample_num": 1, "stream": False,
                               "__getitem__": lambda self, i: items[i]})()
    with pytest.raises(ValueError) as raised:
        asyncio.run(Manager()._handle_batch_request(batch, None, {}).__anext__())
    return sent, str(raised.value)


def test_a_batch_item_the_scheduler_aborts_fails_the_batch_after_every_item_was_sent(srv):
    """An input_ids batch is sent to SGLang's scheduler whole before any answer is awaited, so an item it aborts
    before the prefill (logprob_start_len past the prompt) fails the batch (HTTP 400, the abort's message) while
    the other items were prefilled - their prompts cached - and then aborted.  The stand-in ran the items before
    the aborted one to the end and never sent those after it: a later request with the last item's prompt found
    nothing cached."""
    sent, raised = _sglang_batch_with_a_scheduler_abort(3, aborted=1)
    assert sent == [0, 1, 2] and raised == "aborted by the scheduler"
    prompts = [[BOS_ID, 40, 41, 42], [BOS_ID, 50, 51], [BOS_ID, 60, 61, 62, 63]]
    sp = {"max_new_tokens": 3, "temperature": 0.0}
    before = dict(srv.counters)
    r = _post(srv, {"input_ids": prompts, "return_logprob": [False, True, False], "logprob_start_len": [-1, 9, -1],
                    "sampling_params": sp})
    assert r.status_code == 400 and "is higher than the number of input tokens" in r.json()["error"]["message"]
    assert srv.counters["generation_tokens_total"] == before["generation_tokens_total"]
    for prompt in (prompts[0], prompts[2]):  # prefilled, so cached: all but the last token (test_server)
        again = _post(srv, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 0}}).json()
        assert again["meta_info"]["cached_tokens"] == len(prompt) - 1


@pytest.mark.parametrize("field, short, long", [
    ("sampling_params", [{"max_new_tokens": 1}], [{"max_new_tokens": 1}, {"max_new_tokens": 2}, {"max_new_tokens": 3}]),
    ("return_logprob", [True], [True, False, True]),
])
def test_per_item_lists_of_another_length_are_read_as_sglang_reads_them(srv, field, short, long):
    """SGLang's normalize keeps a per-item list of another length than the batch as it is (`_normalize_sampling_
    params`, `_normalize_logprob_params`: no length check), and `GenerateReqInput.__getitem__` then indexes it: a
    shorter list is an IndexError (not a ValueError: HTTP 500), a longer one has its extra entries unread.  The
    stand-in answered both with its own HTTP 400."""
    io_struct = "srt/managers/io_struct.py"
    normalize = {"sampling_params": "_normalize_sampling_params", "return_logprob": "_normalize_logprob_params"}[field]
    method = src.compile_function(src.method_def(io_struct, "GenerateReqInput", normalize), {"copy": __import__("copy")},
                                  io_struct)
    getitem = ast.unparse(src.method_def(io_struct, "GenerateReqInput", "__getitem__"))
    assert f"{field}=self.{field}[i]" in getitem
    for given in (short, long):
        fields = dict(sampling_params=None, return_logprob=None, logprob_start_len=None, top_logprobs_num=None,
                      return_sampling_mask=None, sampling_logprobs_mode=None, token_ids_logprob=None)
        obj = SimpleNamespace(parallel_sample_num=1, batch_size=2, **{**fields, field: given})
        method(obj, 2)
        assert getattr(obj, field) == given  # kept as it is
    with pytest.raises(IndexError):
        short[1]  # what __getitem__(1) does with the shorter list
    prompts = [[BOS_ID, 70], [BOS_ID, 71]]
    r = _post(srv, {"input_ids": prompts, field: short})
    assert r.status_code == 500 and srv.counters["num_requests_total"] == 0
    r = _post(srv, {"input_ids": prompts, field: long})
    assert r.status_code == 200 and len(r.json()) == 2
    if field == "sampling_params":
        assert [len(o["output_ids"]) for o in r.json()] == [1, 2]
    else:
        assert ["output_token_logprobs" in o["meta_info"] for o in r.json()] == [True, False]
