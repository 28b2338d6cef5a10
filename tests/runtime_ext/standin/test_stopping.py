"""The stand-in stops and trims as SGLang 0.5.23 does (`standin.stopping`, `standin.detokenizer`).

Two oracles, neither of them the code under test:
- hand-computed expectations on a scripted model (greedy decoding writes a fixed byte string), read off
  SGLang's rules: which text is searched (a tail window of the output, never the prompt), which match wins, what
  output ids and text come back, what finish_reason says;
- SGLang's own code (`sglang_stop_reference`: Req.update_finish_state and the detokenizer compiled from the
  installed wheel), run on the stand-in's own unstopped tokens for random stop strings, patterns and settings.

    guarantee                                                              test
    a stop string / pattern / id ends the output as SGLang's rules say     test_scripted_stops_and_text
    a stream sends no chunk while the output ends with a stop's start     test_stream_holds_back_a_stop_prefix
    each item of a batched request has its own stops                      test_batched_items_stop_on_their_own
    min_new_tokens masks EOS and stop ids, not stop strings               test_min_new_tokens_masks_eos_and_stop_ids
    SGLang's limits on stops and min_new_tokens are HTTP errors           test_stop_limits_are_refused
    random requests give what SGLang's own code gives                     test_matches_sglangs_own_code
    the ports of SGLang helpers agree with SGLang's                       test_ported_helpers_match_sglang
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import requests

from forerun.runtime_ext.standin import detokenizer, stopping
from forerun.runtime_ext.standin.server import BOS_ID, EOS_ID, VOCAB_SIZE, ByteModel, StandInServer
from forerun.testing.test_modules import sibling

ref = sibling(__file__, "sglang_stop_reference")


class ScriptedModel(ByteModel):
    """Greedy decoding (temperature 0) writes `script` after a prompt of `prompt_len` tokens, then byte 0
    (a masked token - min_new_tokens - makes way for byte 0 too)."""

    def __init__(self, script: bytes | list[int], prompt_len: int) -> None:
        super().__init__()
        self.script = list(script)
        self.prompt_len = prompt_len

    def logits(self, prefix, banned=()):
        z = np.zeros(VOCAB_SIZE)
        k = len(prefix) - self.prompt_len
        z[self.script[k] if k < len(self.script) else 0] = 20.0
        z[list(banned)] = -np.inf
        return z


def _post(srv, body):
    r = requests.post(srv.url + "/generate", json=body, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def _greedy(prompt: bytes, script: bytes | list[int], **sampling_params):
    ids = [BOS_ID] + list(prompt)
    with StandInServer(model=ScriptedModel(script, len(ids))) as srv:
        out = _post(srv, {"input_ids": ids,
                          "sampling_params": {"max_new_tokens": 12, "temperature": 0, **sampling_params}})
    return bytes(t for t in out["output_ids"] if t < 256), out["output_ids"], out["text"], out["meta_info"]


SCRIPT = b"ab Q:cd" + bytes([0])  # followed by byte 0 forever
# (prompt, script, sampling params) -> (output bytes, text, finish_reason), computed by hand from SGLang's rules
CASES = [
    # a stop string that spans two tokens ends the output at the token completing it (kept in the ids); the text
    # is cut before it, or after it with no_stop_trim
    ((b"x", SCRIPT, {"stop": ["Q:"]}), (b"ab Q:", "ab ", {"type": "stop", "matched": "Q:"})),
    ((b"x", SCRIPT, {"stop": "Q:", "no_stop_trim": True}), (b"ab Q:", "ab Q:", {"type": "stop", "matched": "Q:"})),
    # stop strings are searched in the output only: one in the prompt, or across the prompt's end, never stops
    ((b"Q:", b"ab cd", {"stop": ["Q:"]}), (b"ab cd\0\0\0\0\0\0\0", "ab cd" + "\0" * 7,
                                           {"type": "length", "length": 12})),
    ((b"Q", b":ab", {"stop": ["Q:"]}), (b":ab" + bytes(9), ":ab" + "\0" * 9, {"type": "length", "length": 12})),
    # two stop strings complete at the same token: the first in the list wins, and the text is cut at its
    # first occurrence
    ((b"x", SCRIPT, {"stop": [":", "Q:"]}), (b"ab Q:", "ab Q", {"type": "stop", "matched": ":"})),
    ((b"x", SCRIPT, {"stop": ["Q:", ":"]}), (b"ab Q:", "ab ", {"type": "stop", "matched": "Q:"})),
    # a stop string wins over a pattern that matches at the same token
    ((b"x", SCRIPT, {"stop": [":"], "stop_regex": ["Q."]}), (b"ab Q:", "ab Q", {"type": "stop", "matched": ":"})),
    # a pattern: finish_reason names it; the detokenizer cuts at the pattern's text where it occurs literally
    ((b"x", SCRIPT, {"stop_regex": [r"Q."]}), (b"ab Q:", "ab Q:", {"type": "stop", "matched": "Q."})),
    ((b"x", SCRIPT, {"stop_regex": "Q:"}), (b"ab Q:", "ab ", {"type": "stop", "matched": "Q:"})),
    # the pattern is searched in the last max_len + 1 tokens only: "^Q" (max_len 1) matches when "Q" opens
    # the 2-token window, at ":" - not at "Q", which follows " "
    ((b"x", SCRIPT, {"stop_regex": ["^Q"]}), (b"ab Q:", "ab Q:", {"type": "stop", "matched": "^Q"})),
    # ... so a pattern whose match is more bytes than its max_len + 1 is never seen: "☃X" is 2 characters
    # (window 3 tokens) but 4 bytes
    ((b"x", "a☃X".encode(), {"stop_regex": ["☃X"]}), ("a☃X".encode() + bytes(7), "a☃X" + "\0" * 7,
                                                     {"type": "length", "length": 12})),
    # a request that does not stream sends its output every 50 tokens: a stop string that straddles the 50th
    # token leaves its start in the text (the finished send cuts only what was not sent yet)
    ((b"x", b"a" * 49 + b"Q:", {"stop": ["Q:"], "max_new_tokens": 60}),
     (b"a" * 49 + b"Q:", "a" * 49 + "Q", {"type": "stop", "matched": "Q:"})),
    # an empty stop string matches at once; an empty list is no stop
    ((b"x", SCRIPT, {"stop": [""]}), (b"a", "", {"type": "stop", "matched": ""})),
    ((b"x", SCRIPT, {"stop": [], "max_new_tokens": 5}), (b"ab Q:", "ab Q:", {"type": "length", "length": 5})),
    # a stop id is kept in the ids and dropped from the text (kept with no_stop_trim); EOS spells nothing
    ((b"x", SCRIPT, {"stop_token_ids": [ord(":")]}), (b"ab Q:", "ab Q", {"type": "stop", "matched": ord(":")})),
    ((b"x", SCRIPT, {"stop_token_ids": [ord(":")], "no_stop_trim": True}),
     (b"ab Q:", "ab Q:", {"type": "stop", "matched": ord(":")})),
    ((b"x", list(b"ab") + [EOS_ID], {}), (b"ab", "ab", {"type": "stop", "matched": EOS_ID})),
    ((b"x", list(b"a") + [EOS_ID] + list(b"b"), {"ignore_eos": True, "max_new_tokens": 3}),
     (b"ab", "ab", {"type": "length", "length": 3})),
    # ... but the stop check decodes the tail with special tokens spelled out: "s>" matches in "a</s>"
    ((b"x", list(b"a") + [EOS_ID] + list(b"b"), {"ignore_eos": True, "stop": ["s>"]}),
     (b"a", "a", {"type": "stop", "matched": "s>"})),
    # a stop string completed by a stop id wins over the id
    ((b"x", SCRIPT, {"stop": ["Q:"], "stop_token_ids": [ord(":")]}),
     (b"ab Q:", "ab ", {"type": "stop", "matched": "Q:"})),
    # ignore_eos ignores stop ids too, not stop strings
    ((b"x", SCRIPT, {"stop_token_ids": [ord(":")], "ignore_eos": True, "max_new_tokens": 6}),
     (b"ab Q:c", "ab Q:c", {"type": "length", "length": 6})),
    ((b"x", SCRIPT, {"stop": ["Q:"], "ignore_eos": True}), (b"ab Q:", "ab ", {"type": "stop", "matched": "Q:"})),
    # the length: a stop completed by the last allowed token still wins; one token short, the length ends it
    ((b"x", SCRIPT, {"stop": ["Q:"], "max_new_tokens": 5}), (b"ab Q:", "ab ", {"type": "stop", "matched": "Q:"})),
    ((b"x", SCRIPT, {"stop": ["Q:"], "max_new_tokens": 4}), (b"ab Q", "ab Q", {"type": "length", "length": 4})),
    ((b"x", SCRIPT, {"stop": ["Q:"], "max_new_tokens": 0}), (b"", "", {"type": "length", "length": 0})),
]


@pytest.mark.parametrize("case, expected", CASES, ids=[json.dumps(c[2]) + repr(c[1][:4]) for c, _ in CASES])
def test_scripted_stops_and_text(case, expected):
    prompt, script, params = case
    got_bytes, ids, text, meta = _greedy(prompt, script, **params)
    assert (got_bytes, text, meta["finish_reason"]) == expected
    assert meta["completion_tokens"] == len(ids)


def test_stream_holds_back_a_stop_prefix():
    """SGLang's scheduler sends no chunk while the output's tail ends with the start of a stop string; every
    chunk carries the text so far (the stop cut only from the last)."""
    ids = [BOS_ID, ord("x")]
    with StandInServer(model=ScriptedModel(b"ab QQ:cd", len(ids))) as srv:
        body = {"input_ids": ids, "stream": True, "sampling_params": {"max_new_tokens": 12, "temperature": 0,
                                                                       "stop": ["Q:", "zz"]}}
        with requests.post(srv.url + "/generate", json=body, stream=True, timeout=10) as resp:
            lines = [ln.decode()[6:] for ln in resp.iter_lines() if ln]
        plain = _post(srv, {**body, "stream": False})
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(ln) for ln in lines[:-1]]
    # "a", "ab", "ab " are sent; "Q" and "QQ" end with the start of "Q:"; "QQ:" finishes
    assert [(len(c["output_ids"]), c["text"]) for c in chunks] == [(1, "a"), (2, "ab"), (3, "ab "), (6, "ab Q")]
    assert [c["meta_info"]["finish_reason"] for c in chunks] == [None, None, None,
                                                                  {"type": "stop", "matched": "Q:"}]
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == [1, 2, 3, 6]
    assert (chunks[-1]["output_ids"], chunks[-1]["text"]) == (plain["output_ids"], plain["text"])


def test_batched_items_stop_on_their_own():
    ids = [BOS_ID, ord("x")]
    with StandInServer(model=ScriptedModel(SCRIPT, len(ids))) as srv:
        outs = _post(srv, {"input_ids": [ids, ids, ids], "sampling_params": [
            {"max_new_tokens": 12, "temperature": 0, "stop": ["Q:"]},
            {"max_new_tokens": 12, "temperature": 0, "stop_regex": ["c"], "no_stop_trim": True},
            {"max_new_tokens": 3, "temperature": 0, "stop": ["Q:"]}]})
    assert [(o["text"], o["meta_info"]["finish_reason"]) for o in outs] == [
        ("ab ", {"type": "stop", "matched": "Q:"}), ("ab Q:c", {"type": "stop", "matched": "c"}),
        ("ab ", {"type": "length", "length": 3})]


def test_min_new_tokens_masks_eos_and_stop_ids():
    """SGLang's MinNewTokens penalizer sets EOS and the stop ids to -inf for the first min_new_tokens tokens (the
    scripted model then writes byte 0); the reported logprobs are of the masked distribution; stop strings still
    stop."""
    script = list(b"a") + [EOS_ID] + list(b"b:c") + [EOS_ID]
    got, _, _, meta = _greedy(b"x", script, min_new_tokens=3, stop_token_ids=[ord(":")])
    assert got == b"a\0b:" and meta["finish_reason"] == {"type": "stop", "matched": ord(":")}
    got, _, _, meta = _greedy(b"x", script, min_new_tokens=4, stop_token_ids=[ord(":")])
    assert got == b"a\0b\0c" and meta["finish_reason"] == {"type": "stop", "matched": EOS_ID}
    got, _, text, meta = _greedy(b"x", script, min_new_tokens=5, stop=["b"])
    assert (got, text, meta["finish_reason"]) == (b"a\0b", "a\0", {"type": "stop", "matched": "b"})
    m = ByteModel()
    with StandInServer(model=m) as srv:
        out = _post(srv, {"input_ids": [BOS_ID, 1], "return_logprob": True, "sampling_params": {
            "max_new_tokens": 3, "min_new_tokens": 2, "stop_token_ids": [7], "temperature": 0.5,
            "sampling_seed": 4, "ignore_eos": True}})
    seq, lq = [BOS_ID, 1], []
    for k, t in enumerate(out["output_ids"]):
        z = m.table[seq[-1]] + m.position_term[len(seq) % 64]
        if k < 2:
            z = np.where(np.isin(np.arange(VOCAB_SIZE), [EOS_ID, 7]), -np.inf, z)
        zt = z / 0.5
        lq.append(zt[t] - np.log(np.sum(np.exp(zt[np.isfinite(zt)]))))
        seq.append(t)
    assert [e[0] for e in out["meta_info"]["output_token_logprobs"]] == pytest.approx(lq, abs=1e-12)


def test_stop_limits_are_refused():
    """SGLang's normalize: at most 32 stop strings, 32 patterns, 256 bytes a pattern; its verify: min_new_tokens
    within [0, max_new_tokens] (ValueError: HTTP 400)."""
    with StandInServer() as srv:
        def status(sp):
            return requests.post(srv.url + "/generate", timeout=10, json={
                "input_ids": [BOS_ID, 1], "sampling_params": {"max_new_tokens": 1, **sp}})
        assert status({"stop": ["x"] * 32, "stop_regex": ["y"] * 32}).status_code == 200
        r = status({"stop": ["x"] * 33})
        assert r.status_code == 400 and r.json()["error"]["message"] == "at most 32 stop strings are allowed, got 33"
        assert status({"stop_regex": ["y"] * 33}).status_code == 400
        r = status({"stop_regex": ["é" * 129]})
        assert r.status_code == 400 and "258 bytes, over the 256-byte limit" in r.text
        assert status({"stop_regex": ["("]}).status_code == 500  # re.error is no ValueError: it escapes
        r = status({"min_new_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["message"] == (
            "min_new_tokens must be in [0, max_new_tokens(1)], got 2.")
        assert status({"min_new_tokens": 1}).status_code == 200


# -- SGLang's own code as the oracle ------------------------------------------------------------------------------
PATTERNS = [r"[0-9]", r"\d\d", r"^[a-z]", r"[A-Z].", r"(ab|c)", r"[!-/]{2}", r"x+", r"\s$", r"[^\x00-\x7f]"]


def _random_request(rng: random.Random, text: str) -> dict:
    """Stop strings cut from the unstopped output's text (so that they hit), patterns, ids, flags."""
    sp: dict = {"max_new_tokens": rng.choice([20, 60, 120])}
    if rng.random() < 0.8:
        stops = []
        for _ in range(rng.randint(1, 3)):
            start = rng.randrange(max(len(text) - 1, 1))
            stops.append(text[start:start + rng.randint(1, 4)])
        if rng.random() < 0.1:
            stops.append("")
        sp["stop"] = stops if len(stops) > 1 or rng.random() < 0.5 else stops[0]
    if rng.random() < 0.5:
        sp["stop_regex"] = rng.sample(PATTERNS, rng.randint(1, 2))
    if rng.random() < 0.3:
        sp["stop_token_ids"] = [rng.randrange(256) for _ in range(rng.randint(1, 3))]
    for flag in ("ignore_eos", "no_stop_trim"):
        if rng.random() < 0.4:
            sp[flag] = True
    return sp


