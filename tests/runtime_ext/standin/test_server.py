"""The stand-in SGLang server itself: JSON shapes, the SGLang logprob shift, determinism, failure injection."""

from __future__ import annotations

import numpy as np
import pytest
import requests

from forerun.runtime_ext.standin.server import (
    BOS_ID,
    EOS_ID,
    VOCAB_SIZE,
    ByteModel,
    StandInServer,
    byte_tokenizer,
)


@pytest.fixture()
def srv():
    with StandInServer() as s:
        yield s


def _post(srv, path, body):
    return requests.post(srv.url + path, json=body, timeout=10)


def test_byte_tokenizer_roundtrip_and_partial_chars():
    tok = byte_tokenizer()
    ids = tok.encode("日本")
    assert ids[0] == BOS_ID and len(ids) == 7
    assert tok.decode(ids, skip_special_tokens=True) == "日本"
    assert tok.decode(ids[:2], skip_special_tokens=True) == "\ufffd"  # a cut inside a character is not exact as text
    assert tok.encode("a", add_special_tokens=False) == [97]


def test_model_distributions_are_normalised():
    m = ByteModel()
    prefix = [BOS_ID, 5, 6]
    for lp in (m.logp0(prefix), m.logq(prefix, 0.5), m.sampling_logprobs(prefix, 1.3, top_k=7),
               m.sampling_logprobs(prefix, 1.0, top_p=0.6)):
        assert np.exp(lp).sum() == pytest.approx(1.0, abs=1e-12)
    assert np.isfinite(m.sampling_logprobs(prefix, 1.0, top_k=7)).sum() == 7
    assert np.array_equal(m.logq(prefix, 1.0), m.logp0(prefix)) and np.array_equal(m.logq(prefix, 0.0), m.logp0(prefix))
    assert m.entropy(prefix) == pytest.approx(-np.sum(np.exp(m.logp0(prefix)) * m.logp0(prefix)))
    assert m.sample(prefix, 0.0, -1, 1.0, 1) == int(np.argmax(m.logits(prefix)))


def test_generate_single_shape_and_exact_numbers(srv):
    m = srv.model
    ids = [BOS_ID, 10, 11, 12]
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 3, "temperature": 0.5, "sampling_seed": 9,
                                                   "ignore_eos": True},
            "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2, "return_text_in_logprobs": True}
    r = _post(srv, "/generate", body)
    assert r.status_code == 200
    out = r.json()
    assert set(out) == {"text", "output_ids", "meta_info"}
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == 4 and meta["completion_tokens"] == 3
    assert meta["finish_reason"] == {"type": "length", "length": 3}
    # SGLang shift: entry 0 is [None, x_0, text]; entry k is log p0(x_k | x_<k)
    itl = meta["input_token_logprobs"]
    assert itl[0][:2] == [None, ids[0]] and len(itl) == len(ids)
    for k in range(1, len(ids)):
        assert itl[k][1] == ids[k]
        assert itl[k][0] == pytest.approx(m.logp0(ids[:k])[ids[k]], abs=1e-12)
    assert meta["input_top_logprobs"][0] is None and len(meta["input_top_logprobs"]) == len(ids)
    seq = list(ids)
    for t, e, top in zip(out["output_ids"], meta["output_token_logprobs"], meta["output_top_logprobs"]):
        assert e[1] == t and e[0] == pytest.approx(m.logq(seq, 0.5)[t], abs=1e-12)
        assert [x[1] for x in top] == list(np.argsort(-m.logq(seq, 0.5), kind="stable")[:2])
        seq.append(t)
    again = _post(srv, "/generate", body).json()
    assert again["output_ids"] == out["output_ids"]  # same seed, same tokens


