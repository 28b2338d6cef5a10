"""Finishing a generation: stop conditions and the SGLang-shaped result of the embedded engine.

    paper / notion                        meta_info key (GenerateOutput field)
    y_t, log q_τ(y_t | y_<t)              output_token_logprobs [[log q, id, text], ...] (output_logq)
    log p0(y_t | y_<t) (raw logits)       output_token_logp0 (output_logp0)
    H(p0(· | y_<t)), natural log          output_token_entropy (output_entropy)
    top-k of p0                           output_top_logprobs
    log q_τ'(y_t | ·) at extra τ'         output_token_logq_by_temperature[τ' index][t]
    log p0(x_j | x_<j) from s (scoring)   input_token_logprobs, input_token_entropy (input_logp0, ...)

Stopping, as SGLang 0.5.23's scheduler and detokenizer do (schedule_batch.py `Req.update_finish_state`,
`Req.tail_str`, `_check_str_based_finish`; detokenizer_manager.py `trim_matched_stop`), checked after every token in
this order:

    1. stop strings, in list order: the first one found in the output decoded with the tokenizer's defaults -
       special tokens spelled out ("<|im_end|>"), as `Req.tail_str` decodes - ends the generation, ignore_eos or
       not (output_ids keep the token that completed it).  So a chat template's "<|im_end|>" stops at the
       <|im_end|> token even under ignore_eos, and "ab" is not completed by "a", a special token, "b";
    2. stop_regex patterns, in list order (`re.search` on that same text).  The whole text is decoded and searched
       only when a window of the newest tokens matches, or when a pattern's match is unbounded or looks far
       outside itself (lookarounds, backreferences): a new match of a pattern that depends on at most W characters
       (its widest match, plus the character on each side an anchor reads) lies in the last W characters and what
       the newest token added.  An unbounded pattern ("x+", "a.*b") costs a whole-text search per step, as in
       SGLang, whose tail window (get_max_seq_length: 2**30 for an unbounded repeat) is then the whole output;
    3. EOS and stop_token_ids, unless `ignore_eos` (which ignores both): kept in output_ids, dropped from the text;
    4. max_new_tokens;
    5. a constrained request (grammar) whose grammar terminated - it accepted an EOS id where the grammar
       may end - even under `ignore_eos`.

The response text is the detokenizer's: the output decoded with skip_special_tokens (SGLang's default), less the
last token when a token id matched, and, when a string or pattern matched, cut before the first occurrence of the
matched string (of the pattern's source, taken literally) in that text - kept whole where it does not occur there
("<|im_end|>" is skipped; "[0-9]+" never occurs literally).

`min_new_tokens` is no stop rule: while fewer tokens are out, EOS and the stop ids are masked out of q_τ (SGLang's
min-new-tokens penalizer; `banned_tokens`, applied in `decode.sample_step`), and stop strings still stop.
finish_reason is {"type": "length", "length": n} or {"type": "stop", "matched": id | str}.  Where SGLang differs
and forerun does not follow: it searches only a tail window of the newest tokens (so an anchored pattern can
match at the window's start, and a match longer than its estimate is missed) and an empty stop string stops at
once; here the whole output text is searched and empty stop strings are dropped.

The per-token keys (output_token_logprobs and SGLang's output_token_logprobs_length, output_token_logp0,
output_token_entropy, output_top_logprobs) are in meta_info only under `return_logprob`, as SGLang returns its
logprobs; the GenerateOutput fields always hold them.
meta_info["output_token_logprobs_masked"] says which distribution output_token_logprobs are of: True for a
constrained request (q_τ restricted to the grammar's allowed tokens, renormalised - what the token was drawn
from, as an SGLang server reports) and for one with min_new_tokens > 0 (its first tokens drawn with EOS and the
stop ids masked), False otherwise (q_τ over the full vocabulary).
"""

from __future__ import annotations

import functools
import re
import time
from typing import Any, Sequence

import torch

try:  # Python 3.11+: the parser is re._parser (sre_parse warns)
    from re import _parser as sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse  # type: ignore[no-redef]

from ..protocol import GenerateOutput
from .requests import Request


def token_text(tokenizer: Any, token: int) -> str:
    """The text of one token id (as SGLang's `return_text_in_logprobs`)."""
    return tokenizer.decode([token])


