"""The server path where GPU users meet it (issue 9, points 1-4): seeds need deterministic inference,
/flush_cache waits for an idle server, session requests are scored on the context the server built, bad
output and bad requests fail clearly.  Against the stand-in server, which models each behaviour as SGLang does."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from forerun.cli.main import main
from forerun.runtime_ext.backends.server import SGLangServerBackend
from forerun.runtime_ext.backends.server_client import ServerConfig, SGLangServerError
from forerun.runtime_ext.backends.server_wire import Where, finite_logprobs
from forerun.runtime_ext.protocol import SamplingParams
from forerun.runtime_ext.standin.server import BOS_ID, StandInServer, unused_port

FAST = ServerConfig(retries=1, backoff_s=0.001, timeout_s=30.0, connect_timeout_s=2.0, flush_wait_s=5.0)
SEEDED = SamplingParams(max_new_tokens=6, temperature=0.8, seed=7, ignore_eos=True)


# -- 1. seeds ---------------------------------------------------------------------------------------
def test_seeded_work_is_refused_without_deterministic_inference_and_allowed_on_request():
    with StandInServer(deterministic=False) as srv:
        b = SGLangServerBackend(srv.url, srv.tokenizer, config=FAST)
        assert not b.engine.deterministic
        with pytest.raises(SGLangServerError, match="--enable-deterministic-inference") as ei:
            b.run([BOS_ID, 1, 2], SEEDED, rid="chain-0")
        assert "--allow-nondeterministic" in str(ei.value) and "rid=chain-0" in str(ei.value)
        assert srv.generate_bodies() == []  # refused before anything was sent
        b.run([BOS_ID, 1, 2], SamplingParams(max_new_tokens=2, ignore_eos=True))  # unseeded work is fine
        loose = SGLangServerBackend(srv.url, srv.tokenizer, config=ServerConfig(allow_nondeterministic=True))
        a, c = (loose.run([BOS_ID, 1, 2], SEEDED).output_ids for _ in range(2))
        assert a != c  # why it is refused: this server ignores the seed (equal in law only)
    with StandInServer(deterministic=True) as srv:
        b = SGLangServerBackend(srv.url, srv.tokenizer, config=FAST)
        assert b.engine.deterministic
        assert b.run([BOS_ID, 1, 2], SEEDED).output_ids == b.run([BOS_ID, 1, 2], SEEDED).output_ids


def test_a_seeded_programs_select_and_scoring_run_without_deterministic_inference():
    """A select, and a gen with max_tokens=0, sample nothing: the program's sampling_seed marker cannot matter to them,
    so they run on a server without --enable-deterministic-inference (they used to be refused with the seed error).
    Oracle: the same requests with no seed marker (nothing to refuse there)."""
    from forerun.runtime_ext.backends.sglang_frontend import function, gen, select
    from forerun.runtime_ext.backends.token_markers import sampling_seed

    @function
    def pick(s, marker):
        s += marker + "Q:"
        s += select("choice", choices=["yes", "no", "maybe"])
        s += gen("score", max_tokens=0, return_logprob=True, logprob_start_len=0)

    with StandInServer(deterministic=False) as srv:
        b = SGLangServerBackend(srv.url, srv.tokenizer, config=FAST)
        seeded, plain = pick.run(marker=sampling_seed(5), backend=b), pick.run(marker="", backend=b)
        assert seeded.error() is None and plain.error() is None
        assert seeded["choice"] == plain["choice"]
        for name in ("choice", "score"):
            key = "input_token_logprobs"
            assert seeded.get_meta_info(name)[key] == plain.get_meta_info(name)[key]
        with pytest.raises(SGLangServerError, match="--enable-deterministic-inference"):
            b.run([BOS_ID, 1, 2], SEEDED)  # a seeded request that samples is still refused


def test_cli_refuses_then_proceeds_with_the_equal_in_law_note(capsys):
    with StandInServer(deterministic=False) as srv:
        argv = ["sample", "--backend", srv.url, "--prompt", "hi", "--n", "6", "--K", "2", "--json"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--enable-deterministic-inference" in err
        assert main(argv + ["--allow-nondeterministic"]) == 0
        cap = capsys.readouterr()
        assert "equal in law only" in json.loads(cap.out)["determinism"] and "equal in law only" in cap.err


def test_generate_without_seed_reports_the_fresh_seed_it_ran_with(capsys):
    """An unseeded `forerun generate --json` prints the seed the server sampled with (sent fresh by the client:
    the server's own default would be 42 for everyone); passing it back as --seed replays the tokens."""
    argv = ["generate", "--prompt", "hi", "--raw", "--max-tokens", "8", "--temperature", "1.0", "--ignore-eos",
            "--json"]
    with StandInServer(deterministic=True) as srv:
        assert main(argv + ["--backend", srv.url]) == 0
        first = json.loads(capsys.readouterr().out)
        sent = [b["sampling_params"]["sampling_seed"] for b in srv.generate_bodies()]
        assert first["sampling_seed"] == sent[0] and isinstance(sent[0], int)
        assert main(argv + ["--backend", srv.url, "--seed", str(first["sampling_seed"])]) == 0
        again = json.loads(capsys.readouterr().out)
    assert again["output_ids"] == first["output_ids"] and again["sampling_seed"] == first["sampling_seed"]


REPO = Path(__file__).resolve().parents[3]


def _launch(*flags: str, tmp_path: Path) -> tuple[str, int]:
    env = dict(os.environ, PYTHON=sys.executable, FORERUN_SERVER_MODULE="forerun.runtime_ext.standin.server")
    res = subprocess.run(["bash", str(REPO / "scripts" / "launch_runtime"), "--port", str(unused_port()), "--timeout",
                          "30", "--log", str(tmp_path / f"log{len(flags)}"), *flags], capture_output=True, text=True,
                         timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip(), int(re.search(r"healthy \(pid (\d+)", res.stderr).group(1))


def test_launch_runtime_fake_mode_with_and_without_deterministic_inference(tmp_path, capsys):
    """The acceptance path: launch_runtime passes --enable-deterministic-inference (seeded work runs);
    --no-deterministic leaves it off (refused; --allow-nondeterministic proceeds with the warning)."""
    url, pid = _launch("--plugin", tmp_path=tmp_path)
    url_off, pid_off = _launch("--no-deterministic", tmp_path=tmp_path)
    try:
        info = requests.get(url + "/server_info", timeout=5).json()
        assert info["enable_deterministic_inference"] is True and "forerun_plugin" in info
        assert "forerun_plugin" not in requests.get(url_off + "/server_info", timeout=5).json()
        argv = ["sample", "--prompt", "hi", "--n", "6", "--K", "2", "--json"]
        assert main(argv + ["--backend", url, "--sampler", "entropy-cut"]) == 0  # the plugin reports entropy
        assert json.loads(capsys.readouterr().out)["determinism"] == "token for token"
        assert main(argv + ["--backend", url_off]) == 2
        assert "relaunch it with --enable-deterministic-inference" in capsys.readouterr().err
        assert main(argv + ["--backend", url_off, "--allow-nondeterministic"]) == 0
        assert "warning" in capsys.readouterr().err
    finally:
        os.kill(pid, signal.SIGTERM)
        os.kill(pid_off, signal.SIGTERM)


# -- 2. /flush_cache ------------------------------------------------------------------------------
def test_flush_waits_for_an_idle_server_and_gives_up_on_a_busy_one():
    with StandInServer(step_s=0.02) as srv:
        b = SGLangServerBackend(srv.url, srv.tokenizer, config=FAST)
        long = threading.Thread(target=b.run, args=([BOS_ID, 3], SamplingParams(max_new_tokens=60, seed=1)))
        long.start()
        while srv.in_flight() == 0:
            time.sleep(0.005)
        assert requests.post(srv.url + "/flush_cache", timeout=5).status_code == 400  # SGLang: busy -> 400
        assert b.engine.flush_cache(wait_s=0.05) is False and srv.flushes == 0  # gave up, nothing flushed
        assert b.engine.flush_cache(wait_s=10) is True and srv.flushes == 1  # waited for the request to end
        long.join()
        assert srv.in_flight() == 0


# -- 3. sessions ----------------------------------------------------------------------------------
def test_session_generation_is_scored_on_the_context_the_server_built():
    with StandInServer() as srv:
        b = SGLangServerBackend(srv.url, srv.tokenizer, config=FAST)
        m = srv.model
        sid = b.open_session(4096)
        turn1 = [BOS_ID] + list(b"first")
        p = SamplingParams(max_new_tokens=4, temperature=0.7, seed=3, ignore_eos=True, return_logprob=True)
        out1 = b.run(turn1, p, rid="t1", session_params={"id": sid})
        turn2 = [BOS_ID] + list(b" next")
        out2 = b.run(turn2, p, rid="t2", session_params={"id": sid, "rid": "t1"})
        full = turn1 + list(out1.output_ids) + turn2[1:]  # history prepended, the new turn's BOS stripped
        assert out2.meta_info["prompt_tokens"] == len(full)
        score = srv.generate_bodies()[-1]
        assert score["input_ids"] == full + list(out2.output_ids) and "session_params" not in score
        assert score["logprob_start_len"] == len(full) - 1
        seq = list(full)
        for t, lp in zip(out2.output_ids, out2.output_logp0):
            assert lp == pytest.approx(m.logp0(seq)[t], abs=1e-12)
            seq.append(t)


@pytest.mark.parametrize("extra", [{"offset": -2}, {"drop_previous_output": True}, {"offset": 3},
                                   {"replace": True}])
def test_session_mirror_matches_the_server_for_offset_drop_and_replace(extra):
    with StandInServer() as srv:
        b = SGLangServerBackend(srv.url, srv.tokenizer, config=FAST)
        sid = b.open_session(4096)
        p = SamplingParams(max_new_tokens=3, temperature=0.5, seed=5, ignore_eos=True, return_logprob=True)
        b.run([BOS_ID] + list(b"abc"), p, rid="a", session_params={"id": sid})
        out = b.run([BOS_ID] + list(b"de"), p, rid="b", session_params={"id": sid, "rid": "a", **extra})
        score = srv.generate_bodies()[-1]
        assert score["input_ids"][: out.meta_info["prompt_tokens"]] == srv.sessions.sessions[sid].nodes["b"].input_ids


def test_a_session_the_client_did_not_open_cannot_be_scored():
    with StandInServer() as srv:
        b = SGLangServerBackend(srv.url, srv.tokenizer, config=FAST)
        sid = requests.post(srv.url + "/open_session", json={"capacity_of_str_len": 100}, timeout=5).json()
        p = SamplingParams(max_new_tokens=2, temperature=0.5, seed=1, return_logprob=True)
        with pytest.raises(SGLangServerError, match="did not see"):
            b.run([BOS_ID, 1], p, session_params={"id": sid, "rid": "elsewhere"})
        with pytest.raises(SGLangServerError, match="Invalid request session id"):  # the server aborts it too
            b.run([BOS_ID, 1], SamplingParams(max_new_tokens=1, seed=1), session_params={"id": sid, "rid": "x"})


# -- 4. bad output, bad requests ------------------------------------------------------------------
def test_nan_logprob_is_an_error_naming_the_request():
    with StandInServer() as srv:
        b = SGLangServerBackend(srv.url, srv.tokenizer, config=FAST)
        srv.fail("nan")
        with pytest.raises(SGLangServerError, match=r"null as log q .* rid=nan-1 \(prompt length 2 tokens\)"):
            b.run([BOS_ID, 4], SamplingParams(max_new_tokens=3, temperature=1.0, seed=1, return_logprob=True),
                  rid="nan-1")
    where = Where("http://x/generate", "r9", 5)
    with pytest.raises(SGLangServerError, match="nan as log p0 .* rid=r9"):
        finite_logprobs([0.0, float("nan")], "log p0", where)
    assert finite_logprobs([-1.0, -np.inf], "log p0", where) == (-1.0, -np.inf)


def test_seed_outside_int64_and_flashinfer_seed_with_top_k_are_rejected_client_side():
    with StandInServer() as srv:
        b = SGLangServerBackend(srv.url, srv.tokenizer, config=FAST)
        with pytest.raises(ValueError, match=r"seed must be in \[-2\*\*63, 2\*\*63 - 1\]"):
            b.run([BOS_ID, 1], SamplingParams(max_new_tokens=1, seed=2**63))
        b.run([BOS_ID, 1], SamplingParams(max_new_tokens=1, seed=2**63 - 1))  # the edge is fine
        r = requests.post(srv.url + "/generate", json={"input_ids": [BOS_ID], "sampling_params": {
            "max_new_tokens": 1, "sampling_seed": 2**63}}, timeout=5)
        assert r.status_code == 400 and "sampling_seed" in r.text  # what the server would have said
    with StandInServer(deterministic=True, sampling_backend="flashinfer") as srv:
        b = SGLangServerBackend(srv.url, srv.tokenizer, config=FAST)
        with pytest.raises(ValueError, match="flashinfer sampling backend"):
            b.run([BOS_ID, 1], SamplingParams(max_new_tokens=1, seed=3, top_k=20))
        b.run([BOS_ID, 1], SamplingParams(max_new_tokens=1, seed=3))  # no top-k/top-p: the simple sampler path
        b.run([BOS_ID, 1], SamplingParams(max_new_tokens=1, top_p=0.9))  # no seed
    assert not srv.generate_bodies() or all(b["sampling_params"].get("top_k", -1) == -1 or
                                            "sampling_seed" not in b["sampling_params"] for b in srv.generate_bodies())


# -- 5. request timeout ---------------------------------------------------------------------------
SERVER_COMMANDS = {
    "generate": ["generate", "--prompt", "hi", "--raw", "--max-tokens", "2"],
    "sample": ["sample", "--prompt", "hi", "--n", "6", "--K", "2"],
    "bench presto": ["bench", "presto", "--prompts", "1", "--n", "6", "--K", "3", "--npf", "4"],
    "eval": ["eval", "--datasets", "mmlu", "--methods", "greedy", "--limit", "1", "--n", "6"],
}


@pytest.mark.parametrize("command", sorted(SERVER_COMMANDS))
def test_every_server_backed_command_maps_request_timeout_to_the_client(command):
    from forerun.cli.engine import open_pool_from
    from forerun.cli.main import build_parser

    with StandInServer() as srv:
        args = build_parser().parse_args(SERVER_COMMANDS[command] + ["--backend", srv.url, "--request-timeout", "2.5"])
        with open_pool_from(args) as pool:
            assert [rt.engine.config.timeout_s for rt in pool.runtimes] == [2.5]
        default = build_parser().parse_args(SERVER_COMMANDS[command] + ["--backend", srv.url])
        with open_pool_from(default) as pool:
            assert [rt.engine.config.timeout_s for rt in pool.runtimes] == [ServerConfig().timeout_s]


@pytest.mark.parametrize("command", ["generate", "sample", "bench presto"])
def test_a_hung_request_fails_after_request_timeout_naming_the_url(command, capsys):
    """A hung /generate (the stand-in's "hang" mode) fails after --request-timeout with the URL in the message,
    instead of waiting the default 600 s (the stand-in hangs up after 60 s: another message)."""
    with StandInServer() as srv:
        srv.fail("hang", times=100)
        rc = main(SERVER_COMMANDS[command] + ["--backend", srv.url, "--request-timeout", "0.3"])
        last = capsys.readouterr().err.rstrip("\n").split("\n")[-1].split("\r")[-1]
    assert rc != 0 and last.startswith(f"forerun {command}: ")
    assert f"SGLang server {srv.url}/generate timed out after 0.3 s" in last


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_bad_request_timeout_is_a_one_line_usage_error(value, capsys):
    with pytest.raises(SystemExit) as ei:
        main(["generate", "--prompt", "hi", "--backend", "http://127.0.0.1:1", "--request-timeout", value])
    err = capsys.readouterr().err
    assert ei.value.code == 2 and err.count("\n") == 1 and "--request-timeout" in err and "> 0" in err
