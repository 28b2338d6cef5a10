"""One decode step's sampling: a token for every row of the running batch, recorded on its request.

    paper / notion                              code
    log p0, H(p0) of each row's next token      vocab_stats(logits)  (sampling)
    y_t ~ q_τ at absolute position p = kv_len   draw_tokens(stats, [(row, params, seed, p)])  (sampling)
    y_t ~ q_τ restricted to the grammar's A_t   draw_constrained(stats, [(row, grammar, banned, params, seed, p)])
    less the banned tokens (EOS and the stop    (grammar; the constrained rows and those under min_new_tokens
    ids before min_new_tokens)                  only; banned = output.banned_tokens)
    log q_τ'(y_t | ·) at extra τ'               log_totals(stats, rows, τ')  (sampling)
    rows that stop or fail at this step         sample_step(...) -> [(request, finish_reason, error)]
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..protocol import EngineError
from .output import banned_tokens, stop_reason, top_entries
from .grammar import draw_constrained
from .requests import Request
from .sampling import VocabStats, draw_tokens, log_totals, vocab_stats

Finished = tuple[Request, dict[str, Any] | None, BaseException | None]
"""A row leaving the batch: (request, finish_reason, error) with exactly one of the last two set."""


def sample_step(rows: Sequence[Request], logits: torch.Tensor, *, vocab_size: int, eos_token_ids: Sequence[int],
                tokenizer: Any, kernels: Any = None) -> list[Finished]:
    """Sample and record the next token of every row from its logits [B, V] (rows' kv_len already counts
    the fed token); return the rows that finish (stop / length) or fail (NaN logits, a sampling error)."""
    stats = vocab_stats(logits, kernels)
    live = [i for i in range(len(rows)) if stats.finite[i]]
    banned = {i: banned_tokens(rows[i], eos_token_ids, vocab_size) for i in live}
    restricted = [i for i in live if rows[i].grammar is not None or banned[i]]
    draws = draw_tokens(stats, [(i, rows[i].params, rows[i].seed, rows[i].kv_len) for i in live
                                if i not in restricted])
    draws.update(draw_constrained(stats, [(i, rows[i].grammar, banned[i], rows[i].params, rows[i].seed,
                                           rows[i].kv_len) for i in restricted]))
    finished: list[Finished] = []
    for i, r in enumerate(rows):
        if not stats.finite[i]:
            finished.append((r, None, EngineError(
                f"request {r.rid}: the model produced NaN/inf logits at position {r.kv_len - 1}")))
            continue
        try:
            drawn = draws[i]
            if isinstance(drawn, Exception):
                raise drawn
            reason = record_row(r, stats, i, *drawn, vocab_size=vocab_size, eos_token_ids=eos_token_ids,
                                tokenizer=tokenizer)
        except Exception as exc:
            finished.append((r, None, EngineError(f"request {r.rid}: sampling failed: {type(exc).__name__}: {exc}")))
            continue
        if reason is not None:
            finished.append((r, reason, None))
    return finished


def record_row(r: Request, stats: VocabStats, i: int, token: int, logq: float, *, vocab_size: int,
               eos_token_ids: Sequence[int], tokenizer: Any) -> dict[str, Any] | None:
    """Record r's drawn token (row i of the step) with its per-token quantities (log q as drawn: of the masked
    distribution for a constrained row; log p0, entropy, top-k and log q_τ' of the raw logits); advance r's
    grammar; the finish_reason when r stops here."""
    p = r.params
    by_temperature = None
    if p.logprob_temperatures:
        temps = list(p.logprob_temperatures)
        by_temperature = [stats.logq(i, token, t, lt) for t, lt in zip(temps, log_totals(stats, [i] * len(temps), temps))]
    top = None
    if p.top_logprobs_num > 0:
        top = top_entries(*stats.top(i, min(p.top_logprobs_num, vocab_size)), tokenizer)
    r.record_token(token, logq, stats.logp0(i, token), float(stats.entropy[i]), by_temperature, top)
    if r.grammar is not None:
        r.grammar.accept(token)
    return stop_reason(r, token, eos_token_ids, tokenizer)