def test_matches_sglangs_own_code():
    """For random prompts, seeds and stops, the stand-in's response (ids, text, finish_reason) and its stream
    (every chunk's token count and text) are what SGLang's own finish and detokenizer code make of the
    stand-in's unstopped tokens (the tokens a seed draws do not depend on the stops)."""
    rng = random.Random(7)
    m = ByteModel()
    m.table[:, EOS_ID] += 8.0  # EOS now and then
    m.table[:, 32:127] += 3.0  # mostly ASCII: stop strings and patterns of readable text
    stopped = 0
    with StandInServer(model=m) as srv:
        tok = srv.tokenizer
        for trial in range(60):
            prompt = [BOS_ID] + [rng.randrange(256) for _ in range(rng.randint(1, 8))]
            common = {"temperature": 1.0, "sampling_seed": trial}
            free = _post(srv, {"input_ids": prompt, "sampling_params": {
                **common, "max_new_tokens": 120, "ignore_eos": True}})["output_ids"]
            sp = {**common, **_random_request(rng, tok.decode(free, skip_special_tokens=True))}
            stream = rng.random() < 0.5
            want = ref.reference_run(tok, EOS_ID, VOCAB_SIZE, prompt, free, sp, stream)
            body = {"input_ids": prompt, "sampling_params": sp, "stream": stream}
            if stream:
                with requests.post(srv.url + "/generate", json=body, stream=True, timeout=10) as resp:
                    lines = [ln.decode()[6:] for ln in resp.iter_lines() if ln][:-1]
                chunks = [json.loads(ln) for ln in lines]
                assert [(len(c["output_ids"]), c["text"]) for c in chunks] == want.sends, sp
                out = chunks[-1]
            else:
                out = _post(srv, body)
            assert (out["output_ids"], out["text"], out["meta_info"]["finish_reason"]) == (
                want.output_ids, want.text, want.finish_reason), sp
            stopped += want.finish_reason["type"] == "stop"
    assert stopped >= 30


def test_ported_helpers_match_sglang():
    from sglang.srt.sampling.sampling_params import get_max_seq_length
    from sglang.utils import find_printable_text

    for pattern in PATTERNS + [r"(ab){2}", r"a|bcd", r"x{1,3}", r"\bq", r"a*?b", r"(?=x)y", "Q:"]:
        assert stopping.max_regex_length(pattern) == get_max_seq_length(pattern), pattern
    for text in ["", "ab", "ab cd", "ab cd\ufffd", "x\n", "ab 日", "ab 日\ufffd", "日本\ufffd", " \ufffd"]:
        assert detokenizer.find_printable_text(text) == find_printable_text(text), text
    moved = {what: (path, n) for what, (path, n, text) in ref.PINNED.items() if ref.src.line(path, n) != text}
    assert moved == {}
