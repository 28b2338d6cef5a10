"""The forerun sampler plugin (issue 9, point 5): its hook around Sampler.forward, its batch-row bookkeeping,
SGLang's real Sampler on CPU tensors (when the CPU runtime packages are there), and the client reading its
fields so that EntropyCut and MultiTryMH run on a server (the fake, started with the plugin)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from forerun.cli.main import main
from forerun.runtime_ext.backends import sglang_plugin as plugin
from forerun.runtime_ext.backends.server import SGLangServerBackend
from forerun.runtime_ext.backends.server_client import ServerConfig, SGLangServerError
from forerun.runtime_ext.protocol import SamplingParams
from forerun.testing.fake_sglang_server import BOS_ID, FakeSGLangServer

REPO = Path(__file__).resolve().parents[3]
CPU_RUNTIME = REPO / ".forerun-cache" / "sglang-cpu-runtime"
ASK = {"forerun_plugin": True, "forerun_logq_temperatures": [1.0, 0.25]}


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def _expected(raw: np.ndarray, token: int, temps) -> tuple[float, float, list[float]]:
    lp = _log_softmax(raw.astype(np.float64))
    return float(lp[token]), float(-(np.exp(lp) * lp).sum()), [float(_log_softmax(raw / t)[token]) for t in temps]


def _sglang_like_original(sampler, logits_output, sampling_info, *rest):
    """What SGLang's Sampler.forward does to its input: divides the logits by τ and softmaxes them in place."""
    z = logits_output.next_token_logits
    z.div_(sampling_info.temperatures)
    z[:] = torch.softmax(z, dim=-1)
    return torch.argmax(z, dim=-1)


def test_hook_reports_fields_of_the_raw_logits_for_asking_rows_only():
    rng = np.random.default_rng(0)
    raw = rng.normal(size=(4, 11)).astype(np.float32)
    custom = [ASK, None, {"forerun_plugin": True}, {"other": 1}]
    info = SimpleNamespace(custom_params=custom, temperatures=torch.tensor([[0.5], [1.0], [2.0], [0.7]]))
    out = SimpleNamespace(next_token_logits=torch.tensor(raw), customized_info={"kept": [1, 2, 3, 4]})
    ids = plugin.sampler_forward_hook(_sglang_like_original, None, out, info, False, [], [], None).tolist()
    ci = out.customized_info
    assert ci["kept"] == [1, 2, 3, 4]  # another producer's key survives
    for row, temps in ((0, [1.0, 0.25]), (2, [])):
        lp0, h, lq = _expected(raw[row], ids[row], temps)
        assert ci[plugin.LOGP0_KEY][row] == pytest.approx(lp0, abs=1e-5)
        assert ci[plugin.ENTROPY_KEY][row] == pytest.approx(h, abs=1e-5)
        assert ci[plugin.LOGQ_BY_TEMPERATURE_KEY][row] == pytest.approx(lq, abs=1e-5)
    for row in (1, 3):
        assert all(ci[k][row] is None for k in (plugin.LOGP0_KEY, plugin.ENTROPY_KEY, plugin.LOGQ_BY_TEMPERATURE_KEY))


def test_hook_costs_nothing_when_no_row_asked():
    out = SimpleNamespace(next_token_logits=torch.zeros(2, 5), customized_info=None)
    info = SimpleNamespace(custom_params=None, temperatures=torch.ones(2, 1))
    plugin.sampler_forward_hook(_sglang_like_original, None, out, info, False, [], [], None)
    assert out.customized_info is None


def test_row_bookkeeping_follows_filter_and_merge():
    class Info(SimpleNamespace):
        def __len__(self):
            return self.n

    def sglang_filter(info, keep, *_):  # SGLang drops custom_params when no custom logit processor is left
        info.n, info.custom_params = len(keep), None

    def sglang_merge(info, other, *_):
        info.n += other.n

    a = Info(n=0, custom_params=None)
    plugin.keep_custom_params(None, a, SimpleNamespace(reqs=[SimpleNamespace(sampling_params=SimpleNamespace(
        custom_params=p)) for p in (None, ASK, None)]), 10)
    a.n = 3
    assert a.custom_params == [None, ASK, None]
    plugin.filter_custom_params(sglang_filter, a, [1, 2], None)
    assert a.custom_params == [ASK, None]
    plugin.merge_custom_params(sglang_merge, a, Info(n=2, custom_params=None))
    assert a.custom_params == [ASK, None, None, None] and len(a) == 4
    quiet = Info(n=1, custom_params=None)
    plugin.keep_custom_params(None, quiet, SimpleNamespace(reqs=[SimpleNamespace(sampling_params=SimpleNamespace(
        custom_params={"x": 1}))]), 10)
    assert quiet.custom_params is None  # no row asked: SGLang's own behaviour is untouched


