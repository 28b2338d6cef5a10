"""SGLang 0.5.23's stop rules for one request, as its scheduler applies them: when a generation finishes and why,
and at which steps a streamed request's output is sent.  The stand-in's `generate` asks `finish_after` after
every token; the server asks `send_points` which chunks a stream has.

    SGLang 0.5.23 (site-packages/sglang/srt/...)                         stand-in
    sampling/sampling_params.py normalize (L331): a stop string's length  StopRules.tail_tokens
      is its token count (tokenizer.encode without specials, L348), a
      stop_regex's is get_max_seq_length (L396: one per literal / class /
      ".", 2**30 for an unbounded repeat); at most 32 stop strings and 32
      patterns of at most 256 UTF-8 bytes (L44-46)                        check_stop_params
    managers/schedule_batch.py Req.tail_str (L1819-1828): the text        StopRules.tail
      searched is the decoded LAST min(longest + 1, len(output)) output
      tokens only - never the prompt - decoded with the tokenizer's
      defaults (special tokens spelled out, "</s>")
    Req.update_finish_state (L2007): stop strings first, in list order    StopRules.finish_after
      (`stop in tail`, L1922: an empty stop string always matches), then
      stop_regex in list order (`re.search(pattern, tail)`, L1940), then
      stop_token_ids / EOS - none of them under ignore_eos (L1857) - then
      max_new_tokens; the token that completes a match is kept in the
      output ids (non-speculative decoding: finished_len = all tokens)
    FINISH_MATCHED_STR / FINISHED_MATCHED_REGEX / FINISH_MATCHED_TOKEN /  finish_reason dicts
      FINISH_LENGTH to_json (L284-330): {"type": "stop", "matched": the
      stop string | the pattern | the token id}, {"type": "length",
      "length": max_new_tokens}
    min_new_tokens: not a finish rule; the MinNewTokens penalizer         banned_before_min (the sampler
      (sampling/penaltylib/min_new_tokens.py) sets the logits of EOS and    masks them: `byte_model`)
      stop_token_ids to -inf for the first min_new_tokens tokens; stop
      strings still stop
    scheduler_components/output_streamer.py accept (L444-478): a          send_points
      streamed request sends its first token, then each step with at
      least sampling_params.stream_interval (default 1: every step)
      tokens unsent, except while the tail ends with the start of a stop
      string (check_match_stop_str_prefix, L1830, L473); one that does
      not stream sends every 50th token (L476,
      SGLANG_FORCE_STREAM_INTERVAL); both send when they finish
    managers/tokenizer_manager.py (L1333-1378): a prompt of context_len   context_error
      tokens or more, or prompt + max_new_tokens (when the request sets
      it; validate_total_tokens is on) past context_len: ValueError
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Sequence

try:  # sre_parse is deprecated in Python 3.11+; SGLang imports re._parser the same way
    import re._parser as sre_parse
except ImportError:  # pragma: no cover - Python < 3.11
    import sre_parse  # type: ignore[no-redef]

MAX_STOP_COUNT = 32
MAX_STOP_REGEX_COUNT = 32
MAX_STOP_REGEX_LEN = 256
"""SGLang's limits on the stop strings and stop_regex patterns of one request (sampling_params.py L44-46)."""
UNBOUNDED_REGEX_LENGTH = 2**30
"""get_max_seq_length's length of an unbounded repeat: the tail window then covers the whole output."""
FORCE_STREAM_INTERVAL = 50
DEFAULT_STREAM_INTERVAL = 1
"""--stream-interval's default (arg_groups/fields/serving.py): the interval of a request without stream_interval."""
"""SGLANG_FORCE_STREAM_INTERVAL's default: a request's output goes to the detokenizer every 50 tokens."""


def max_regex_length(pattern: str) -> int:
    """SGLang's get_max_seq_length: an upper bound on the characters `pattern` can match, which the scheduler
    takes as tokens ("in the worst case, one character ... corresponds to one token")."""
    return _subpattern_length(sre_parse.parse(pattern))


def _subpattern_length(subpattern: Any) -> int:
    total = 0
    for token, value in subpattern:
        if token in (sre_parse.LITERAL, sre_parse.IN, sre_parse.ANY):
            total += 1
        elif token == sre_parse.SUBPATTERN:
            total += _subpattern_length(value[3])
        elif token == sre_parse.BRANCH:
            total += max(_subpattern_length(branch) for branch in value[1])
        elif token in (sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT):
            _, most, inner = value
            total += UNBOUNDED_REGEX_LENGTH if most == sre_parse.MAXREPEAT else most * _subpattern_length(inner)
        elif token == sre_parse.AT:  # ^, $, \b: zero width
            pass
        else:  # SGLang logs "unhandled regex token" and assumes the worst
            total += UNBOUNDED_REGEX_LENGTH
    return total


def check_stop_params(stop_strs: Sequence[str], stop_regexes: Sequence[str]) -> None:
    """SGLang's normalize refuses these with a ValueError (HTTP 400, its message)."""
    if len(stop_strs) > MAX_STOP_COUNT:
        raise ValueError(f"at most {MAX_STOP_COUNT} stop strings are allowed, got {len(stop_strs)}")
    if len(stop_regexes) > MAX_STOP_REGEX_COUNT:
        raise ValueError(f"at most {MAX_STOP_REGEX_COUNT} stop_regex patterns are allowed, got {len(stop_regexes)}")
    for pattern in stop_regexes:
        size = len(pattern.encode("utf-8"))
        if size > MAX_STOP_REGEX_LEN:
            raise ValueError(f"stop_regex is {size} bytes, over the {MAX_STOP_REGEX_LEN}-byte limit")


