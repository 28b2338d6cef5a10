"""Stop strings of the embedded engine (runtime_ext/engine/output.py) on the byte-level tiny tokenizer, where a
character outside ASCII takes up to four tokens."""

from __future__ import annotations

import random
import re
from types import SimpleNamespace

import pytest

from forerun.runtime_ext.engine.models import load_model
from forerun.runtime_ext.engine.output import output_text, regex_match_chars, stop_reason
from forerun.runtime_ext.protocol import SamplingParams


@pytest.fixture(scope="module")
def tokenizer():
    return load_model("tiny").tokenizer


def byte_ids(text: str) -> list[int]:
    """The tiny tokenizer's ids of `text`, one per UTF-8 byte (its vocabulary: id = byte value)."""
    return list(text.encode("utf-8"))


@pytest.mark.parametrize("stop", ["😀😃😄", "😀😃😄😁", "終わり", "x😀"])
def test_a_stop_string_of_many_tokens_per_character_stops_a_long_output(tokenizer, stop):
    """A stop string whose characters take several tokens each is found when its last token arrives, however long
    the output before it (the tail the engine decodes must span the string's tokens, not its characters)."""
    before = "The answer is forty-two, and here it comes: "
    ids = byte_ids(before + stop)
    assert tokenizer.decode(ids) == before + stop  # the oracle's premise: one token per byte
    r = SimpleNamespace(params=SamplingParams(max_new_tokens=200, stop=(stop,)), output_ids=[], grammar=None,
                        stop_text_cut=None)
    reasons = []
    for t in ids:
        r.output_ids.append(t)
        reasons.append(stop_reason(r, t, (256,), tokenizer))
    assert reasons[:-1] == [None] * (len(ids) - 1)
    assert reasons[-1] == {"type": "stop", "matched": stop}
    assert r.stop_text_cut == len(before)


def finish(tokenizer, text: str, **params):
    """Feed `text` token by token (one per byte) to stop_reason: (finish_reason, the response text)."""
    r = SimpleNamespace(params=SamplingParams(max_new_tokens=200, **params), output_ids=[], grammar=None,
                        stop_text_cut=None, finish_reason=None)
    for t in byte_ids(text):
        r.output_ids.append(t)
        r.finish_reason = stop_reason(r, t, (256,), tokenizer)
        if r.finish_reason is not None:
            break
    return r.finish_reason, output_text(r, tokenizer)


@pytest.mark.parametrize("stops, matched, text", [((":", "Q:"), ":", "ab Q"), (("Q:", ":"), "Q:", "ab "),
                                                  (("zz", "b Q:"), "b Q:", "a")])
def test_stop_strings_completed_together_follow_list_order(tokenizer, stops, matched, text):
    """SGLang 0.5.23 checks stop strings in list order and cuts the text at the matched one's first occurrence:
    with ":" first, "ab Q:" gives "ab Q"."""
    assert finish(tokenizer, "ab Q: more", stop=stops) == ({"type": "stop", "matched": matched}, text)


def test_a_stop_string_ends_the_output_before_min_new_tokens(tokenizer):
    assert finish(tokenizer, "ab Q: more", stop=("Q:",), min_new_tokens=50) == (
        {"type": "stop", "matched": "Q:"}, "ab ")


@pytest.mark.parametrize("pattern, text", [("Q:", "ab "), ("[QR]:", "ab Q:"), (r"\d", "x1")])
def test_stop_regex_cuts_where_its_source_occurs_literally(tokenizer, pattern, text):
    """SGLang's detokenizer trims a matched pattern like a stop string, at the first literal occurrence of the
    pattern's source; "[QR]:" never occurs literally, so the text is kept whole."""
    out = "ab Q: more" if pattern != r"\d" else "x1 more"
    assert finish(tokenizer, out, stop_regex=(pattern,)) == ({"type": "stop", "matched": pattern}, text)


def test_stop_ids_end_the_output_and_leave_the_text_unless_ignore_eos(tokenizer):
    colon = ord(":")
    assert finish(tokenizer, "ab Q: more", stop_token_ids=(colon,)) == ({"type": "stop", "matched": colon}, "ab Q")
    assert finish(tokenizer, "ab Q: more", stop_token_ids=(colon,), ignore_eos=True) == (None, "ab Q: more")
    # a stop string completed by the same token wins over the stop id (strings are checked first)
    assert finish(tokenizer, "ab Q: more", stop=("Q:",), stop_token_ids=(colon,)) == (
        {"type": "stop", "matched": "Q:"}, "ab ")


