"""Finishing a generation: stop conditions and the SGLang-shaped result of the embedded engine.

    paper / notion                        meta_info key (GenerateOutput field)
    y_t, log q_τ(y_t | y_<t)              output_token_logprobs [[log q, id, text], ...] (output_logq)
    log p0(y_t | y_<t) (raw logits)       output_token_logp0 (output_logp0)
    H(p0(· | y_<t)), natural log          output_token_entropy (output_entropy)
    top-k of p0                           output_top_logprobs
    log q_τ'(y_t | ·) at extra τ'         output_token_logq_by_temperature[τ' index][t]
    log p0(x_j | x_<j) from s (scoring)   input_token_logprobs, input_token_entropy (input_logp0, ...)

Stopping: EOS (unless `ignore_eos`) and `stop_token_ids` end a generation and are kept in output_ids;
a stop string ends it and the text is cut before the string (output_ids keep the token that completed it,
as SGLang does); a `stop_regex` pattern ends it at the first token after which `re.search` finds it in the output
text, the text kept whole (SGLang's finish at the shortest matching prefix; it trims only stop strings); before
`min_new_tokens` tokens none of these stop a request (nothing is masked, so q_τ is
unchanged).  A constrained request (grammar) also finishes when its grammar terminates - it accepted a stop
token where the grammar may end - even under `ignore_eos` / `min_new_tokens`, as SGLang's `update_finish_state`
does.  finish_reason is {"type": "length", "length": n} or {"type": "stop", "matched": id | str}.

meta_info["output_token_logprobs_masked"] says which distribution output_token_logprobs are of: True for a
constrained request (q_τ restricted to the grammar's allowed tokens, renormalised - what the token was drawn
from, as an SGLang server reports), False otherwise (q_τ over the full vocabulary).
"""

from __future__ import annotations

import re
import time
from typing import Any, Sequence

import torch

from ..protocol import GenerateOutput
from .requests import Request


def token_text(tokenizer: Any, token: int) -> str:
    """The text of one token id (as SGLang's `return_text_in_logprobs`)."""
    return tokenizer.decode([token])


def top_entries(vals: torch.Tensor, idx: torch.Tensor, tokenizer: Any) -> list[list[Any]]:
    """`[[logprob, id, text], ...]` from one row of torch.topk's values and indices."""
    return [[v, i, token_text(tokenizer, i)] for v, i in zip(vals.tolist(), idx.tolist())]


def stop_reason(r: Request, token: int, eos_token_ids: Sequence[int], tokenizer: Any) -> dict[str, Any] | None:
    """The finish_reason after `token` was appended to r.output_ids, or None to go on (see module docstring).
    A matched stop string sets r.stop_text_cut."""
    p = r.params
    n_out = len(r.output_ids)
    if n_out >= p.min_new_tokens:
        if not p.ignore_eos and token in eos_token_ids:
            return {"type": "stop", "matched": token}
        if token in p.stop_token_ids:
            return {"type": "stop", "matched": token}
        text = None  # the output text, decoded at most once per step
        if p.stop and tail_has_stop(tokenizer, r.output_ids, p.stop):
            text = tokenizer.decode(r.output_ids, skip_special_tokens=True)
            hits = [(text.find(st), st) for st in p.stop if st and st in text]
            if hits:
                cut, st = min(hits)
                r.stop_text_cut = cut
                return {"type": "stop", "matched": st}
        if p.stop_regex:
            if text is None:
                text = tokenizer.decode(r.output_ids, skip_special_tokens=True)
            for pattern in p.stop_regex:
                if re.search(pattern, text):
                    return {"type": "stop", "matched": pattern}
    if n_out >= p.max_new_tokens:
        return {"type": "length", "length": n_out}
    if r.grammar is not None and r.grammar.terminated:
        return {"type": "stop", "matched": token}
    return None


def tail_has_stop(tokenizer: Any, output_ids: Sequence[int], stops: Sequence[str]) -> bool:
    """Cheap pre-check: can a stop string have appeared with the newest token?

    A stop string that was absent before the newest token must end inside the text of the last few
    tokens, so decoding a window of them finds it without re-decoding the whole output at every step (the
    chat template adds a stop string to every frontend `gen`).  The window is the longest stop string's UTF-8
    bytes + 8 tokens: a token decodes to at least one byte, and one character can take up to four tokens
    (byte-level vocabularies), so a window counted in characters missed stop strings outside ASCII.
    """
    window = max(len(st.encode("utf-8", "surrogatepass")) for st in stops) + 8
    if len(output_ids) <= window:
        return True
    tail = tokenizer.decode(list(output_ids[-window:]), skip_special_tokens=True)
    return any(st and st in tail for st in stops)


def build_output(r: Request, tokenizer: Any) -> GenerateOutput:
    """The finished request as a GenerateOutput with SGLang's meta_info shape plus the p0 / entropy keys."""
    text = tokenizer.decode(r.output_ids, skip_special_tokens=True) if r.output_ids else ""
    if r.stop_text_cut is not None:
        text = text[: r.stop_text_cut]
    s = r.input_logprob_start
    return GenerateOutput(
        input_ids=r.input_ids,
        output_ids=tuple(r.output_ids),
        text=text,
        meta_info=_meta_info(r, tokenizer),
        output_logq=tuple(r.logq),
        output_logp0=tuple(r.logp0),
        output_entropy=tuple(r.entropy),
        input_logp0=tuple(r.input_logp0) if s >= 0 else None,
        input_entropy=tuple(r.input_entropy) if s >= 0 else None,
    )


def _meta_info(r: Request, tokenizer: Any) -> dict[str, Any]:
    p = r.params
    meta: dict[str, Any] = {
        "id": r.rid,
        "finish_reason": r.finish_reason,
        "prompt_tokens": len(r.input_ids),
        "completion_tokens": len(r.output_ids),
        "cached_tokens": r.cached_tokens,
        "e2e_latency": time.perf_counter() - r.submitted,
        "sampling_seed": r.seed,
        "output_token_logprobs": [[lq, t, token_text(tokenizer, t)] for lq, t in zip(r.logq, r.output_ids)],
        "output_token_logp0": list(r.logp0),
        "output_token_entropy": list(r.entropy),
        "output_token_logprobs_masked": r.grammar is not None,
    }
    if p.top_logprobs_num > 0:
        meta["output_top_logprobs"] = r.top
    if p.logprob_temperatures:
        meta["logprob_temperatures"] = list(p.logprob_temperatures)
        # [temperature index][token index]: log q_τ'(y_t | ·) over the full vocabulary
        meta["output_token_logq_by_temperature"] = [
            [row[j] for row in r.logq_by_temperature] for j in range(len(p.logprob_temperatures))
        ]
    s = r.input_logprob_start
    if s >= 0:
        toks = r.input_ids[s:]
        meta["input_token_logprobs"] = [[lp, t, token_text(tokenizer, t)] for lp, t in zip(r.input_logp0, toks)]
        meta["input_token_entropy"] = list(r.input_entropy)
        if p.top_logprobs_num > 0:
            meta["input_top_logprobs"] = list(r.input_top)
    return meta
