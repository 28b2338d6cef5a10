"""The forerun sampler plugin (issue 9, point 5; issue 29, point 4): its hook around Sampler.forward (one batched
computation and one device-to-host copy per step), its batch-row bookkeeping, another client's meta_info left
exactly as it was (SGLang's own collection, output-streamer and meta_info code, read from the installed source),
SGLang's real Sampler on CPU tensors (when the CPU runtime packages are there), and the client reading its fields
so that EntropyCut and MultiTryMH run on a server (the stand-in, started with the plugin).  Where torch sees a CUDA
device the hook and the real Sampler also run on CUDA tensors (the real Sampler then needs SGLang's full runtime,
sgl_kernel included: on a CUDA machine sglang.srt imports it)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from forerun.cli.main import main
from forerun.runtime_ext.backends import sglang_plugin as plugin
from forerun.runtime_ext.backends.server import SGLangServerBackend
from forerun.runtime_ext.backends.server_client import ServerConfig, SGLangServerError
from forerun.runtime_ext.protocol import SamplingParams
from forerun.runtime_ext.standin.server import BOS_ID, StandInServer
from forerun.testing.test_modules import sibling

REPO = Path(__file__).resolve().parents[3]
CPU_RUNTIME = Path(os.environ.get("FORERUN_SGLANG_RUNTIME_DIR") or REPO / ".forerun-cache" / "sglang-cpu-runtime")
"""The packages SGLang's sampler module needs beyond the frontend (FORERUN_SGLANG_CPU_RUNTIME=1 scripts/setup);
FORERUN_SGLANG_RUNTIME_DIR names another folder (a GPU machine's, where they were carried as wheels)."""
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                reason="no CUDA device here"))]
ASK = {"forerun_plugin": True, "forerun_logq_temperatures": [1.0, 0.25]}



src = sibling(__file__, "sglang_source")


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


def _run_hook(raw: np.ndarray, custom: list, temperatures: list[float], logits: torch.Tensor | None = None,
              device: str = "cpu"):
    info = SimpleNamespace(custom_params=plugin.asking_rows(custom),
                           temperatures=torch.tensor(temperatures, device=device).view(-1, 1))
    out = SimpleNamespace(next_token_logits=torch.tensor(raw, device=device) if logits is None else logits,
                          customized_info={"kept": list(range(len(custom)))})
    ids = plugin.sampler_forward_hook(_sglang_like_original, None, out, info, False, [], [], None)
    return [int(i) for i in torch.Tensor.tolist(ids.as_subclass(torch.Tensor))], out.customized_info


@pytest.mark.parametrize("device", DEVICES)
def test_hook_reports_fields_of_the_raw_logits_for_asking_rows(device):
    rng = np.random.default_rng(0)
    raw = rng.normal(size=(5, 11)).astype(np.float32)
    custom = [ASK, None, {"forerun_plugin": True}, {"other": 1}, {"forerun_plugin": True,
                                                                 "forerun_logq_temperatures": [0.5]}]
    ids, ci = _run_hook(raw, custom, [0.5, 1.0, 2.0, 0.7, 1.3], device=device)
    assert ci["kept"] == [0, 1, 2, 3, 4]  # another producer's key survives
    for row, temps in ((0, [1.0, 0.25]), (2, []), (4, [0.5])):
        lp0, h, lq = _expected(raw[row], ids[row], temps)
        assert ci[plugin.LOGP0_KEY][row] == pytest.approx(lp0, abs=1e-5)
        assert ci[plugin.ENTROPY_KEY][row] == pytest.approx(h, abs=1e-5)
        assert ci[plugin.LOGQ_BY_TEMPERATURE_KEY][row] == pytest.approx(lq, abs=1e-5)  # as many as it asked for
    every = [ASK, {"forerun_plugin": True, "forerun_logq_temperatures": [2.0, 0.5]}]
    ids, ci = _run_hook(raw[:2], every, [0.5, 1.0], device=device)
    for row, temps in ((0, [1.0, 0.25]), (1, [2.0, 0.5])):
        lp0, h, lq = _expected(raw[row], ids[row], temps)
        assert [ci[plugin.LOGP0_KEY][row], ci[plugin.ENTROPY_KEY][row]] == pytest.approx([lp0, h], abs=1e-5)
        assert ci[plugin.LOGQ_BY_TEMPERATURE_KEY][row] == pytest.approx(lq, abs=1e-5)


