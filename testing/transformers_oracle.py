"""transformers' own forward as the oracle of the engine's forwards, computed in the model's dtype throughout."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def norms_in_model_dtype() -> Iterator[None]:
    """transformers' LlamaRMSNorm computes in float32 even in a float64 model (an upcast meant for fp16);
    the engine's float64 forward computes it in float64, and so does the oracle (the rest of transformers'
    forward - attention, RoPE, MLP - is unchanged)."""
    from transformers.models.llama import modeling_llama

    original = modeling_llama.LlamaRMSNorm.forward

    def forward(self, h):
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    modeling_llama.LlamaRMSNorm.forward = forward
    try:
        yield
    finally:
        modeling_llama.LlamaRMSNorm.forward = original