def top_entries(vals: torch.Tensor, idx: torch.Tensor, tokenizer: Any) -> list[list[Any]]:
    """`[[logprob, id, text], ...]` from one row of torch.topk's values and indices."""
    return [[v, i, token_text(tokenizer, i)] for v, i in zip(vals.tolist(), idx.tolist())]


def banned_tokens(r: Request, eos_token_ids: Sequence[int], vocab_size: int) -> tuple[int, ...]:
    """The tokens masked out of r's next draw: EOS and the stop ids while fewer than min_new_tokens tokens are
    out (SGLang's min-new-tokens penalizer, ignore_eos or not), else none."""
    if len(r.output_ids) >= r.params.min_new_tokens:
        return ()
    return tuple(sorted(t for t in {*eos_token_ids, *r.params.stop_token_ids} if 0 <= t < vocab_size))


def stop_reason(r: Request, token: int, eos_token_ids: Sequence[int], tokenizer: Any) -> dict[str, Any] | None:
    """The finish_reason after `token` was appended to r.output_ids, or None to go on (see module docstring).
    A matched stop string or pattern sets r.stop_text_cut where the response text is cut (None: kept whole)."""
    p = r.params
    text = None  # the output with special tokens spelled out, decoded at most once per step
    if p.stop and tail_has_stop(tokenizer, r.output_ids, p.stop):
        text = spelled_text(tokenizer, r.output_ids)
        for st in p.stop:  # a stop string present now is new: the output would have stopped at an older one
            if st and st in text:
                r.stop_text_cut = first_occurrence(tokenizer, r.output_ids, st)
                return {"type": "stop", "matched": st}
    if p.stop_regex and (text is not None or tail_may_match(tokenizer, r.output_ids, p.stop_regex)):
        if text is None:
            text = spelled_text(tokenizer, r.output_ids)
        for pattern in p.stop_regex:
            if re.search(pattern, text):
                r.stop_text_cut = first_occurrence(tokenizer, r.output_ids, pattern)
                return {"type": "stop", "matched": pattern}
    if not p.ignore_eos and (token in eos_token_ids or token in p.stop_token_ids):
        return {"type": "stop", "matched": token}
    if len(r.output_ids) >= p.max_new_tokens:
        return {"type": "length", "length": len(r.output_ids)}
    if r.grammar is not None and r.grammar.terminated:
        return {"type": "stop", "matched": token}
    return None


def spelled_text(tokenizer: Any, ids: Sequence[int]) -> str:
    """The text stop strings and stop_regex patterns are matched in: `ids` decoded with the tokenizer's defaults,
    special tokens spelled out ("<|im_end|>"), as SGLang's `Req.tail_str` decodes them."""
    return tokenizer.decode(list(ids))


def first_occurrence(tokenizer: Any, ids: Sequence[int], matched: str) -> int | None:
    """Where SGLang's detokenizer (`trim_matched_stop`) cuts the response text of `ids` for a matched stop string or
    pattern: before its first literal occurrence in the text decoded with skip_special_tokens; None where it does
    not occur there (a special token's spelling, a pattern's source that matches other text)."""
    at = tokenizer.decode(list(ids), skip_special_tokens=True).find(matched)
    return at if at >= 0 else None


def output_text(r: Request, tokenizer: Any) -> str:
    """The response text: the output decoded without special tokens, less the token a matched stop id (or EOS,
    or a grammar's stop token) ended it with, and cut before a matched stop string (module docstring)."""
    ids = r.output_ids
    if r.finish_reason is not None and isinstance(r.finish_reason.get("matched"), int) and ids:
        ids = ids[:-1]
    text = tokenizer.decode(ids, skip_special_tokens=True) if ids else ""
    return text[: r.stop_text_cut] if r.stop_text_cut is not None else text


def _decoded_tail(tokenizer: Any, output_ids: Sequence[int], tokens: int) -> str | None:
    """The `spelled_text` of the last `tokens` output tokens; None when that window is the whole output."""
    if len(output_ids) <= tokens:
        return None
    return spelled_text(tokenizer, output_ids[len(output_ids) - tokens:])