class OnDevice(torch.Tensor):
    """A tensor standing for one on the accelerator: every torch call made on it is counted, and `.cpu()` (the
    device-to-host copy) gives a plain tensor."""

    calls: collections.Counter = collections.Counter()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", repr(func))
        cls.calls[name] += 1
        out = super().__torch_function__(func, types, args, kwargs or {})
        if name == "cpu":
            with torch._C.DisableTorchFunctionSubclass():
                return out.as_subclass(torch.Tensor)
        return out


HOST_COPIES = ("cpu", "to", "tolist", "item", "numpy", "__float__", "__int__", "__bool__", "__index__")


def _device_calls(rows: int, asking_every: int) -> collections.Counter:
    rng = np.random.default_rng(rows)
    custom = [(ASK if i % 3 else {"forerun_plugin": True, "forerun_logq_temperatures": [0.5]})
              if i % asking_every == 0 else None for i in range(rows)]
    raw = rng.normal(size=(rows, 50)).astype(np.float32)
    OnDevice.calls.clear()
    _run_hook(raw, custom, [0.8] * rows, logits=torch.tensor(raw).as_subclass(OnDevice))
    return collections.Counter(OnDevice.calls)


def test_one_batched_computation_and_one_host_copy_per_step_whatever_the_batch():
    """Per decode step the hook makes the same device calls for 4 rows as for 60 (no loop over requests) and
    moves its results to the host once."""
    small, large = _device_calls(4, 2), _device_calls(60, 2)
    assert small == large
    assert {k: small[k] for k in HOST_COPIES if small[k]} == {"cpu": 1}
    assert _device_calls(6, 1) == _device_calls(30, 1)  # every row asked: the same, without the row gather


def test_hook_costs_nothing_when_no_row_asked():
    out = SimpleNamespace(next_token_logits=torch.zeros(2, 5), customized_info=None)
    info = SimpleNamespace(custom_params=plugin.asking_rows([None, {"x": 1}]), temperatures=torch.ones(2, 1))
    assert info.custom_params is None
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
    assert a.custom_params == [None, ASK, None] and a.custom_params.rows == (1,)
    plugin.filter_custom_params(sglang_filter, a, [1, 2], None)
    assert a.custom_params == [ASK, None] and a.custom_params.rows == (0,)
    plugin.merge_custom_params(sglang_merge, a, Info(n=2, custom_params=[None, {"forerun_plugin": True}]))
    assert a.custom_params == [ASK, None, None, {"forerun_plugin": True}] and len(a) == 4
    assert a.custom_params.rows == (0, 3) and a.custom_params.temperatures == ((1.0, 0.25), ())
    quiet = Info(n=1, custom_params=None)
    plugin.keep_custom_params(None, quiet, SimpleNamespace(reqs=[SimpleNamespace(sampling_params=SimpleNamespace(
        custom_params={"x": 1}))]), 10)
    assert quiet.custom_params is None  # no row asked: SGLang's own behaviour is untouched


# -- another client's meta_info: SGLang's own code from the scheduler to the HTTP answer ---------------------
BATCH_RESULT = "srt/managers/scheduler_components/batch_result_processor.py"
STREAMER = "srt/managers/scheduler_components/output_streamer.py"
TOKENIZER = "srt/managers/tokenizer_manager.py"
PINNED = {  # the lines the pipeline below runs (a version bump that moves them fails here first)
    (BATCH_RESULT, 192): "def _maybe_collect_customized_info(",
    (STREAMER, 687): "current_output_len = len(self.output_ids[-1])",
    (STREAMER, 715): "else [None] * current_output_len",  # a request without a key gets None padding
    (TOKENIZER, 2823): "def update_request_meta_info(",
}


