"""SGLangServerBackend against the stand-in SGLang server: ids on the wire, logprob parsing, errors, programs."""

from __future__ import annotations

import importlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from forerun.programs.proposals import ProgramProposalModel
from forerun.programs.suffixes import SuffixRequest
from forerun.runtime_ext.backends import server_client
from forerun.runtime_ext.standin.server import BOS_ID, EOS_ID, byte_tokenizer, StandInServer, unused_port
from forerun.runtime_ext.protocol import EngineError, SamplingParams
from forerun.runtime_ext.backends.server import SGLangServerBackend
from forerun.runtime_ext.backends.server_client import SGLangServerError, ServerConfig
from forerun.runtime_ext.backends.sglang_frontend import function, gen, runtime_installed
from forerun.runtime_ext.backends.token_markers import sampling_seed, token_ids

FAST = ServerConfig(retries=2, backoff_s=0.001, timeout_s=30.0, connect_timeout_s=2.0)


def _contract():
    """sglang's own /generate JSON contract decoder (the real server refuses bodies it rejects)."""
    return importlib.import_module("sglang.api.v1.api_types").GenerateRequest


@pytest.fixture()
def srv():
    with StandInServer() as s:
        yield s


@pytest.fixture()
def backend(srv):
    return SGLangServerBackend(srv.url, srv.tokenizer, config=FAST)


def _assert_wire_ok(srv):
    decoder = _contract()
    for body in srv.generate_bodies():
        assert "text" not in body, "the backend must send input_ids, never text"
        assert body["input_ids"], "empty input_ids"
        decoder.from_json_value(body)  # raises JsonContractError on a malformed body


# -- config -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [dict(retries=-1), dict(timeout_s=0), dict(backoff_s=-1), dict(backoff_factor=0.5),
                                dict(batch_mode="pipelined"), dict(max_concurrency=0)])
def test_config_rejects_bad_values(kw):
    name = next(iter(kw))
    with pytest.raises(ValueError, match=name):
        ServerConfig(**kw)


def test_backoff_is_exponential_and_capped():
    cfg = ServerConfig(backoff_s=0.5, backoff_factor=2.0, max_backoff_s=3.0)
    assert [cfg.backoff(i) for i in range(4)] == [0.5, 1.0, 2.0, 3.0]


def test_bad_url_rejected():
    with pytest.raises(ValueError, match="base_url"):
        SGLangServerBackend("127.0.0.1:30000", byte_tokenizer())