@pytest.mark.parametrize("specials", [1, 12, 40])
def test_a_stop_string_split_by_special_tokens_does_not_stop(tokenizer, specials):
    """SGLang 0.5.23 matches stop strings in the output decoded with the tokenizer's defaults, special tokens spelled
    out (schedule_batch.py Req.tail_str: `self.tokenizer.decode(self.output_ids[-tail_len:])`), ignore_eos or not:
    "a", EOS / <|im_end|>, "b" spells "a<|endoftext|>...b", which does not hold "ab".  A later "ab" stops, and the
    detokenizer (trim_matched_stop) cuts the text, decoded with skip_special_tokens, before the FIRST "ab" in it -
    the split one, at 30."""
    eos, im_end = 256, 258
    split = byte_ids("x" * 30 + "a") + [eos, im_end] * (specials // 2) + [eos] * (specials % 2) + byte_ids("b")
    assert "ab" not in tokenizer.decode(split)  # the oracle's premises: specials spelled out by default,
    assert tokenizer.decode(split, skip_special_tokens=True) == "x" * 30 + "ab"  # and skipped in the text
    ids = split + byte_ids(" ab")
    r = SimpleNamespace(params=SamplingParams(max_new_tokens=200, stop=("ab",), ignore_eos=True), output_ids=[],
                        grammar=None, stop_text_cut=None, finish_reason=None)
    reasons = []
    for t in ids:
        r.output_ids.append(t)
        reasons.append(stop_reason(r, t, (eos,), tokenizer))
    assert reasons == [None] * (len(ids) - 1) + [{"type": "stop", "matched": "ab"}]
    r.finish_reason = reasons[-1]
    assert r.stop_text_cut == 30 and output_text(r, tokenizer) == "x" * 30


def feed(tokenizer, ids, **params):
    """Feed `ids` one by one to stop_reason (EOS 256): (output ids kept, finish_reason, the response text)."""
    r = SimpleNamespace(params=SamplingParams(max_new_tokens=200, **params), output_ids=[], grammar=None,
                        stop_text_cut=None, finish_reason=None)
    for t in ids:
        r.output_ids.append(t)
        r.finish_reason = stop_reason(r, t, (256,), tokenizer)
        if r.finish_reason is not None:
            break
    return r.output_ids, r.finish_reason, output_text(r, tokenizer)


@pytest.mark.parametrize("ignore_eos", [True, False])
def test_a_special_token_stop_string_stops_at_that_token_under_ignore_eos(tokenizer, ignore_eos):
    """A chat template's stop string "<|im_end|>" (chatml adds it to every gen) ends the gen at the <|im_end|> token
    on SGLang, ignore_eos or not: the stop-string check reads the output with special tokens spelled out and runs
    before (and regardless of) the EOS check (schedule_batch.py update_finish_state -> _check_str_based_finish;
    ignore_eos only gates _check_token_based_finish).  The token is kept in the ids; the text, decoded with
    skip_special_tokens, does not hold the stop string, so trim_matched_stop leaves it whole."""
    im_end = 258
    ids = byte_ids("hello") + [im_end] + byte_ids(" more")
    assert feed(tokenizer, ids, stop=("<|im_end|>",), ignore_eos=ignore_eos) == (
        byte_ids("hello") + [im_end], {"type": "stop", "matched": "<|im_end|>"}, "hello")
    # the EOS token itself, named as a stop string: the string matches first, so finish_reason names the string
    assert feed(tokenizer, byte_ids("hi") + [256] + byte_ids("x"), stop=("<|endoftext|>",)) == (
        byte_ids("hi") + [256], {"type": "stop", "matched": "<|endoftext|>"}, "hi")


def test_a_stop_regex_matches_the_spelled_special_tokens(tokenizer):
    """stop_regex reads the same text (re.search on Req.tail_str): "[#|]" matches the "|" of "<|im_end|>"; its source
    never occurs literally, so the text is kept whole.  "ab" is not matched across the special token; the later "ab"
    is, and the text is cut before the first "ab" of the text without special tokens (trim_matched_stop)."""
    ids = byte_ids("ab") + [258] + byte_ids("cd|")
    assert feed(tokenizer, ids, stop_regex=("[#|]",), ignore_eos=True) == (
        byte_ids("ab") + [258], {"type": "stop", "matched": "[#|]"}, "ab")
    assert feed(tokenizer, byte_ids("a") + [258] + byte_ids("b ab"), stop_regex=("ab",), ignore_eos=True) == (
        byte_ids("a") + [258] + byte_ids("b ab"), {"type": "stop", "matched": "ab"}, "")


def whole_text_stop(tokenizer, ids, patterns):
    """The oracle of stop_regex: after every token, decode the whole output as SGLang's Req.tail_str does (the
    tokenizer's defaults: special tokens spelled out) and search it with each pattern in list order (no window).
    (step index, pattern) of the first match, or None."""
    for n in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:n])
        for pattern in patterns:
            if re.search(pattern, text):
                return n - 1, pattern
    return None