def test_default_logprob_start_returns_no_input_logprobs(srv):
    """As SGLang: logprob_start_len -1 (the default) becomes the prompt length (scheduler.py L3260-3264, pinned in
    test_server_contract.py), so no prompt logprobs; the prompt length itself gives none too, beyond it is a 400."""
    body = {"input_ids": [BOS_ID, 1, 2], "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
            "top_logprobs_num": 2}
    out = _post(srv, "/generate", body).json()
    assert out["output_ids"] == []
    assert out["meta_info"]["input_token_logprobs"] == [] and out["meta_info"]["input_top_logprobs"] == []
    assert _post(srv, "/generate", {**body, "logprob_start_len": 3}).json()["meta_info"]["input_token_logprobs"] == []
    assert _post(srv, "/generate", {**body, "logprob_start_len": 2}).json()["meta_info"]["input_token_logprobs"][0] \
        == [None, 2, None]
    r = _post(srv, "/generate", {**body, "logprob_start_len": 4})
    assert r.status_code == 400 and "is higher than the number of input tokens" in r.json()["error"]["message"]


def test_batched_generate_and_text_input(srv):
    body = {"input_ids": [[BOS_ID, 1], [BOS_ID, 2, 3]], "rid": ["a", "b"],
            "sampling_params": [{"max_new_tokens": 1, "sampling_seed": 1}, {"max_new_tokens": 2, "sampling_seed": 2}]}
    outs = _post(srv, "/generate", body).json()
    assert [o["meta_info"]["id"] for o in outs] == ["a", "b"]
    assert [len(o["output_ids"]) for o in outs] == [1, 2] or outs[1]["meta_info"]["finish_reason"]["type"] == "stop"
    t = _post(srv, "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1}}).json()
    assert t["meta_info"]["prompt_tokens"] == 3  # BOS + 2 bytes


def test_stop_on_eos_unless_ignored():
    m = ByteModel()
    m.table[:, EOS_ID] = 50.0  # EOS always wins
    with StandInServer(model=m) as srv:
        out = _post(srv, "/generate", {"input_ids": [BOS_ID, 1], "sampling_params": {"max_new_tokens": 5}}).json()
        assert out["output_ids"] == [EOS_ID]
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS_ID}
        out = _post(srv, "/generate", {"input_ids": [BOS_ID, 1],
                                       "sampling_params": {"max_new_tokens": 5, "ignore_eos": True}}).json()
        assert len(out["output_ids"]) == 5


def test_a_temperature_below_sglangs_epsilon_is_greedy(srv):
    """SamplingParams.__post_init__: 0 <= τ < 1e-6 samples with top_k 1 at τ = 1 (reported logprobs: log p0)."""
    body = {"input_ids": [BOS_ID, 5], "return_logprob": True,
            "sampling_params": {"max_new_tokens": 4, "ignore_eos": True, "sampling_seed": 1}}
    outs = [_post(srv, "/generate", {**body, "sampling_params": {**body["sampling_params"], "temperature": t}}).json()
            for t in (0.0, 1e-7, 1e-6)]
    assert outs[0]["output_ids"] == outs[1]["output_ids"]
    assert outs[0]["meta_info"]["output_token_logprobs"] == outs[1]["meta_info"]["output_token_logprobs"]
    assert outs[2]["meta_info"]["output_token_logprobs"] != outs[0]["meta_info"]["output_token_logprobs"]


def test_bad_requests_are_rejected(srv):
    assert _post(srv, "/generate", {"sampling_params": {}}).status_code == 400
    assert _post(srv, "/generate", {"input_ids": []}).status_code == 400
    r = _post(srv, "/generate", {"input_ids": [VOCAB_SIZE + 1]})
    assert r.status_code == 400 and "outside" in r.json()["error"]["message"]
    assert requests.get(srv.url + "/nope", timeout=5).status_code == 404