# -- generation and logprobs ----------------------------------------------------------------------
def test_generate_sends_ids_and_parses_logprobs_with_shift(srv, backend):
    m = srv.model
    prompt = [BOS_ID] + list("añb".encode())
    p = SamplingParams(max_new_tokens=6, temperature=0.7, top_k=40, seed=11, ignore_eos=True,
                       return_logprob=True, logprob_start_len=1, top_logprobs_num=3)
    out = backend.run(prompt, p)
    bodies = srv.generate_bodies()
    assert len(bodies) == 2  # pass 1 (generate at τ) + pass 2 (score, max_new_tokens=0)
    assert bodies[0]["input_ids"] == prompt
    assert bodies[0]["sampling_params"]["sampling_seed"] == 11
    assert bodies[0]["sampling_params"]["ignore_eos"] is True
    assert bodies[1]["input_ids"] == prompt + list(out.output_ids)
    assert bodies[1]["sampling_params"]["max_new_tokens"] == 0
    assert bodies[1]["logprob_start_len"] == len(prompt) - 1
    _assert_wire_ok(srv)

    assert len(out.output_ids) == 6 and out.input_ids == tuple(prompt)
    seq = list(prompt)
    for t, lq, lp, top in zip(out.output_ids, out.output_logq, out.output_logp0,
                              out.meta_info["output_top_logprobs"]):
        assert t == m.sample(seq, 0.7, 40, 1.0, 11)
        assert lq == pytest.approx(m.logq(seq, 0.7)[t], abs=1e-12)  # SGLang reports q_τ before top-k
        lp0 = m.logp0(seq)
        assert lp == pytest.approx(lp0[t], abs=1e-12)
        # output_top_logprobs is the top-k of p0 (from the scoring pass), like the embedded engine
        assert [e[1] for e in top] == list(np.argsort(-lp0, kind="stable")[:3])
        assert [e[0] for e in top] == pytest.approx(list(np.sort(lp0)[::-1][:3]), abs=1e-12)
        seq.append(t)
    assert out.output_logq != out.output_logp0  # τ != 1: q_τ differs from p0
    meta = out.meta_info
    assert meta["output_token_logp0"] == list(out.output_logp0)
    assert [e[1] for e in meta["output_token_logprobs"]] == list(out.output_ids)
    assert len(meta["output_top_logprobs_q"]) == 6
    # prompt logprobs from logprob_start_len=1: entry 0 is [None, x_1], then log p0(x_j | x_<j)
    assert meta["input_token_logprobs"][0][0] is None and meta["input_token_logprobs"][0][1] == prompt[1]
    assert out.input_logp0[0] is None
    for j, v in zip(range(2, len(prompt)), out.input_logp0[1:]):
        assert v == pytest.approx(m.logp0(prompt[:j])[prompt[j]], abs=1e-12)
    for key in ("cached_tokens", "prompt_tokens", "completion_tokens", "finish_reason", "id"):
        assert key in meta
    assert meta["prompt_tokens"] == len(prompt) and meta["completion_tokens"] == 6
    assert meta["finish_reason"]["type"] == "length"
    assert "output_token_entropy" not in meta and out.output_entropy is None  # no plugin: no entropy


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_unit_and_zero_temperature_need_one_pass(srv, backend, temperature):
    prompt = [BOS_ID, 40, 41]
    p = SamplingParams(max_new_tokens=4, temperature=temperature, seed=2, ignore_eos=True, return_logprob=True,
                       top_logprobs_num=2)
    out = backend.run(prompt, p)
    assert len(srv.generate_bodies()) == 1  # SGLang's reported logprobs are log p0 at τ = 0 and τ = 1
    seq = list(prompt)
    for t, lp, top in zip(out.output_ids, out.output_logp0, out.meta_info["output_top_logprobs"]):
        lp0 = srv.model.logp0(seq)
        assert lp == pytest.approx(lp0[t], abs=1e-12)
        assert [e[1] for e in top] == list(np.argsort(-lp0, kind="stable")[:2])
        seq.append(t)
    exact = SGLangServerBackend(srv.url, srv.tokenizer, config=ServerConfig(reuse_logq_at_unit_temperature=False))
    again = exact.run(prompt, p)
    assert len(srv.generate_bodies()) == 3  # the scoring pass runs when reuse is off
    assert again.output_ids == out.output_ids
    assert again.output_logp0 == pytest.approx(out.output_logp0, abs=1e-12)


def test_no_logprob_means_one_pass(srv, backend):
    out = backend.run([BOS_ID, 1, 2], SamplingParams(max_new_tokens=3, seed=1, ignore_eos=True))
    assert len(srv.generate_bodies()) == 1
    assert out.output_logq is None and out.output_logp0 is None
    assert out.text == srv.tokenizer.decode(out.output_ids)


def test_plugin_keys_give_entropy_and_skip_pass_two():
    with StandInServer(plugin=True) as srv:
        b = SGLangServerBackend(srv.url, srv.tokenizer, config=FAST)
        prompt = [BOS_ID, 10, 20]
        out = b.run(prompt, SamplingParams(max_new_tokens=4, seed=5, ignore_eos=True, return_logprob=True))
        assert len(srv.generate_bodies()) == 1
        seq = list(prompt)
        for t, lp, h in zip(out.output_ids, out.output_logp0, out.output_entropy):
            assert lp == pytest.approx(srv.model.logp0(seq)[t], abs=1e-12)
            assert h == pytest.approx(srv.model.entropy(seq), abs=1e-12)
            seq.append(t)
        assert out.meta_info["output_token_entropy"] == list(out.output_entropy)


