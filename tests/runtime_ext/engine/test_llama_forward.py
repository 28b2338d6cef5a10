"""The lean forward (its layer loop runs natively) against transformers' own forward, on a tiny Llama whose norm
weights are distinct per layer and per position: a freshly initialised RMSNorm weight is all ones, so a loop that
used the wrong norm, or a layer's weights out of order, would still match an unmodified tiny model."""

import pytest
import torch

from forerun.runtime_ext.engine import native
from forerun.runtime_ext.engine.llama_forward import LeanForward
from forerun.runtime_ext.engine.models import build_tiny_model
from forerun.testing.transformers_oracle import norms_in_model_dtype

K = native.kernels()
pytestmark = pytest.mark.skipif(K is None, reason="native kernels unavailable (no C++ compiler)")


def distinct_norms(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_((1 + 0.5 * torch.randn(p.shape, generator=g, dtype=torch.float64)).to(p.dtype))
    return model


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_lean_forward_matches_transformers_prefill_then_decode(dtype, tol):
    model = distinct_norms(build_tiny_model(dtype, num_layers=3).model, seed=5)
    lean = LeanForward(model, K)
    rows, T = 2, 9
    ids = torch.randint(0, 256, (rows, T + 1), generator=torch.Generator().manual_seed(6))
    with torch.no_grad(), norms_in_model_dtype():
        ref = model(ids).logits.to(lean.dtype)  # [rows, T + 1, V]
    layers = model.config.num_hidden_layers
    kv, d = model.config.num_key_value_heads, model.config.hidden_size // model.config.num_attention_heads
    buf = torch.zeros(layers, 2, rows, kv, T + 4, d, dtype=lean.dtype)
    pos = torch.arange(T).expand(rows, T)
    prefill = lean.forward(buf, 0, ids[:, :T], pos, T, [0] * rows)  # all T positions' logits
    torch.testing.assert_close(prefill, ref[:, :T], atol=tol, rtol=0)
    step = lean.forward(buf, T, ids[:, T:], torch.full((rows, 1), T), 1, [0] * rows)  # one decode step on the KV
    torch.testing.assert_close(step[:, 0], ref[:, T], atol=tol, rtol=0)