def _sglang_max_prefix_len(prompt_len: int, return_logprob: bool = False, logprob_start_len: int = -1) -> int:
    """SGLang's own `Req._compute_max_prefix_len` (schedule_batch.py): the most prompt tokens a request takes from
    the radix cache - its `cached_tokens` when the cache holds the whole prompt.  `logprob_start_len` as the
    scheduler leaves it (handle_generate_request: -1 with return_logprob becomes the prompt length)."""
    from pathlib import Path
    from types import SimpleNamespace

    from forerun.testing.test_modules import sibling

    src = sibling(str(Path(__file__).parents[1] / "backends" / "sglang_source.py"), "sglang_source")
    path = "srt/managers/schedule_batch.py"
    limit = src.compile_function(src.method_def(path, "Req", "_compute_max_prefix_len"), {}, path)
    start = prompt_len if return_logprob and logprob_start_len == -1 else logprob_start_len
    return limit(SimpleNamespace(dllm_config=None, return_logprob=return_logprob, logprob_start_len=start,
                                 is_dllm=lambda: False), prompt_len)


def test_cache_metrics_and_flush(srv):
    body = {"input_ids": [BOS_ID, 1, 2, 3], "sampling_params": {"max_new_tokens": 1}}
    assert _post(srv, "/generate", body).json()["meta_info"]["cached_tokens"] == 0
    assert _post(srv, "/generate", body).json()["meta_info"]["cached_tokens"] == _sglang_max_prefix_len(4) == 3
    assert _post(srv, "/generate", {"input_ids": [BOS_ID, 1, 9]}).json()["meta_info"]["cached_tokens"] == 2
    text = requests.get(srv.url + "/metrics", timeout=5).text
    assert 'sglang:cached_tokens_total{model_name="forerun-standin-byte-model"} 5.0' in text
    assert _post(srv, "/flush_cache", {}).status_code == 200
    assert _post(srv, "/generate", body).json()["meta_info"]["cached_tokens"] == 0


@pytest.mark.parametrize("return_logprob, logprob_start_len", [(False, -1), (False, 2), (True, -1), (True, 0),
                                                                (True, 2), (True, 4), (True, 5)])
def test_cached_tokens_stop_where_sglangs_radix_match_stops(srv, return_logprob, logprob_start_len):
    """With the whole prompt in the cache, SGLang takes all but its last token (whose logits the request needs), and
    none past logprob_start_len when it returns logprobs from there (`Req._compute_max_prefix_len`); the stand-in
    reported the whole prompt cached (5 of 5, and 5 for a scoring pass from position 0)."""
    prompt = [BOS_ID, 11, 12, 13, 14]
    assert _post(srv, "/generate", {"input_ids": prompt, "sampling_params": {"max_new_tokens": 0}}).status_code == 200
    body = {"input_ids": prompt, "return_logprob": return_logprob, "logprob_start_len": logprob_start_len,
            "sampling_params": {"max_new_tokens": 0}}
    r = _post(srv, "/generate", body)
    assert r.status_code == 200
    want = _sglang_max_prefix_len(len(prompt), return_logprob, logprob_start_len)
    assert r.json()["meta_info"]["cached_tokens"] == want


def test_info_health_sessions(srv):
    for path in ("/server_info", "/get_server_info"):
        assert requests.get(srv.url + path, timeout=5).json()["model_path"] == srv.model_path
    assert requests.get(srv.url + "/health", timeout=5).status_code == 200
    sid = _post(srv, "/open_session", {"capacity_of_str_len": 100}).json()
    assert sid in srv.sessions
    assert _post(srv, "/open_session", {"capacity_of_str_len": 100, "session_id": sid}).status_code == 400
    assert _post(srv, "/open_session", {}).status_code == 422
    assert _post(srv, "/close_session", {"session_id": sid}).status_code == 200
    assert sid not in srv.sessions
    assert _post(srv, "/close_session", {"session_id": sid}).status_code == 200  # SGLang only logs a warning