@pytest.mark.parametrize("plugin", [False, True])
def test_log_p0_under_min_new_tokens_is_the_raw_models(plugin):
    """SGLang masks EOS and the stop ids out of the logits before min_new_tokens tokens, so neither its reported
    logprobs at τ = 1 nor the plugin's log p0 (computed after the penalties) are log p0 there: the client scores
    such a request in the second pass.  Oracle: the stand-in model's unmasked log-softmax."""
    with StandInServer(plugin=plugin) as srv:
        b = SGLangServerBackend(srv.url, srv.tokenizer, config=FAST)
        prompt = [BOS_ID, 10, 20]
        p = SamplingParams(max_new_tokens=6, min_new_tokens=4, temperature=1.0, seed=5, return_logprob=True,
                           stop_token_ids=(65,))
        out = b.run(prompt, p)
        seq = list(prompt)
        for t, lp in zip(out.output_ids, out.output_logp0):
            assert lp == pytest.approx(srv.model.logp0(seq)[t], abs=1e-12)
            seq.append(t)
        assert out.meta_info["output_token_logprobs_masked"] is True
        with pytest.raises(EngineError, match="min_new_tokens"):
            b.run(prompt, SamplingParams(max_new_tokens=6, min_new_tokens=4, seed=5, return_logprob=True,
                                         logprob_temperatures=(0.5,)))


def test_pure_scoring(srv, backend):
    ids = [BOS_ID] + list(b"hello")
    out = backend.score(ids, 2, top_logprobs_num=2)
    body = srv.generate_bodies()[0]
    assert body["sampling_params"]["max_new_tokens"] == 0 and body["logprob_start_len"] == 1
    assert out.output_ids == ()
    vals = out.input_logp0[1:]
    assert len(vals) == len(ids) - 2
    for j, v in zip(range(2, len(ids)), vals):
        assert v == pytest.approx(srv.model.logp0(ids[:j])[ids[j]], abs=1e-12)
    with pytest.raises(ValueError, match="start"):
        backend.score(ids, 0)


def test_seeded_outputs_reproducible_and_batch_matches_single(srv, backend):
    reqs = [([BOS_ID] + list(range(30, 30 + k)), SamplingParams(max_new_tokens=5, temperature=0.5, seed=100 + k,
                                                                  ignore_eos=True, return_logprob=True))
            for k in range(1, 5)]
    singles = [backend.run(ids, p) for ids, p in reqs]
    n_before = len(srv.generate_bodies())
    batch = backend.run_batch(reqs)
    bodies = srv.generate_bodies()[n_before:]
    assert len(bodies) == 2  # one batched generate + one batched scoring pass
    assert bodies[0]["input_ids"] == [ids for ids, _ in reqs]
    assert isinstance(bodies[0]["sampling_params"], list)
    for a, b in zip(singles, batch):
        assert a.output_ids == b.output_ids and a.output_logq == b.output_logq and a.output_logp0 == b.output_logp0
    _assert_wire_ok(srv)

    conc = SGLangServerBackend(srv.url, srv.tokenizer, config=ServerConfig(batch_mode="concurrent", backoff_s=0))
    n_before = len(srv.generate_bodies())
    outs = conc.run_batch(reqs)
    assert len(srv.generate_bodies()) - n_before == 2 * len(reqs)  # one request per item, both passes
    assert [o.output_ids for o in outs] == [s.output_ids for s in singles]


def test_cached_tokens_and_flush(srv, backend):
    ids = [BOS_ID] + list(b"shared prefix")
    p = SamplingParams(max_new_tokens=2, seed=1)
    assert backend.run(ids, p).meta_info["cached_tokens"] == 0
    # all but the last prompt token: SGLang recomputes it for its logits (schedule_batch.Req._compute_max_prefix_len)
    assert backend.run(ids, p).meta_info["cached_tokens"] == len(ids) - 1
    backend.flush_cache()
    assert backend.run(ids, p).meta_info["cached_tokens"] == 0
    m = backend.engine.metrics()
    assert m["sglang:cached_tokens_total"] == len(ids) - 1


def test_client_is_an_engine_and_sends_priority_only_to_a_priority_scheduling_server(srv, backend):
    """Without --enable-priority-scheduling SGLang ignores a priority, or aborts the request under
    --abort-on-priority-when-disabled (every background pre-position lost): none is sent.  With it, every request
    carries one (test_server_contract checks the order SGLang's scheduler then gives them)."""
    from forerun.runtime_ext.backends.server_client import SGLangServerClient
    from forerun.runtime_ext.protocol import Engine

    assert isinstance(backend.engine, Engine)
    backend.engine.generate([BOS_ID, 1], SamplingParams(max_new_tokens=1), priority=-1)
    backend.engine.generate([BOS_ID, 1], SamplingParams(max_new_tokens=1))
    assert ["priority" in b for b in srv.generate_bodies()] == [False, False]
    _assert_wire_ok(srv)
    info = srv.server_info
    srv.server_info = lambda: dict(info(), enable_priority_scheduling=True)
    client = SGLangServerClient(srv.url, tokenizer=srv.tokenizer)
    client.generate([BOS_ID, 1], SamplingParams(max_new_tokens=1), priority=-1)
    client.generate([BOS_ID, 1], SamplingParams(max_new_tokens=1))
    assert [b.get("priority") for b in srv.generate_bodies()[2:]] == [-1, 0]