def context_error(prompt_tokens: int, max_new_tokens: Any, context_len: int) -> str | None:
    """SGLang's refusal of a request that does not fit the model's context (None when it fits); `max_new_tokens`
    as the request sets it (None: not set, the total is not checked)."""
    if prompt_tokens >= context_len:
        return f"The input ({prompt_tokens} tokens) is longer than the model's context length ({context_len} tokens)."
    if max_new_tokens is not None and int(max_new_tokens) + prompt_tokens > context_len:
        return (f"Requested token count exceeds the model's maximum context length of {context_len} tokens. You "
                f"requested a total of {int(max_new_tokens) + prompt_tokens} tokens: {prompt_tokens} tokens from the "
                f"input messages and {int(max_new_tokens)} tokens for the completion. Please reduce the number of "
                "tokens in the input messages or the completion to fit within the limit.")
    return None


UNCAPPED_NEW_TOKENS = 1 << 30
"""The scheduler's max_new_tokens of a request that sets it to null (scheduler.init_req_max_new_tokens)."""


def request_stop_rules(tokenizer: Any, sp: dict[str, Any]) -> "StopRules":
    """A request's StopRules from its sampling_params with SGLang's defaults; ValueError (HTTP 400) over its
    normalize's limits, re.error (HTTP 500 there) for a pattern that does not compile."""
    stops, patterns = sp.get("stop") or [], sp.get("stop_regex") or []
    stops = [stops] if isinstance(stops, str) else list(stops)
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    check_stop_params(stops, patterns)
    for pattern in patterns:
        re.compile(pattern)
    # a negative one: verify's (`admission.verify_error`); null: no limit of its own - the scheduler caps it at the
    # context (init_req_max_new_tokens: `1 << 30` when None, then max_req_len - input_len - 1)
    requested = sp.get("max_new_tokens", 128)
    max_new_tokens = UNCAPPED_NEW_TOKENS if requested is None else int(requested)
    return StopRules(tokenizer, max_new_tokens, tuple(stops), tuple(patterns),
                     frozenset(int(t) for t in (sp.get("stop_token_ids") or [])), bool(sp.get("ignore_eos", False)),
                     int(sp.get("stream_interval") or DEFAULT_STREAM_INTERVAL))


@dataclass(frozen=True)
class StopRules:
    """When one request finishes and why (module docstring); `tokenizer` is the server's."""

    tokenizer: Any
    max_new_tokens: int
    stop_strs: tuple[str, ...] = ()
    stop_regexes: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    stream_interval: int = 1

    @cached_property
    def tail_tokens(self) -> int:
        """How many of the last output tokens the stop check decodes: the longest stop string (in tokens) or
        stop_regex (max_regex_length), plus one."""
        longest_str = max((len(self.tokenizer.encode(s, add_special_tokens=False)) for s in self.stop_strs),
                          default=0)
        longest_regex = max((max_regex_length(p) for p in self.stop_regexes), default=0)
        return max(longest_str, longest_regex) + 1

    def tail(self, output_ids: Sequence[int]) -> str:
        """The text the stop check searches: the last `tail_tokens` output tokens, special tokens spelled out."""
        return self.tokenizer.decode(list(output_ids[-min(self.tail_tokens, len(output_ids)):]))

    def finish_after(self, output_ids: Sequence[int], grammar_terminated: bool = False) -> dict[str, Any] | None:
        """SGLang's finish_reason once `output_ids` (at least one token) are out, or None to go on; a request whose
        grammar has terminated stops last, on its last token (schedule_batch.py L2045-2047)."""
        if self.stop_strs or self.stop_regexes:
            tail = self.tail(output_ids)
            for stop in self.stop_strs:
                if stop in tail:
                    return {"type": "stop", "matched": stop}
            for pattern in self.stop_regexes:
                if re.search(pattern, tail):
                    return {"type": "stop", "matched": pattern}
        token = int(output_ids[-1])
        if not self.ignore_eos and (token in self.stop_token_ids or token == self.tokenizer.eos_token_id):
            return {"type": "stop", "matched": token}
        if len(output_ids) >= self.max_new_tokens:
            return {"type": "length", "length": self.max_new_tokens}
        if grammar_terminated:
            return {"type": "stop", "matched": token}
        return None

    def banned_before_min(self) -> frozenset[int]:
        """The tokens the min_new_tokens penalizer masks (EOS and stop_token_ids, ignore_eos or not)."""
        return self.stop_token_ids | {int(self.tokenizer.eos_token_id)}

    def holds_back(self, output_ids: Sequence[int]) -> bool:
        """check_match_stop_str_prefix: the tail holds a stop string or ends with the start of one (stop_regex
        patterns never hold a chunk back)."""
        if not self.stop_strs or not output_ids:
            return False
        tail = self.tail(output_ids)
        for stop in self.stop_strs:
            if not stop:
                continue
            if stop in tail or any(tail[-i:] == stop[:i] for i in range(1, min(len(tail), len(stop)) + 1)):
                return True
        return False

    def send_points(self, output_ids: Sequence[int], stream: bool) -> list[int]:
        """The numbers of output tokens at which the scheduler sends this finished request's output to the
        detokenizer: a stream's unfinished steps - its first token, then each step with at least stream_interval
        tokens unsent (every step at 1) - unless `holds_back`; every FORCE_STREAM_INTERVAL-th token of a request
        that does not stream; the last step (the finished output)."""
        n = len(output_ids)
        if stream:
            points, sent = [], 0
            for t in range(1, n):
                due = self.stream_interval == 1 or t - sent >= self.stream_interval or sent == 0
                if due and not self.holds_back(output_ids[:t]):
                    points.append(t)
                    sent = t
        else:
            points = list(range(FORCE_STREAM_INTERVAL, n, FORCE_STREAM_INTERVAL))
        return points + [n]