PIECES = ["a", "b", "x", "y", "Q", ":", "1", "2", ".", " ", "é", "😀", "終"]
PATTERNS = ["Q:", "a{2,4}b", r"\d\d\.", "x|yy", "😀.", "[^a-z ]{3}", "(ab|ba){2}", "終 ?終", "é{2}", r"\s\d",
            "b+x", "^yb", r"\bQ1", "(?<=a)b1", "(a)\\1b", "y$", "x(?=[^:]*:)", "y(?=[^Q]*Q)", r"\|[ei]"]


def random_output(rng, pieces, length, special_rate):
    """Random output ids: byte tokens of random pieces, special tokens (256, 258) at `special_rate`."""
    ids = []
    while len(ids) < length:
        ids += [rng.choice((256, 258))] if rng.random() < special_rate else byte_ids(rng.choice(pieces))
    return ids


def first_stop(tokenizer, ids, **params):
    """(step, the matched stop, the request) of stop_reason fed `ids` one token at a time (None: no stop)."""
    r = SimpleNamespace(params=SamplingParams(max_new_tokens=500, ignore_eos=True, **params), output_ids=[],
                        grammar=None, stop_text_cut=None)
    for i, t in enumerate(ids):
        r.output_ids.append(t)
        reason = stop_reason(r, t, (256,), tokenizer)
        if reason is not None:
            return i, reason["matched"], r
    return None, None, r


@pytest.mark.parametrize("seed", range(40))
def test_stop_regex_stops_where_the_whole_text_search_does(tokenizer, seed):
    """stop_regex decodes a window of the newest tokens and searches the whole text only when the window matches
    (or a pattern is unbounded or looks outside its match).  Random outputs of multi-byte characters (up to 4
    tokens each) and special tokens (spelled out, as SGLang's Req.tail_str reads them) against random pattern lists:
    the stop step, the matched pattern and the cut are those of searching the whole text after every token."""
    rng = random.Random(seed)
    patterns = tuple(rng.sample(PATTERNS, rng.randint(1, 3)))
    ids = random_output(rng, PIECES, 90, 0.06)
    want = whole_text_stop(tokenizer, ids, patterns)
    step, matched, r = first_stop(tokenizer, ids, stop_regex=patterns)
    got = None if step is None else (step, matched)
    assert got == want, (patterns, tokenizer.decode(ids, skip_special_tokens=True))
    if want is not None:
        text = tokenizer.decode(ids[: want[0] + 1], skip_special_tokens=True)
        assert r.stop_text_cut == (text.find(want[1]) if want[1] in text else None)


STOPS = ["ab", "x😀", "終 終", "<|im_end|>", "d|>é", "|><|", "Q:1", "yy"]


@pytest.mark.parametrize("seed", range(30))
def test_stop_strings_stop_where_the_whole_spelled_text_search_does(tokenizer, seed):
    """The stop-string window (`tail_has_stop`) against the whole-text search of SGLang's text (special tokens spelled
    out, schedule_batch.py Req.tail_str) after every token, on random outputs of multi-byte characters and special
    tokens, some stop strings spanning a special token's spelling: the same stop step, stop string and cut (the
    first occurrence in the text without special tokens, trim_matched_stop)."""
    rng = random.Random(seed)
    stops = tuple(rng.sample(STOPS, rng.randint(1, 3)))
    ids = random_output(rng, PIECES, 120, 0.08)
    want = None
    for n in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:n])
        hit = next((st for st in stops if st in text), None)
        if hit is not None:
            plain = tokenizer.decode(ids[:n], skip_special_tokens=True)
            want = n - 1, hit, (plain.find(hit) if hit in plain else None)
            break
    step, matched, r = first_stop(tokenizer, ids, stop=stops)
    got = None if step is None else (step, matched, r.stop_text_cut)
    assert got == want, (stops, tokenizer.decode(ids))