def test_a_masked_top_logprob_sent_as_null_reads_back_as_minus_inf(srv, backend):
    """SGLang writes a -inf top-k entry (a token the grammar masks) as null (orjson): the client reads it back as
    -inf, as the embedded engine reports it, so meta_info holds numbers only."""
    out = backend.engine.generate([BOS_ID, 65], SamplingParams(max_new_tokens=1, temperature=1.0, seed=3,
                                                               regex="[0-9]", return_logprob=True,
                                                               top_logprobs_num=20))
    meta = out.meta_info
    q_top = meta.get("output_top_logprobs_q", meta["output_top_logprobs"])[0]
    values = [v for v, _, _ in q_top]
    assert all(isinstance(v, float) for v in values)
    assert sorted(i for v, i, _ in q_top if v > -np.inf) == list(range(ord("0"), ord("9") + 1))
    assert values[10:] == [-np.inf] * 10


def test_server_info_and_model_name(srv, backend):
    info = backend.get_server_info()
    assert info["model_path"] == srv.model_path
    assert backend.get_model_name() == srv.model_path
    assert backend.engine.health()


def test_tokenizer_loaded_from_server_info(srv, monkeypatch):
    seen = []

    def fake_load(path):
        seen.append(path)
        return byte_tokenizer()

    monkeypatch.setattr(server_client, "_load_tokenizer", fake_load)
    SGLangServerBackend(srv.url, config=FAST)
    SGLangServerBackend(srv.url, "/some/local/tokenizer", config=FAST)
    assert seen == [srv.tokenizer_path, "/some/local/tokenizer"]


def test_unloadable_tokenizer_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(EngineError, match="tokenizer"):
        server_client._load_tokenizer(str(tmp_path / "missing"))


# -- sessions -------------------------------------------------------------------------------------
def test_sessions_open_close_and_pass_through(srv, backend):
    sid = backend.open_session(1024)
    assert sid in srv.sessions
    sp = {"id": sid, "rid": None, "offset": -1, "replace": False}
    backend.run([BOS_ID, 1], SamplingParams(max_new_tokens=1, seed=1), session_params=sp)
    with backend.session_params(sp):
        backend.run([BOS_ID, 2], SamplingParams(max_new_tokens=1, seed=1, temperature=0.5, return_logprob=True))
    backend.run([BOS_ID, 3], SamplingParams(max_new_tokens=1, seed=1))
    bodies = srv.generate_bodies()
    assert bodies[0]["session_params"] == sp and bodies[1]["session_params"] == sp
    assert "session_params" not in bodies[2]  # the scoring pass does not touch the session
    assert "session_params" not in bodies[3]
    _assert_wire_ok(srv)
    backend.close_session(sid)
    assert sid not in srv.sessions
    with pytest.raises(SGLangServerError, match="does not exist"):
        backend.run([BOS_ID, 1], SamplingParams(max_new_tokens=1), session_params=sp)
    with pytest.raises(ValueError, match="capacity"):
        backend.open_session(0)


# -- errors ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["500", "429", "503", "disconnect"])
def test_transient_failures_are_retried(srv, backend, mode):
    srv.fail(mode, times=2)
    out = backend.run([BOS_ID, 7], SamplingParams(max_new_tokens=2, seed=3, ignore_eos=True))
    assert len(out.output_ids) == 2
    assert len(srv.generate_bodies()) == 3  # two failures, then success