def _around(hook: Any, original: Any) -> Any:
    return lambda *args, **kwargs: hook(original, *args, **kwargs)  # as HookRegistry applies an AROUND hook


def _pipeline(order: str, hooked: bool) -> tuple[dict[str, dict], dict[str, Any], list[list[int]]]:
    """Three decode steps of a batch [A asks, B does not], SGLang's collection per request, one output batch
    (in `order`) through SGLang's output streamer, then SGLang's meta_info per request."""
    assert {(p, n): src.line(p, n) for p, n in PINNED} == PINNED
    collect = src.compile_function(src.method_def(BATCH_RESULT, "SchedulerBatchResultProcessor",
                                                  "_maybe_collect_customized_info"), {"torch": torch}, BATCH_RESULT)
    pad = src.compile_statements(STREAMER, 687, 716, "self, req, send_token_offset, output_ids_", {})
    update = src.compile_function(src.method_def(TOKENIZER, "TokenizerManager", "update_request_meta_info"), {},
                                  TOKENIZER)
    accumulate = src.compile_function(src.method_def(TOKENIZER, "TokenizerManager", "_accumulate_request_meta_info"),
                                      {}, TOKENIZER)
    if hooked:
        collect = _around(plugin.collect_for_asking_requests, collect)
        update = _around(plugin.meta_info_for_asking_requests, update)
    manager = type("TokenizerManager", (), {"update_request_meta_info": update,
                                            "_accumulate_request_meta_info": staticmethod(accumulate)})()
    custom = {"A": ASK, "B": None}
    reqs = {name: SimpleNamespace(sampling_params=SimpleNamespace(custom_params=c), customized_info=None,
                                  output_ids=[], stream=False, finished=lambda: True) for name, c in custom.items()}
    plan = plugin.asking_rows([custom["A"], custom["B"]])
    rng = np.random.default_rng(3)
    logits = []
    for _ in range(3):
        raw = rng.normal(size=(2, 9)).astype(np.float32)
        logits.append(raw)
        out = SimpleNamespace(next_token_logits=torch.tensor(raw), customized_info=None)
        ids = plugin.sampler_forward_hook(_sglang_like_original, None, out, SimpleNamespace(
            custom_params=plan, temperatures=torch.tensor([[0.7], [1.0]])), False, [], [], None).tolist()
        for i, name in enumerate("AB"):
            reqs[name].output_ids.append(ids[i])
            collect(None, i, reqs[name], out)
    streamer = SimpleNamespace(output_ids=[], customized_info={}, is_request_level_customized_info_key=lambda k: False)
    for name in order:
        streamer.output_ids.append(list(reqs[name].output_ids))
        pad(streamer, reqs[name], 0, reqs[name].output_ids)
    metas = {}
    for i, name in enumerate(order):
        meta = {"id": name, "finish_reason": {"type": "length", "length": 3}}
        state = SimpleNamespace(obj=SimpleNamespace(sampling_params={"max_new_tokens": 3, **(
            {"custom_params": custom[name]} if custom[name] else {})}), customized_info_accumulated={},
            customized_info_reported_keys=set())
        if streamer.customized_info:  # the batch carries customized_info at all (tokenizer_manager)
            manager.update_request_meta_info(meta, state, streamer.customized_info, i, None)
        metas[name] = meta
    return metas, reqs, logits


@pytest.mark.parametrize("order", ["AB", "BA"])
def test_another_clients_meta_info_is_unchanged(order):
    metas, reqs, logits = _pipeline(order, hooked=True)
    assert metas["B"] == {"id": "B", "finish_reason": {"type": "length", "length": 3}}  # as without the plugin
    assert reqs["B"].customized_info is None  # the scheduler kept nothing for it either
    a = metas["A"]
    assert set(a) >= set(plugin.PLUGIN_KEYS) and all(len(a[k]) == 3 for k in plugin.PLUGIN_KEYS)
    for t, (raw, tok) in enumerate(zip(logits, reqs["A"].output_ids)):
        lp0, h, lq = _expected(raw[0], tok, [1.0, 0.25])
        assert [a[plugin.LOGP0_KEY][t], a[plugin.ENTROPY_KEY][t]] == pytest.approx([lp0, h], abs=1e-5)
        assert a[plugin.LOGQ_BY_TEMPERATURE_KEY][t] == pytest.approx(lq, abs=1e-5)
    leaked, _, _ = _pipeline(order, hooked=False)  # what SGLang alone does with the sampler's columns
    assert set(plugin.PLUGIN_KEYS) <= set(leaked["B"])


