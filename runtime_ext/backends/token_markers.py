"""Token-exact text for `@sgl.function` programs.

The SGLang frontend keeps a program's state as text (`s.text_`).  Re-tokenizing text is not exact: a cut
at token c of a sequence can split a multi-byte character or a BPE merge, so `tokenize(detokenize(x[:c]))`
is not `x[:c]`.  forerun therefore lets a program write token ids *into* the text stream as a marker that
the token-exact backends (embedded engine, SGLang server backend) decode back to the exact ids:

    s += token_ids(root[:cut])        # this part of the prompt is exactly these ids
    s += sampling_seed(1234)          # the following gen draws its noise from this seed
    s += sgl.gen("suffix", max_tokens=64, return_logprob=True)

A marker is a private-use code point followed by this process's `MARKER_KEY` (four random code points of the
supplementary private-use plane, drawn at import), so text that merely contains private-use characters - user
input, a data batch, a model's output - is tokenized as text, and cannot pass itself off as token ids or a seed
without the key.  Plain text around markers is tokenized as usual; text a backend generated earlier is remembered
with its ids, so multi-turn programs and forks stay exact without markers.  Marked text is for the process that
wrote it (the key changes with every process); `strip_markers` renders it for display.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Sequence, Union

MARKER_KEY = "".join(chr(0xF0000 + secrets.randbelow(0xFFFE)) for _ in range(4))
"""This process's marker key (see the module docstring)."""
IDS_BEGIN = "\ue000" + MARKER_KEY
IDS_END = "\ue001" + MARKER_KEY
SEED_BEGIN = "\ue002" + MARKER_KEY
SEED_END = "\ue003" + MARKER_KEY
TEMPS_BEGIN = "\ue004" + MARKER_KEY
TEMPS_END = "\ue005" + MARKER_KEY

_MARKER = re.compile(
    f"{IDS_BEGIN}([0-9,]*){IDS_END}|{SEED_BEGIN}(-?[0-9]+){SEED_END}|{TEMPS_BEGIN}([0-9.eE+,-]*){TEMPS_END}"
)
_ALL_MARKER_TAGS = (IDS_BEGIN, IDS_END, SEED_BEGIN, SEED_END, TEMPS_BEGIN, TEMPS_END)


def token_ids(ids: Sequence[int]) -> str:
    """Text that a token-exact backend reads back as exactly `ids`."""
    ids = [int(i) for i in ids]
    if any(i < 0 for i in ids):
        raise ValueError(f"token ids must be non-negative, got {min(ids)}")
    return f"{IDS_BEGIN}{','.join(map(str, ids))}{IDS_END}"


def sampling_seed(seed: int) -> str:
    """Text that sets the sampling seed of the stream's following `gen` calls (SGLang `sampling_seed`).

    Noise is keyed by (seed, absolute token position), so one seed serves several gens of a stream.
    """
    return f"{SEED_BEGIN}{int(seed)}{SEED_END}"


def logprob_temperatures(temperatures: Sequence[float]) -> str:
    """Text asking the following gens of the stream to also return log q_τ' of every generated token at
    each temperature τ' (full vocabulary).  Needed by MultiTryMH; supported by the embedded engine."""
    temps = [float(t) for t in temperatures]
    if any(not (t > 0) for t in temps):
        raise ValueError(f"logprob temperatures must be > 0, got {temps}")
    return f"{TEMPS_BEGIN}{','.join(repr(t) for t in temps)}{TEMPS_END}"


@dataclass(frozen=True)
class Directives:
    """Per-stream request settings carried by markers (the last marker of each kind wins)."""

    seed: int | None = None
    logprob_temperatures: tuple[float, ...] = ()


@dataclass(frozen=True)
class TextSegment:
    text: str


@dataclass(frozen=True)
class IdsSegment:
    ids: tuple[int, ...]


Segment = Union[TextSegment, IdsSegment]


def parse_marked_text(text: str) -> tuple[list[Segment], int | None]:
    """Split marked text into text / id segments; return them and the last sampling seed (or None)."""
    segments, directives = parse_marked_text_directives(text)
    return segments, directives.seed


def parse_marked_text_directives(text: str) -> tuple[list[Segment], Directives]:
    """Split marked text into text / id segments; return them and the stream's `Directives`."""
    segments: list[Segment] = []
    seed: int | None = None
    temps: tuple[float, ...] = ()
    pos = 0
    for m in _MARKER.finditer(text):
        if m.start() > pos:
            segments.append(TextSegment(text[pos : m.start()]))
        if m.group(1) is not None:
            body = m.group(1)
            segments.append(IdsSegment(tuple(int(x) for x in body.split(",")) if body else ()))
        elif m.group(2) is not None:
            seed = int(m.group(2))
        else:
            body = m.group(3)
            temps = tuple(float(x) for x in body.split(",")) if body else ()
        pos = m.end()
    if pos < len(text):
        segments.append(TextSegment(text[pos:]))
    for seg in segments:
        if isinstance(seg, TextSegment) and any(tag in seg.text for tag in _ALL_MARKER_TAGS):
            raise ValueError("malformed forerun token marker in program text")  # this process wrote it, cut
    return segments, Directives(seed=seed, logprob_temperatures=temps)


def strip_markers(text: str, decode=None) -> str:
    """Marked text for display: id markers are decoded with `decode(ids)` if given, else dropped."""

    def repl(m: re.Match) -> str:
        if m.group(1) is not None and decode is not None:
            body = m.group(1)
            return decode([int(x) for x in body.split(",")] if body else [])
        return ""

    return _MARKER.sub(repl, text)