def test_retries_are_bounded_then_fail_clearly(srv, backend):
    srv.fail("500", times=10)
    with pytest.raises(SGLangServerError) as ei:
        backend.run([BOS_ID, 7, 8], SamplingParams(max_new_tokens=2), rid="req-42")
    e = ei.value
    assert isinstance(e, EngineError)
    assert e.attempts == FAST.retries + 1 and e.status == 500
    assert len(srv.generate_bodies()) == FAST.retries + 1
    msg = str(e)
    assert srv.url + "/generate" in msg and "rid=req-42" in msg and "prompt length 3" in msg
    assert "HTTP 500" in msg


def test_client_errors_are_not_retried(srv, backend):
    srv.fail("400", times=5)
    with pytest.raises(SGLangServerError, match="HTTP 400") as ei:
        backend.run([BOS_ID, 7], SamplingParams(max_new_tokens=2), rid="bad")
    assert ei.value.attempts == 1 and ei.value.status == 400
    assert "rid=bad" in str(ei.value)


def test_abort_raises(srv, backend):
    srv.fail("abort")
    with pytest.raises(SGLangServerError, match="aborted rid=r1 \\(prompt length 2 tokens\\)"):
        backend.run([BOS_ID, 7], SamplingParams(max_new_tokens=2), rid="r1")


def test_abort_in_batch_names_the_request(srv, backend):
    srv.fail("abort")
    with pytest.raises(SGLangServerError, match="aborted"):
        backend.run_batch([([BOS_ID, 1], SamplingParams(max_new_tokens=1)),
                           ([BOS_ID, 2, 3], SamplingParams(max_new_tokens=1))])


def test_timeout_raises_without_retry(srv):
    b = SGLangServerBackend(srv.url, srv.tokenizer, config=ServerConfig(timeout_s=0.3, retries=3, backoff_s=0))
    srv.fail("hang")
    with pytest.raises(SGLangServerError, match="timed out") as ei:
        b.run([BOS_ID, 5], SamplingParams(max_new_tokens=1), rid="slow")
    assert ei.value.attempts == 1 and "rid=slow" in str(ei.value)


def test_connection_refused_fails_clearly():
    """The client reads /server_info at connect, so an unreachable server fails there, naming the URL."""
    url = f"http://127.0.0.1:{unused_port()}"
    with pytest.raises(SGLangServerError, match="cannot connect") as ei:
        SGLangServerBackend(url, byte_tokenizer(), config=ServerConfig(retries=1, backoff_s=0, connect_timeout_s=1))
    assert ei.value.attempts == 2
    assert url + "/server_info" in str(ei.value)


def test_empty_prompt_rejected(backend):
    with pytest.raises(SGLangServerError, match="empty prompt"):
        backend.run([], SamplingParams(max_new_tokens=1))


# -- @sgl.function programs ------------------------------------------------------------------------
def test_fork_from_token_cuts_sends_exact_ids(srv, backend):
    tok = srv.tokenizer
    root = tok.encode("héllo wörld ✓ 日本語")
    # cuts that split a multi-byte UTF-8 character: after the first byte of 'é', inside '✓', inside '日'
    e_pos = 1 + "héllo".encode().index("é".encode()) + 1
    check = 1 + "héllo wörld ".encode().__len__() + 1
    nichi = len(root) - 8
    cuts = [e_pos, check, nichi, len(root)]
    for c in cuts[:3]:
        with pytest.raises(UnicodeDecodeError):
            bytes(root[1:c]).decode("utf-8")
    assert tok.encode(tok.decode(root[:e_pos])) != root[:e_pos]  # text round-trip is not exact here

    @function
    def branches(s, root, cuts):
        forks = s.fork(len(cuts))
        for i, (f, c) in enumerate(zip(forks, cuts)):
            f += token_ids(root[:c])
            f += sampling_seed(1000 + i)
            f += gen("suffix", max_tokens=4, temperature=0.9, ignore_eos=True, return_logprob=True)
        forks.join()
        s["metas"] = [f.get_meta_info("suffix") for f in forks]

    state = branches.run(root=root, cuts=cuts, backend=backend)
    bodies = [b for b in srv.generate_bodies() if b["sampling_params"]["max_new_tokens"] == 4]
    assert sorted(map(tuple, (b["input_ids"] for b in bodies))) == sorted(tuple(root[:c]) for c in cuts)
    assert {b["sampling_params"]["sampling_seed"] for b in bodies} == {1000, 1001, 1002, 1003}
    for b in bodies:
        c = len(b["input_ids"])
        i = cuts.index(c)
        assert b["sampling_params"]["sampling_seed"] == 1000 + i
    metas = state["metas"]
    for c, meta in zip(cuts, metas):
        assert meta["prompt_tokens"] == c
        assert len(meta["output_token_logp0"]) == 4
    _assert_wire_ok(srv)