def test_register_does_nothing_without_the_switch(monkeypatch):
    monkeypatch.delenv(plugin.PLUGIN_ENV, raising=False)
    plugin.register()  # would import sglang.srt (absent here) if it did anything


@pytest.mark.skipif(not CPU_RUNTIME.is_dir(), reason="SGLang's CPU runtime packages are not installed: "
                    "FORERUN_SGLANG_CPU_RUNTIME=1 scripts/setup")
@pytest.mark.parametrize("device", DEVICES)
def test_the_plugin_inside_sglangs_real_sampler(device):
    rng = np.random.default_rng(1)
    raw = rng.normal(size=(3, 9)).round(3)
    spec = {"logits": raw.tolist(), "temperatures": [0.5, 1.0, 2.0], "positions": [5, 6, 7],
            "custom": [ASK, None, {"forerun_plugin": True}]}
    env = {k: v for k, v in os.environ.items() if k != plugin.PLUGIN_ENV}
    res = subprocess.run([sys.executable, str(Path(__file__).with_name("sglang_cpu_sampler.py")), str(CPU_RUNTIME),
                          json.dumps(spec), device], capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["hooked"] and got["scaled_in_place"] and got["server_info_announces"]
    assert got["token_device"].split(":")[0] == device
    keys = sorted(plugin.PLUGIN_KEYS)
    assert got["collected"] == {"0": keys, "1": None, "2": keys}  # SGLang's real collection, hooked
    ci = got["customized_info"]
    for row, temps in ((0, [1.0, 0.25]), (2, [])):
        lp0, h, lq = _expected(raw[row].astype(np.float32), got["token_ids"][row], temps)
        assert ci[plugin.LOGP0_KEY][row] == pytest.approx(lp0, abs=1e-5)
        assert ci[plugin.ENTROPY_KEY][row] == pytest.approx(h, abs=1e-5)
        assert ci[plugin.LOGQ_BY_TEMPERATURE_KEY][row] == pytest.approx(lq, abs=1e-5)
    assert got["custom_params_after_copy"] == spec["custom"]
    assert got["custom_params_after_filter"] == [ASK, {"forerun_plugin": True}]
    assert got["custom_params_after_merge"] == [ASK, {"forerun_plugin": True}, None]


# -- the client side ---------------------------------------------------------------------------------
def test_client_asks_the_plugin_and_reads_one_pass():
    with StandInServer(plugin=True) as srv:
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
    with StandInServer() as stock_srv:
        with pytest.raises(SGLangServerError, match="launch_runtime --plugin"):
            SGLangServerBackend(stock_srv.url, stock_srv.tokenizer).run([BOS_ID, 1], p)


@pytest.mark.parametrize("sampler", ["entropy-cut", "multitry-mh", "power-mh"])
def test_samplers_run_on_a_plugin_server_and_presto_chains_are_identical(sampler, capsys):
    with StandInServer(plugin=True) as srv:
        argv = ["sample", "--backend", srv.url, "--sampler", sampler, "--prompt", "hi", "--n", "8", "--K", "4",
                "--json"]
        assert main(argv) == 0
        seq = json.loads(capsys.readouterr().out)
        assert main(argv + ["--presto"]) == 0
        pre = json.loads(capsys.readouterr().out)
        assert all("custom_params" in b["sampling_params"] for b in srv.generate_bodies())
    assert seq["response_ids"] == pre["response_ids"] and seq["history"] == pre["history"]
    assert seq["confidence"] is not None  # the plugin reports the entropy of p0 (Eq. 22 is defined)
