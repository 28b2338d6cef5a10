"""One decode step's sampling: a token for every row of the running batch, recorded on its request.

    paper / notion                              code
    log p0, H(p0) of each row's next token      next_token_log_probs(logits)  (sampling)
    y_t ~ q_τ at absolute position p = kv_len   draw_token(..., seed, position)  (sampling)
    rows that stop or fail at this step         sample_step(...) -> [(request, finish_reason, error)]
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..protocol import EngineError
from .output import stop_reason, top_entries
from .requests import Request
from .sampling import draw_token, logq_at_temperatures, next_token_log_probs

Finished = tuple[Request, dict[str, Any] | None, BaseException | None]
"""A row leaving the batch: (request, finish_reason, error) with exactly one of the last two set."""


def sample_step(rows: Sequence[Request], logits: torch.Tensor, *, vocab_size: int, eos_token_ids: Sequence[int],
                tokenizer: Any) -> list[Finished]:
    """Sample and record the next token of every row from its logits [B, V] (rows' kv_len already counts
    the fed token); return the rows that finish (stop / length) or fail (NaN logits, a sampling error)."""
    lg, logp0, ent, finite = next_token_log_probs(logits)
    finished: list[Finished] = []
    for i, r in enumerate(rows):
        if not finite[i]:
            finished.append((r, None, EngineError(
                f"request {r.rid}: the model produced NaN/inf logits at position {r.kv_len - 1}")))
            continue
        try:
            reason = sample_row(r, lg[i], logp0[i], ent[i], vocab_size=vocab_size, eos_token_ids=eos_token_ids,
                                tokenizer=tokenizer)
        except Exception as exc:
            finished.append((r, None, EngineError(f"request {r.rid}: sampling failed: {type(exc).__name__}: {exc}")))
            continue
        if reason is not None:
            finished.append((r, reason, None))
    return finished


def sample_row(r: Request, logits: torch.Tensor, logp0: torch.Tensor, entropy: float, *, vocab_size: int,
               eos_token_ids: Sequence[int], tokenizer: Any) -> dict[str, Any] | None:
    """Draw r's token at its absolute position r.kv_len, record it; the finish_reason when r stops here."""
    p = r.params
    token, logq = draw_token(logits, logp0, p, r.seed, r.kv_len)
    by_temperature = logq_at_temperatures(logits, token, p.logprob_temperatures) if p.logprob_temperatures else None
    top = None
    if p.top_logprobs_num > 0:
        top = top_entries(*torch.topk(logp0, min(p.top_logprobs_num, vocab_size)), tokenizer)
    r.record_token(token, logq, float(logp0[token]), float(entropy), by_temperature, top)
    return stop_reason(r, token, eos_token_ids, tokenizer)