def test_plain_text_program_and_generated_text_remembered(srv, backend):
    tok = srv.tokenizer

    @function
    def two_turns(s):
        s += sampling_seed(7)
        s += "Hello"
        s += gen("first", max_tokens=5, temperature=1.0, ignore_eos=True)
        s += " more"
        s += gen("second", max_tokens=3, temperature=1.0, ignore_eos=True)

    state = two_turns.run(backend=backend)
    state.sync()
    assert state.error() is None
    b1, b2 = srv.generate_bodies()
    assert b1["input_ids"] == tok.encode("Hello")
    first_meta = state.get_meta_info("first")
    assert first_meta["completion_tokens"] == 5
    seq = tok.encode("Hello")
    for _ in range(5):
        seq.append(srv.model.sample(seq, 1.0, -1, 1.0, 7))
    first_ids = seq[len(b1["input_ids"]):]
    assert tok.decode(first_ids) == state["first"]
    # the second request carries the first generation's exact ids (not a re-tokenization of its text)
    assert b2["input_ids"] == b1["input_ids"] + first_ids + tok.encode(" more", add_special_tokens=False)
    assert b2["sampling_params"]["sampling_seed"] == 7
    _assert_wire_ok(srv)


# -- scripts/launch_runtime ------------------------------------------------------------------------
REPO = Path(__file__).resolve().parents[3]
LAUNCHER = REPO / "scripts" / "launch_runtime"


