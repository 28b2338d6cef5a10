"""Stop strings of the embedded engine (runtime_ext/engine/output.py) on the byte-level tiny tokenizer, where a
character outside ASCII takes up to four tokens."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from forerun.runtime_ext.engine.models import load_model
from forerun.runtime_ext.engine.output import stop_reason
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
