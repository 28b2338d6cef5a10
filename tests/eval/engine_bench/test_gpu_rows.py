"""`bench gpu-rows`: its decode step is a real Llama / Qwen3 decode step (checked against transformers with the
same weights and cache), its fit is least squares, and bad settings are refused."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from forerun.eval.engine_bench.gpu_rows import SHAPES, DecodeStep, GpuRowsConfig, Shape, fit_line, run_gpu_rows

SCRIPT = Path(__file__).resolve().parents[3] / "eval" / "engine_bench" / "gpu_rows.py"


def _reference(kind: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=101, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  rope_parameters={"rope_type": "default", "rope_theta": 5000.0})
    torch.manual_seed(3)
    model = (LlamaForCausalLM(LlamaConfig(**common)) if kind == "llama" else
             Qwen3ForCausalLM(Qwen3Config(**common))).eval()
    for p in model.parameters():  # norms away from 1 so that a norm applied to the wrong tensor shows
        torch.nn.init.normal_(p, mean=1.0 if p.ndim == 1 else 0.0, std=0.3 if p.ndim == 1 else 0.05)
    shape = Shape(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=96, vocab=101,
                  rope_theta=5000.0, qk_norm=kind == "qwen3", rms_eps=1e-6)
    return model, shape


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_decode_step_equals_transformers_with_the_same_weights_and_cache(kind):
    model, shape = _reference(kind)
    rows, context = 3, 9
    prompts = torch.randint(0, shape.vocab, (rows, context - 1), generator=torch.Generator().manual_seed(1))
    nxt = torch.tensor([5, 17, 99])
    with torch.no_grad():
        cache = model(prompts, use_cache=True).past_key_values
        want = torch.log_softmax(model(nxt[:, None], cache=cache, use_cache=True).logits[:, -1].float(), -1)
    step = DecodeStep(shape, rows, context, "cpu", torch.float32)
    for i, (mine, layer) in enumerate(zip(step.layers, model.model.layers)):
        a, m = layer.self_attn, layer.mlp
        mine.update(norm1=layer.input_layernorm.weight.data, norm2=layer.post_attention_layernorm.weight.data,
                    qkv=torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).data, o=a.o_proj.weight.data,
                    gate_up=torch.cat([m.gate_proj.weight, m.up_proj.weight]).data, down=m.down_proj.weight.data)
        if kind == "qwen3":
            mine.update(q_norm=a.q_norm.weight.data, k_norm=a.k_norm.weight.data)
        step.kv[i, 0, :, :, :context - 1] = cache.layers[i].keys[:, :, :context - 1]
        step.kv[i, 1, :, :, :context - 1] = cache.layers[i].values[:, :, :context - 1]
    step.embed, step.final_norm, step.tokens = model.model.embed_tokens.weight.data, model.model.norm.weight.data, nxt
    with torch.no_grad():
        got, tempered = step()
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(tempered, torch.softmax(step.alpha * want, -1), atol=2e-5, rtol=1e-4)


def test_fit_is_least_squares_and_lambda_is_slope_over_intercept():
    rows = [1, 2, 4, 6, 20, 64]
    noise = [0.04, -0.05, 0.0, 0.01, 0.0]  # Σe = Σe·r = 0: least squares returns the line itself
    points = [{"rows": r, "step_ms": 2.0 + 0.05 * r + e} for r, e in zip(rows, noise)] + [{"rows": 64, "step_ms": 9.0}]
    fit = fit_line(points, up_to=20)
    assert fit["a_s"] == pytest.approx(2.0e-3, rel=1e-9) and fit["b_s"] == pytest.approx(0.05e-3, rel=1e-9)
    assert fit["row_cost"] == pytest.approx(0.05 / 2.0, rel=1e-9) and fit["rows_up_to"] == 20  # 64 rows left out
    falling = fit_line([{"rows": 1, "step_ms": 3.0}, {"rows": 2, "step_ms": 2.0}], up_to=2)
    assert falling["row_cost"] == 0.0  # a step that got faster with a row: λ counts as 0, never negative
    assert fit_line(points[:1], up_to=20)["b_s"] == 0.0


def test_shapes_count_the_models_parameters():
    assert SHAPES["smollm2-135m"].parameters() == 134_515_008 - 35_136  # transformers' count less the norms
    assert 4.0e9 < SHAPES["qwen3-4b"].parameters() < 4.1e9


def test_a_cpu_run_measures_every_row_count():
    out = run_gpu_rows(GpuRowsConfig(shapes=("smollm2-135m",), rows=(2, 1), context=8, repeats=1, device="cpu",
                                     dtype="float32"))
    (s,) = out["shapes"]
    assert [p["rows"] for p in s["points"]] == [1, 2] and s["points"][0]["x_one_row"] == 1.0
    assert all(p["step_ms"] > 0 for p in s["points"]) and out["meta"]["timing"] == "eager"
    assert out["meta"]["device_name"] == "cpu" and out["meta"]["context"] == 8


@pytest.mark.parametrize("bad", [dict(rows=(0,)), dict(shapes=("gpt-2",)), dict(context=0), dict(dtype="int8"),
                                 dict(device="tpu"), dict(device="cuda:x"), dict(device="cpu-ish")])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        GpuRowsConfig(**bad)


def test_a_step_larger_than_the_memory_is_refused_before_it_is_built():
    """--rows 10^8 grew to 10 GB before `timeout` ended it; --context 10^11 ended in the CPU allocator's
    RuntimeError (an internal error, exit 1).  The KV buffer of this one (10^17 entries, more than any address
    space) fails at once without the check, never filling the machine's memory."""
    with pytest.raises(ValueError, match=r"--rows 1000000000 --context 10000: a step of smollm2-135m holds .* more "
                                         r"than the .* GiB of cpu"):
        run_gpu_rows(GpuRowsConfig(rows=(10**9,), context=10**4, repeats=1, device="cpu"))


def test_the_file_runs_as_a_script_and_reports_a_missing_gpu_in_one_line():
    ok = subprocess.run([sys.executable, str(SCRIPT), "--rows", "1", "--context", "4", "--repeats", "1",
                         "--device", "cpu", "--dtype", "float32", "--json"], capture_output=True, text=True,
                        timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["shapes"][0]["shape"] == "smollm2-135m"
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    bad = subprocess.run([sys.executable, str(SCRIPT), "--rows", "1", "--device", "cuda"], capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "no CUDA device" in bad.stderr


def test_a_cuda_index_past_the_devices_is_refused(monkeypatch):
    """--device cuda:3 on a one-GPU machine ended in torch's error about the device id (an internal error)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"no CUDA device cuda:3 here \(torch sees 1\)"):
        run_gpu_rows(GpuRowsConfig(rows=(1,), context=8, repeats=1, device="cuda:3"))
