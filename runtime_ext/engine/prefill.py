"""Prefill: reuse a request's longest cached prefix, compute the rest of its prompt KV, score the prompt.

    notion                                         code
    prompt x_0..x_{n-1}, KV to hold before decode  PrefillSpan.need: n - 1 (GENERATE: x_{n-1} is fed by the
                                                   first decode step), n (LOGITS, PIN)
    longest reusable cached prefix                 PrefillSpan.limit (<= s when scoring from s: like SGLang,
                                                   scored positions are recomputed, never read from cache)
    first position whose logits are wanted         PrefillSpan.first_logit (need: none)
    cached_tokens                                  Request.cached_tokens = the matched prefix length m

Scoring (`max_new_tokens=0`, `return_logprob`, `logprob_start_len=s`): `input_token_logprobs` follows
SGLang's shift exactly: entries cover prompt positions s..n-1, entry 0 is ``[None, x_s, text]`` (always,
whatever s is) and entry j >= 1 is ``[log p0(x_{s+j} | x_<s+j), x_{s+j}, text]``.  To score tokens from
position P, pass s = P-1 and read entries [1:].  `input_token_entropy[j]` is H(p0(· | x_<s+j)) (None at 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..protocol import EngineError
from .admission import release_held_prefix
from .forward import TOKEN_AXIS, all_finite, copy_segments, empty_kv_buffer
from .kv_handoff import hand_row_kv_to_tree, move_lock, settle_reservation
from .output import top_entries
from .radix_cache import RadixCache, path_kv
from .requests import Request, RequestMode
from .sampling import vocab_stats

Forward = Callable[..., torch.Tensor]
"""`(buf, length, input_ids, position_ids, attention_mask, logits_to_keep, row_starts) -> logits`."""


@dataclass(frozen=True)
class PrefillSpan:
    """Which prompt positions a request's prefill covers (see module docstring)."""

    need: int
    limit: int
    first_logit: int


def _reuse_limit(need: int, s: int) -> int:
    return need if s < 0 else min(need, s)


def _generate_span(n: int, s: int) -> PrefillSpan:
    need = n - 1
    return PrefillSpan(need, _reuse_limit(need, s), s if s >= 0 else need)


def _logits_span(n: int, s: int) -> PrefillSpan:
    # the last position's logits need one computed token
    return PrefillSpan(n, min(_reuse_limit(n, s), n - 1), n - 1)


def _pin_span(n: int, s: int) -> PrefillSpan:
    return PrefillSpan(n, _reuse_limit(n, s), s if s >= 0 else n)


_SPANS = {RequestMode.GENERATE: _generate_span, RequestMode.LOGITS: _logits_span, RequestMode.PIN: _pin_span}


def prefill_span(r: Request) -> PrefillSpan:
    """The span of request r's prefill, by its mode."""
    return _SPANS[r.mode](len(r.input_ids), r.input_logprob_start)


@dataclass
class PromptKV:
    """What a prefill produced: the row's KV segments (covering [0, need)), how many of the prompt tokens
    the radix tree now holds, and the logits computed (position of logits[0] is `logits_from`)."""

    segments: list[torch.Tensor]
    covered: int
    logits: torch.Tensor | None
    logits_from: int


def compute_prompt_kv(r: Request, span: PrefillSpan, radix: RadixCache, forward: Forward,
                      template: torch.Tensor, counters: dict[str, Any], *, share_prefix: bool = False) -> PromptKV:
    """Reuse the longest cached prefix (at most span.limit tokens) and compute the KV of the rest of
    [0, span.need) in one forward; insert it into the radix tree.  r holds a lock on its deepest node.
    With `share_prefix` the forward reads the cached prefix in place (no copy into the prefill buffer)."""
    ids, need = r.input_ids, span.need
    match = radix.match_prefix(ids, max_len=span.limit)
    radix.lock(match.node)
    r.node = match.node
    release_held_prefix(radix, r)  # the row's own lock holds its cached prefix from here
    r.cached_tokens = m = match.length
    segments = list(match.segments)
    if need <= m:
        if share_prefix and r.decodes:  # read in place, all of it: what was reserved for the prompt is free
            settle_reservation(radix, r, m)
        return PromptKV(segments, covered=m, logits=None, logits_from=need)
    keep = max(need - max(span.first_logit, m), 1)
    x = torch.tensor([ids[m:need]], dtype=torch.long)
    positions = torch.arange(m, need, dtype=torch.long).unsqueeze(0)
    if share_prefix:
        buf = empty_kv_buffer(template, 1, need - m)
        logits = forward(buf, 0, x, positions, None, keep, [0], segments=[segments])[0]  # [keep, V]
        new_kv = buf[:, :, 0]  # [layers, 2, H, need - m, D], contiguous
    else:
        buf = empty_kv_buffer(template, 1, need)
        end = copy_segments(buf, 0, 0, segments)
        assert end == m
        logits = forward(buf, m, x, positions, None, keep, [0])[0]  # [keep, V]
        new_kv = buf[:, :, 0, :, m:need]
    counters["prefill_tokens"] += need - m
    counters["prefill_calls"] += 1
    if not all_finite(logits) or not all_finite(new_kv):
        raise EngineError(f"request {r.rid}: the model produced NaN/inf logits or KV during prefill")
    if share_prefix and r.decodes:  # the tree's copy replaces the row's: paid from its reservation
        node, covered = hand_row_kv_to_tree(radix, r, ids[:need], new_kv, offset=m)
    else:  # nothing reserved, or the row keeps its own copy (the fallback): the tree's takes free room
        node, covered = radix.insert(ids[:need], new_kv, offset=m)
    move_lock(radix, r, node)
    if share_prefix:  # the row reads the tree's copy of its prompt in place; only what the tree could not take
        segments = path_kv(node)  # stays the row's own (the prefill buffer itself is dropped: the prompt held once)
        if covered < need:
            segments.append(new_kv.narrow(TOKEN_AXIS, covered - m, need - covered).contiguous())
    else:
        segments.append(new_kv)
    return PromptKV(segments, covered=covered, logits=logits, logits_from=need - keep)


def fill_input_logprobs(r: Request, kv: PromptKV, vocab_size: int, tokenizer: Any, kernels: Any = None) -> None:
    """SGLang-shifted prompt logprobs of r for positions s..n-1 (entry 0 None; see module docstring); the same
    per-row arithmetic as a decode step's log p0 and entropy (`sampling.vocab_stats`)."""
    s, n = r.input_logprob_start, len(r.input_ids)
    r.input_logp0 = [None]
    r.input_entropy = [None]
    r.input_top = [None]
    if n - 1 <= s:
        return
    assert kv.logits is not None
    # logits at positions s..n-2 predict tokens s+1..n-1
    stats = vocab_stats(kv.logits[s - kv.logits_from : n - 1 - kv.logits_from], kernels)
    if not all(stats.finite):
        raise EngineError(f"request {r.rid}: NaN/inf logits while scoring the prompt")
    r.input_logp0 += [stats.logp0(j, tok) for j, tok in enumerate(r.input_ids[s + 1 : n])]
    r.input_entropy += list(stats.entropy)
    k = r.params.top_logprobs_num
    if k > 0:
        r.input_top += [top_entries(*stats.top(j, min(k, vocab_size)), tokenizer) for j in range(n - 1 - s)]
    else:
        r.input_top += [None] * (n - 1 - s)