def test_register_does_nothing_without_the_switch(monkeypatch):
    monkeypatch.delenv(plugin.PLUGIN_ENV, raising=False)
    plugin.register()  # would import sglang.srt (absent here) if it did anything


@pytest.mark.skipif(not CPU_RUNTIME.is_dir(), reason="SGLang's CPU runtime packages are not installed: "
                    "FORERUN_SGLANG_CPU_RUNTIME=1 scripts/setup")
def test_the_plugin_inside_sglangs_real_sampler_on_cpu():
    rng = np.random.default_rng(1)
    raw = rng.normal(size=(3, 9)).round(3)
    spec = {"logits": raw.tolist(), "temperatures": [0.5, 1.0, 2.0], "positions": [5, 6, 7],
            "custom": [ASK, None, {"forerun_plugin": True}]}
    env = {k: v for k, v in os.environ.items() if k != plugin.PLUGIN_ENV}
    res = subprocess.run([sys.executable, str(Path(__file__).with_name("sglang_cpu_sampler.py")), str(CPU_RUNTIME),
                          json.dumps(spec)], capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["hooked"] and got["scaled_in_place"] and got["server_info_announces"]
    ci = got["customized_info"]
    for row, temps in ((0, [1.0, 0.25]), (2, [])):
        lp0, h, lq = _expected(raw[row].astype(np.float32), got["token_ids"][row], temps)
        assert ci[plugin.LOGP0_KEY][row] == pytest.approx(lp0, abs=1e-5)
        assert ci[plugin.ENTROPY_KEY][row] == pytest.approx(h, abs=1e-5)
        assert ci[plugin.LOGQ_BY_TEMPERATURE_KEY][row] == pytest.approx(lq, abs=1e-5)
    assert ci[plugin.LOGP0_KEY][1] is None
    assert got["custom_params_after_copy"] == spec["custom"]
    assert got["custom_params_after_filter"] == [ASK, {"forerun_plugin": True}]
    assert got["custom_params_after_merge"] == [ASK, {"forerun_plugin": True}, None]


# -- the client side ---------------------------------------------------------------------------------
def test_client_asks_the_plugin_and_reads_one_pass():
    with FakeSGLangServer(plugin=True) as srv:
        b = SGLangServerBackend(srv.url, srv.tokenizer)
        p = SamplingParams(max_new_tokens=4, temperature=0.5, seed=5, ignore_eos=True, return_logprob=True,
                           logprob_temperatures=(1.0, 0.25))
        out = b.run([BOS_ID, 10, 20], p)
        (body,) = srv.generate_bodies()  # one pass: no scoring request
        assert body["sampling_params"]["custom_params"] == ASK
        seq = [BOS_ID, 10, 20]
        rows = out.meta_info["output_token_logq_by_temperature"]
        for t, (tok, lp, h) in enumerate(zip(out.output_ids, out.output_logp0, out.output_entropy)):
            assert lp == pytest.approx(srv.model.logp0(seq)[tok], abs=1e-12)
            assert h == pytest.approx(srv.model.entropy(seq), abs=1e-12)
            assert [rows[0][t], rows[1][t]] == pytest.approx([srv.model.logq(seq, 1.0)[tok],
                                                              srv.model.logq(seq, 0.25)[tok]], abs=1e-12)
            seq.append(tok)
        stock = SGLangServerBackend(srv.url, srv.tokenizer, config=ServerConfig(use_plugin=False))
        again = stock.run([BOS_ID, 10, 20], SamplingParams(max_new_tokens=4, temperature=0.5, seed=5,
                                                           ignore_eos=True, return_logprob=True))
        assert again.output_logp0 == pytest.approx(out.output_logp0, abs=1e-12)  # the exact two-pass recipe agrees
        assert "custom_params" not in srv.generate_bodies()[1]["sampling_params"] and again.output_entropy is None
    with FakeSGLangServer() as stock_srv:
        with pytest.raises(SGLangServerError, match="launch_runtime --plugin"):
            SGLangServerBackend(stock_srv.url, stock_srv.tokenizer).run([BOS_ID, 1], p)


@pytest.mark.parametrize("sampler", ["entropy-cut", "multitry-mh", "power-mh"])
def test_samplers_run_on_a_plugin_server_and_presto_chains_are_identical(sampler, capsys):
    with FakeSGLangServer(plugin=True) as srv:
        argv = ["sample", "--backend", srv.url, "--sampler", sampler, "--prompt", "hi", "--n", "8", "--K", "4",
                "--json"]
        assert main(argv) == 0
        seq = json.loads(capsys.readouterr().out)
        assert main(argv + ["--presto"]) == 0
        pre = json.loads(capsys.readouterr().out)
        assert all("custom_params" in b["sampling_params"] for b in srv.generate_bodies())
    assert seq["response_ids"] == pre["response_ids"] and seq["history"] == pre["history"]
    assert seq["confidence"] is not None  # the plugin reports the entropy of p0 (Eq. 22 is defined)