def tail_has_stop(tokenizer: Any, output_ids: Sequence[int], stops: Sequence[str]) -> bool:
    """Cheap pre-check: can a stop string have appeared with the newest token?

    A stop string that was absent before the newest token must end inside the text of the last few
    tokens, so decoding a window of them finds it without re-decoding the whole output at every step (the
    chat template adds a stop string to every frontend `gen`).  The window is the longest stop string's UTF-8
    bytes + 8 tokens: every token spells at least one byte (a special token spells its name, `spelled_text`), and
    one character can take up to four tokens (byte-level vocabularies), so a window counted in characters missed
    stop strings outside ASCII.
    """
    tail = _decoded_tail(tokenizer, output_ids, max(len(st.encode("utf-8", "surrogatepass")) for st in stops) + 8)
    return tail is None or any(st and st in tail for st in stops)


_LOOKS_OUTSIDE = {"ASSERT", "ASSERT_NOT", "GROUPREF", "GROUPREF_EXISTS"}


def _ops(node: Any) -> set[str]:
    """The names of the operations anywhere in a parsed pattern (sre's parse tree)."""
    if isinstance(node, (list, tuple)):
        return set().union(*(_ops(x) for x in node)) if node else set()
    if isinstance(node, sre_parse.SubPattern):
        return set().union(*({str(op)} | _ops(av) for op, av in node.data)) if node.data else set()
    return set()


@functools.lru_cache(maxsize=512)
def regex_match_chars(pattern: str) -> int | None:
    """The most characters whether `pattern` matches at a place depends on, when that is at most 4096: the
    widest match, plus one character on each side when the pattern has an anchor (^, $, \\A, \\Z, \\b, \\B: each
    reads at most the character next to it).  None for a lookaround or backreference (which can read any distance
    away), for a wider pattern, or when the pattern does not parse (then the whole-text search raises as it always
    did).  SGLang (get_max_seq_length) bounds its window for anchored patterns too."""
    try:
        tree = sre_parse.parse(pattern)
        widest = tree.getwidth()[1]
    except Exception:  # noqa: BLE001 - an invalid pattern: the full search reports it
        return None
    ops = _ops(tree)
    chars = widest + (2 if "AT" in ops else 0)
    return chars if chars <= 4096 and not ops & _LOOKS_OUTSIDE else None


def tail_may_match(tokenizer: Any, output_ids: Sequence[int], patterns: Sequence[str]) -> bool:
    """Cheap pre-check: can a stop_regex pattern have matched with the newest token?

    Each step runs after the previous one found no match, so a new match of a pattern that depends on at most W
    characters (`regex_match_chars`) reads what the newest token added and starts at most W characters before it
    (an anchor at the window's start may match there spuriously: the whole-text search then decides).  Those
    characters (and the ≤ 3 bytes of a character the newest token completed) lie in the last 4 W + 16 tokens (a
    character is at most 4 bytes, a token - special ones spelled out - at least one), so when no pattern matches
    their text none matches the whole text; a match there, or any pattern without such a W (`regex_match_chars`:
    None), sends the step to the whole-text search.
    """
    widths = [regex_match_chars(p) for p in patterns]
    if any(w is None for w in widths):
        return True
    tail = _decoded_tail(tokenizer, output_ids, 4 * max(widths) + 16)
    return tail is None or any(re.search(p, tail) for p in patterns)


def build_output(r: Request, tokenizer: Any) -> GenerateOutput:
    """The finished request as a GenerateOutput with SGLang's meta_info shape plus the p0 / entropy keys."""
    text = output_text(r, tokenizer)
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
        "output_token_logprobs_masked": r.grammar is not None or r.params.min_new_tokens > 0,
    }
    if p.return_logprob:  # SGLang's tokenizer manager adds the logprob keys only then (add_logprob_to_meta_info)
        meta["output_token_logprobs"] = [[lq, t, token_text(tokenizer, t)] for lq, t in zip(r.logq, r.output_ids)]
        meta["output_token_logprobs_length"] = len(r.output_ids)
        meta["output_token_logp0"] = list(r.logp0)
        meta["output_token_entropy"] = list(r.entropy)
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
    elif p.return_logprob:  # start -1 or n: SGLang's scheduler makes -1 n, and n scores no prompt position
        meta["input_token_logprobs"], meta["input_token_entropy"] = [], []
        if p.top_logprobs_num > 0:
            meta["input_top_logprobs"] = []
    return meta