def test_failure_injection_and_recording(srv):
    srv.fail("500", times=2)
    srv.fail("abort")
    body = {"input_ids": [BOS_ID, 1], "sampling_params": {"max_new_tokens": 1}}
    assert _post(srv, "/generate", body).status_code == 500
    assert _post(srv, "/generate", body).status_code == 500
    out = _post(srv, "/generate", body).json()
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert _post(srv, "/generate", body).status_code == 200
    assert len(srv.generate_bodies()) == 4 and srv.generate_bodies()[0] == body
    srv.fail("disconnect")
    with pytest.raises(requests.exceptions.ConnectionError):
        _post(srv, "/generate", body)
    srv.fail("hang")
    with pytest.raises(requests.exceptions.Timeout):
        requests.post(srv.url + "/generate", json=body, timeout=0.2)
    with pytest.raises(ValueError, match="fail mode"):
        srv.fail("explode")


def test_sglang_refuses_requests_past_the_context_and_reports_it_in_v1_models():
    """The oracle, SGLang 0.5.23's own source: the tokenizer manager refuses a prompt of context_len tokens or more
    and a prompt + max_new_tokens past it (ValueError: HTTP 400), and /v1/models reports max_model_len."""
    import importlib.util
    from pathlib import Path

    root = Path(importlib.util.find_spec("sglang").submodule_search_locations[0]) / "srt"
    manager = (root / "managers" / "tokenizer_manager.py").read_text()
    assert "if input_token_num >= self.context_len:" in manager
    assert "and (max_new_tokens + input_token_num) > _max_req_len" in manager
    assert "self.validate_total_tokens = True" in manager
    # and the scheduler caps max_new_tokens at max_req_len - input_len - 1, max_req_len = context_len - 1 (or less)
    assert "self.max_req_len - input_len - 1," in (root / "managers" / "scheduler.py").read_text()
    assert "self.model_config.context_len - 1," in (root / "managers" / "tp_worker.py").read_text()
    server = (root / "entrypoints" / "http_server.py").read_text()
    models = server[server.index('@app.get("/v1/models"'):]
    assert "max_model_len=_global_state.tokenizer_manager.model_config.context_len" in models[:800]


def test_the_stand_in_refuses_what_does_not_fit_its_context_as_sglang_does():
    with StandInServer(context_length=12) as srv:
        cards = requests.get(srv.url + "/v1/models", timeout=10).json()["data"]

        def post(n_prompt, **sp):
            return requests.post(srv.url + "/generate", json={"input_ids": [65] * n_prompt, "sampling_params": sp},
                                 timeout=10)

        full = post(12, max_new_tokens=1)
        total = post(10, max_new_tokens=3)
        exact = post(10, max_new_tokens=2, ignore_eos=True)  # fits; the scheduler's cap leaves 12 - 2 - 10 = 0
        capped = post(8, max_new_tokens=4, ignore_eos=True)
        unset = post(9, ignore_eos=True)  # max_new_tokens not set: only the prompt is checked; capped at 1
        null = post(6, max_new_tokens=None, ignore_eos=True)  # null: no limit of its own (was: connection dropped)
    assert [c["max_model_len"] for c in cards] == [12]
    assert full.status_code == 400 and full.json()["error"]["message"] == (
        "The input (12 tokens) is longer than the model's context length (12 tokens).")
    assert total.status_code == 400 and "You requested a total of 13 tokens: 10 tokens from the input messages and " \
        "3 tokens for the completion" in total.json()["error"]["message"]
    assert exact.status_code == 200 and exact.json()["output_ids"] == []
    assert capped.status_code == 200 and len(capped.json()["output_ids"]) == 2
    assert capped.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 2}
    assert unset.status_code == 200 and len(unset.json()["output_ids"]) == 1
    # scheduler.init_req_max_new_tokens: None -> 1 << 30, then min(., max_req_len - input_len - 1) = 11 - 6 - 1 = 4
    assert null.status_code == 200 and null.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 4}