@pytest.mark.parametrize("pattern, chars", [("Q:", 2), ("a{2,4}b", 5), ("x|yy", 2), ("😀.", 2), (r"\d+", None),
                                            ("^a", 3), ("(?=a)a", None), ("(a)\\1", None), ("a$", 3),
                                            (r"\bQ", 3), (r"(?m)^a|b\Z", 3), ("[", None)])
def test_which_patterns_a_window_can_decide(pattern, chars):
    assert regex_match_chars(pattern) == chars


ANCHORED = ["^yb", r"\bQ1", "y$", r"(?m)^\d", r"\B1", r"\Aab", r"a\Z", r"\b\d\b", r"é\b", r"x$|^Q", r"(?m):$"]
PIECES_NL = PIECES + ["\n", "\n"]


@pytest.mark.parametrize("seed", range(40))
def test_anchored_patterns_stop_where_the_whole_text_search_does(tokenizer, seed):
    """An anchored pattern (^, $, \\A, \\Z, \\b, \\B, multi-line ^ and $) is decided by a window of the newest tokens
    too; on random outputs longer than that window, with newlines: the stop step and pattern of searching the whole
    text after every token."""
    rng = random.Random(1000 + seed)
    patterns = tuple(rng.sample(ANCHORED, rng.randint(1, 3)))
    ids = random_output(rng, PIECES_NL, 150, 0.04)
    want = whole_text_stop(tokenizer, ids, patterns)
    step, matched, _ = first_stop(tokenizer, ids, stop_regex=patterns)
    got = None if step is None else (step, matched)
    assert got == want, (patterns, tokenizer.decode(ids))


class CountingTokenizer:
    """The tiny tokenizer, counting the token ids it decodes."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.decoded = 0

    def decode(self, ids, **kw):
        self.decoded += len(ids)
        return self.tokenizer.decode(ids, **kw)


@pytest.mark.parametrize("pattern", [r"\bZZZ\b", "^ZZZ", "ZZZ$", r"\BZ"])
def test_an_anchored_pattern_costs_a_bounded_window_per_token(tokenizer, pattern):
    """SGLang bounds the text it searches for an anchored pattern by the pattern's length (get_max_seq_length counts
    an anchor as 0; Req.tail_str decodes that many + 1 tokens); so does the engine: over 800 tokens that never match,
    at most 4 (W + 2) + 16 tokens are decoded per token (W the pattern's widest match), not the whole output (n² / 2
    = 320,000 tokens in all)."""
    counting = CountingTokenizer(tokenizer)
    r = SimpleNamespace(params=SamplingParams(max_new_tokens=1000, stop_regex=(pattern,), ignore_eos=True),
                        output_ids=[], grammar=None, stop_text_cut=None)
    ids = byte_ids("ab cd " * 134)[:800]
    for t in ids:
        r.output_ids.append(t)
        assert stop_reason(r, t, (256,), counting) is None
    widest = sum(1 for ch in pattern if ch == "Z")
    assert counting.decoded <= len(ids) * (4 * (widest + 2) + 16)


@pytest.mark.parametrize("pattern, text", [("x(?=[^:]*:)", "x" + "ab" * 40 + ":"), ("(?<=x)a", "x" + "a"),
                                           ("^abc", "abc" + "b" * 60), ("(ab)(?=.*\\1!)", "ab" + "yx" * 40 + "ab!"),
                                           ("a.{0,2}b", "終" * 30 + "a終b"), ("(?<=" + "ab" * 20 + ")x", "ab" * 20 + "x")])
def test_a_pattern_whose_match_reads_far_back_stops_at_the_token_that_completes_it(tokenizer, pattern, text):
    """A lookahead can be satisfied by the newest token long after its match: such a pattern is searched on the
    whole text at every step.  The oracle: the whole-text search after every token."""
    ids = byte_ids(text)
    want = whole_text_stop(tokenizer, ids, (pattern,))
    assert want is not None
    r = SimpleNamespace(params=SamplingParams(max_new_tokens=500, stop_regex=(pattern,)), output_ids=[], grammar=None,
                        stop_text_cut=None)
    stopped_at = None
    for i, t in enumerate(ids):
        r.output_ids.append(t)
        if stop_reason(r, t, (256,), tokenizer) is not None:
            stopped_at = i
            break
    assert stopped_at == want[0]