def _launch(*args, env_extra=None, timeout=60):
    env = {k: v for k, v in os.environ.items() if k != "FORERUN_SERVER_MODULE"}
    env.update(PYTHON=sys.executable, **(env_extra or {}))
    return subprocess.run(["bash", str(LAUNCHER), *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.skipif(runtime_installed(), reason="the SGLang runtime is installed here")
def test_launcher_fails_clearly_without_runtime(tmp_path):
    res = _launch("--port", str(unused_port()), "--timeout", "5", "--log", str(tmp_path / "log"))
    assert res.returncode == 2
    assert "SGLang runtime" in res.stderr and "is not installed" in res.stderr and res.stderr.count("\n") == 1
    assert res.stdout == ""


def test_launcher_waits_for_health_and_prints_url(tmp_path):
    port = unused_port()
    res = _launch("--port", str(port), "--timeout", "30", "--log", str(tmp_path / "log"),
                  "--", "--mem-fraction-static", "0.5",
                  env_extra={"FORERUN_SERVER_MODULE": "forerun.runtime_ext.standin.server"})
    assert res.returncode == 0, res.stderr
    url = res.stdout.strip()
    assert url == f"http://127.0.0.1:{port}"
    pid = int(re.search(r"healthy \(pid (\d+)", res.stderr).group(1))
    try:
        assert "--enable-metrics" in res.stderr and "--mem-fraction-static 0.5" in res.stderr
        b = SGLangServerBackend(url, byte_tokenizer(), config=FAST)
        assert b.engine.health()
        assert len(b.run([BOS_ID, 1], SamplingParams(max_new_tokens=2, ignore_eos=True)).output_ids) == 2
    finally:
        os.kill(pid, signal.SIGTERM)


def test_launcher_reports_a_server_that_dies(tmp_path):
    res = _launch("--port", str(unused_port()), "--timeout", "20", "--log", str(tmp_path / "log"),
                  env_extra={"FORERUN_SERVER_MODULE": "forerun.no_such_server_module"})
    assert res.returncode == 1
    assert "exited before becoming healthy" in res.stderr and "No module named" in res.stderr


def test_launcher_rejects_bad_port():
    res = _launch("--port", "abc")
    assert res.returncode == 1 and "--port must be a number" in res.stderr


def test_entropy_of_p0_only_through_a_plugin(srv, backend):
    """A stock server reports no per-token entropy of p0, and a sampler that needs it (EntropyCut's
    ProgramProposalModel) fails clearly; a sampler plugin's entropy comes through."""
    out = backend.run([BOS_ID, 1], SamplingParams(max_new_tokens=2, temperature=0.5, return_logprob=True), rid="e1")
    assert out.output_entropy is None and "output_token_entropy" not in out.meta_info
    with pytest.raises(EngineError, match="needs the entropy of p0"):
        ProgramProposalModel(backend, require_entropy=True).generate([SuffixRequest((BOS_ID, 1), 2, 0.5, 1)])
    with StandInServer(plugin=True) as plug:
        b = SGLangServerBackend(plug.url, plug.tokenizer, config=FAST)
        out = b.run([BOS_ID, 1], SamplingParams(max_new_tokens=2, return_logprob=True))
        assert len(out.output_entropy) == 2 and len(out.meta_info["output_token_entropy"]) == 2


@pytest.mark.parametrize("plugin", [False, True])
def test_log_p0_under_frequency_and_presence_penalties_is_the_raw_models(plugin):
    """SGLang's frequency and presence penalizers subtract from the logits before its sampler (and the plugin) see
    them, so at τ = 1 neither the reported logprobs nor the plugin's log p0 are log p0: the client scores such a
    request in the second pass.  Oracle: the stand-in model's log-softmax, unpenalized for log p0, and with
    z − f·count − p·[seen] over the tokens generated so far (SGLang's penalizers) for the reported log q."""
    with StandInServer(plugin=plugin) as srv:
        b = SGLangServerBackend(srv.url, srv.tokenizer, config=FAST)
        prompt = [BOS_ID, 10, 20]
        f, pres = 1.5, 0.75
        p = SamplingParams(max_new_tokens=12, temperature=1.0, seed=5, return_logprob=True, ignore_eos=True,
                           frequency_penalty=f, presence_penalty=pres)
        out = b.run(prompt, p)
        seq, counts = list(prompt), np.zeros(len(srv.model.table))
        for t, lq, lp in zip(out.output_ids, out.output_logq, out.output_logp0):
            z = srv.model.logits(seq) - f * counts - pres * (counts > 0)
            assert lq == pytest.approx(float(z[t] - np.log(np.sum(np.exp(z)))), abs=1e-9)
            assert lp == pytest.approx(srv.model.logp0(seq)[t], abs=1e-12)
            seq.append(t)
            counts[t] += 1
        assert max(abs(q - lp) for q, lp in zip(out.output_logq, out.output_logp0)) > 1e-3  # penalties took effect
        with pytest.raises(EngineError, match="frequency_penalty"):
            b.run(prompt, SamplingParams(max_new_tokens=6, seed=5, return_logprob=True, frequency_penalty=f,
                                         logprob_temperatures=(0.5,)))


def test_suffix_proposals_run_their_full_length_under_a_chat_template_that_stops_at_eos_text():
    """SGLang adds the chat template's stop strings to every gen and matches them in output decoded with special
    tokens spelled out, ignore_eos or not: a server whose template stops at its EOS text ("</s>": mistral's; an
    instruct model's "<|im_end|>" alike) ended a power sampler's suffix at its first EOS ("suffix has 5 tokens,
    expected 12").  The proposals use no roles and run without those stop strings.  Oracle: the server's own
    seeded tokens for the same request with EOS ignored and no stop string."""
    with StandInServer() as srv:
        b = SGLangServerBackend(srv.url, srv.tokenizer, config=FAST, chat_template_name="mistral")
        assert srv.tokenizer.decode([EOS_ID], skip_special_tokens=False) in b.chat_template.stop_str
        after = int(np.argmax(srv.model.table[:, EOS_ID]))  # the token after which EOS is likeliest
        reqs = [SuffixRequest((BOS_ID, after), 12, 1.0, seed) for seed in range(20)]
        suffixes = ProgramProposalModel(b).generate(reqs)
        direct = [b.engine.generate(list(r.prefix_ids), SamplingParams(max_new_tokens=12, temperature=1.0,
                                                                       seed=r.seed, ignore_eos=True))
                  for r in reqs]
        assert [list(s.ids) for s in suffixes] == [list(d.output_ids) for d in direct]
        assert any(EOS_ID in s.ids for s in suffixes)  # the case: an EOS inside a suffix, generation went on
        assert b.chat_template.stop_str  # the user's backend keeps its template for programs with roles