def _sglang_parallel_sampling(sampling_params, batched: bool):
    """SGLang's own `GenerateReqInput._handle_parallel_sampling` (and the beam-width helpers it calls), run on a
    stand-in object: (samples per prompt, answered as one object) or its ValueError's message."""
    from pathlib import Path

    from forerun.testing.test_modules import sibling

    src = sibling(str(Path(__file__).parents[1] / "backends" / "sglang_source.py"), "sglang_source")
    io_struct = "srt/managers/io_struct.py"
    names = ("_handle_parallel_sampling", "_handle_beam_search_parallel_sampling", "_sampling_params_beam_width")
    req = type("Req", (), {n: src.compile_function(src.method_def(io_struct, "GenerateReqInput", n), {}, io_struct)
                           for n in names})()
    req.sampling_params, req.is_single = sampling_params, not batched
    req.text, req.input_embeds, req.input_ids = None, None, [[BOS_ID, 5]] if batched else [BOS_ID, 5]
    try:
        req._handle_parallel_sampling()
    except ValueError as exc:
        return str(exc)
    return req.parallel_sample_num, req.is_single


@pytest.mark.parametrize("n, batched", [(None, False), (1, False), (2, False), (4, False), (None, True), (1, True),
                                        (2, True)])
def test_parallel_sampling_n_answers_n_samples_as_sglang_does(srv, n, batched):
    """SGLang answers sampling_params.n > 1 with n samples per prompt, as a list (a single request becomes a batch:
    io_struct `_handle_parallel_sampling`); the stand-in once ignored n and answered one, then refused n > 1.  It
    now answers n samples (test_admission checks them against SGLang's batch path); n = 1 and no n answer one
    response per prompt, as before (the same tokens)."""
    sp = {"max_new_tokens": 3, "temperature": 0.0, **({} if n is None else {"n": n})}
    plain = {"max_new_tokens": 3, "temperature": 0.0}
    ids = [BOS_ID, 5]
    want = _sglang_parallel_sampling(sp if not batched else [sp], batched)
    body = {"input_ids": [ids] if batched else ids, "sampling_params": [sp] if batched else sp}
    r = _post(srv, "/generate", body)
    assert r.status_code == 200
    out = r.json()
    ref = _post(srv, "/generate", {"input_ids": ids, "sampling_params": plain}).json()
    assert len(ref["output_ids"]) == 3
    if want == (1, not batched):  # SGLang: one response per prompt
        assert isinstance(out, list) == batched
        assert (out[0] if batched else out)["output_ids"] == ref["output_ids"]
    else:
        assert want == (n, False)  # SGLang: n samples of the prompt, answered as a list
        assert isinstance(out, list) and [o["output_ids"] for o in out] == [ref["output_ids"]] * n


@pytest.mark.parametrize("n", [0, -1])
def test_a_single_request_with_n_below_one_is_one_request_as_in_sglang(srv, n):
    """SGLang's `_handle_parallel_sampling` fans out only n > 1: a single request with n <= 0 stays one request
    (SamplingParams.verify does not check n), answered as with n = 1; the stand-in refused it with HTTP 400.  In a
    batch, n < 1 fails (SGLang expands the batch to 0 copies, then fails indexing them: HTTP 500); a non-integer
    n fails SGLang's own request schema, which the stand-in runs first."""
    assert _sglang_parallel_sampling({"n": n}, False) == (n, True)  # one request, answered as one object
    sp = {"max_new_tokens": 2, "temperature": 0.0}
    r = _post(srv, "/generate", {"input_ids": [BOS_ID, 5], "sampling_params": {**sp, "n": n}})
    assert r.status_code == 200
    assert r.json()["output_ids"] == _post(srv, "/generate", {"input_ids": [BOS_ID, 5], "sampling_params": sp}).json()[
        "output_ids"]
    batch = _post(srv, "/generate", {"input_ids": [[BOS_ID, 5]], "sampling_params": [{**sp, "n": n}]})
    assert batch.status_code == 500
