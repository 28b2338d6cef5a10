"""`forerun generate` / `forerun bench engine` on the tiny model."""

from __future__ import annotations

import functools
import json
import threading

import pytest

from forerun.cli.main import main
from forerun.eval.engine_bench import bench as engine_bench


def test_generate_json_is_seeded(capsys):
    argv = ["generate", "--prompt", "héllo ☃", "--model", "tiny", "--max-tokens", "6", "--seed", "3",
            "--ignore-eos", "--json"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    second = json.loads(capsys.readouterr().out)
    assert first["output_ids"] == second["output_ids"] and len(first["output_ids"]) == 6
    assert first["model"] == "tiny" and first["completion_tokens"] == 6
    assert len(first["output_token_entropy"]) == 6
    assert first["prompt_ids"][0] == 257  # chat template applied (<|im_start|>)


def test_generate_raw_text(capsys):
    assert main(["generate", "--prompt", "abc", "--model", "tiny", "--max-tokens", "3", "--raw", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.endswith("\n")


def test_generate_bad_input(capsys):
    assert main(["generate", "--prompt", "", "--model", "tiny"]) == 2
    assert main(["generate", "--prompt", "x", "--model", "/no/such/model"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["generate", "--prompt", "x", "--model", "tiny", "--max-tokens", "5000"]) == 2  # before any decode
    err = capsys.readouterr().err
    assert "--max-tokens 5000: prompt (" in err and "+ response (5000 tokens)" in err and "model context 2048" in err
    with pytest.raises(SystemExit):
        main(["generate", "--prompt", "x", "--temperature", "-1"])


def test_bench_engine_tiny_json(capfd, monkeypatch):
    # an 8 MiB bandwidth probe taken once, not 512 MiB re-taken until two readings agree (~20-60 s on a busy
    # machine): the report's shape is the point here; the re-runs are tests/eval/engine_bench/test_roofline.py's
    monkeypatch.setattr(engine_bench, "RooflineConfig",
                        functools.partial(engine_bench.RooflineConfig, bandwidth_mib=8, attempts=1))
    argv = ["bench", "engine", "--model", "tiny", "--root-tokens", "48", "--suffixes", "4", "--suffix-tokens", "8",
            "--decode-tokens", "8", "--constrained-rows", "4", "--repeats", "1", "--json"]
    assert main(argv) == 0
    out, err = capfd.readouterr()
    res = json.loads(out)
    assert "bench engine" not in err and "\r" not in err  # --json implies --quiet: no progress bar
    assert res["model"] == "tiny"
    assert res["fork"]["prefix_hit_rate"] > 0.9
    assert res["decode"]["speedup_vs_transformers_generate"] > 0
    assert res["fork"]["peak_kv_pool_tokens"] > 0
    roof = res["roofline"]  # (e): tokens/s against the bandwidth bound for 1, 6 and 20 rows
    assert [r["rows"] for r in roof["rows"]] == [1, 6, 20] and roof["bandwidth_gb_s"]["best"] > 0
    assert all(r["tokens_per_s"] > 0 and 0 < r["fraction_of_bound"] for r in roof["rows"])
    assert roof["kernels"] == "native" and roof["batch_invariant"]
    con = res["constrained"]  # (f): the same batch with none, half and all rows constrained
    assert con["constrained_rows"] == {"free": 0, "mixed": 2, "all": 4} and con["unconstrained_rows_identical"]
    assert all(con["step_s"][k] > 0 for k in ("free", "mixed", "all"))


# -- --backend URL: a launched SGLang server (the stand-in here) --------------------------------------
def test_generate_on_a_server_backend(capsys):
    from forerun.runtime_ext.standin.server import StandInServer

    with StandInServer() as srv:
        argv = ["generate", "--backend", srv.url, "--prompt", "hi", "--max-tokens", "5", "--seed", "7",
                "--temperature", "0.5", "--ignore-eos", "--model", "/ignored/with/backend", "--json"]
        assert main(argv) == 0
        out = json.loads(capsys.readouterr().out)
        bodies = srv.generate_bodies()
    assert out["backend"] == srv.url and out["model"] == "forerun-standin-byte-model"
    assert out["prompt_ids"] == srv.tokenizer.encode("hi") == bodies[0]["input_ids"]
    assert len(out["output_ids"]) == 5 and bodies[0]["sampling_params"]["sampling_seed"] == 7
    # log p0 from the server backend's scoring pass; a stock server reports no entropy
    assert len(out["output_token_logp0"]) == 5 and out["output_token_entropy"] is None


def test_a_tokenizer_that_does_not_load_is_bad_input_named_as_given(tmp_path, capsys, monkeypatch):
    """--tokenizer PATH that does not load was 'cannot load a tokenizer from PATH (reported by the SGLang server);
    pass tokenizer=... to SGLangServerBackend', exit 1: the user's input blamed on the server."""
    from forerun.runtime_ext.standin.server import StandInServer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    missing = str(tmp_path / "no-tokenizer")
    with StandInServer() as srv:
        rc = main(["generate", "--backend", srv.url, "--tokenizer", missing, "--prompt", "hi", "--max-tokens", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"forerun generate: cannot load the given tokenizer {missing!r} (")
    assert "reported by the SGLang server" not in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("seconds", ["1e300", "1e10"])
def test_a_request_timeout_no_socket_can_hold_is_refused(capsys, seconds):
    """--request-timeout 1e300 passed and ended in 'internal error: OverflowError: timestamp out of range for
    platform time_t' from the HTTP client's socket (exit 1)."""
    with pytest.raises(SystemExit) as ei:
        main(["generate", "--backend", "http://127.0.0.1:1", "--prompt", "hi", "--request-timeout", seconds])
    err = capsys.readouterr().err
    limit = f"{threading.TIMEOUT_MAX:.0f}"  # 9223372036 on Linux
    assert ei.value.code == 2 and f"argument --request-timeout: expected at most {limit} seconds, got {seconds}" in err
    from forerun.runtime_ext.backends.server_config import ServerConfig

    with pytest.raises(ValueError, match="timeout_s must be > 0 and at most"):
        ServerConfig(timeout_s=float(seconds))


def test_unreachable_backend_is_a_one_line_error(capsys):
    from forerun.runtime_ext.standin.server import unused_port

    url = f"http://127.0.0.1:{unused_port()}"
    assert main(["generate", "--backend", url, "--prompt", "hi"]) != 0
    err = capsys.readouterr().err
    assert err.startswith("forerun generate: ") and url in err
    assert err.count("\n") == 1 and "Traceback" not in err
    with pytest.raises(SystemExit) as ei:  # a usage error, found by argparse
        main(["generate", "--backend", "localhost:1", "--prompt", "hi"])
    assert ei.value.code == 2 and "http://" in capsys.readouterr().err
