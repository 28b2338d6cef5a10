"""The ids of program text that continues earlier tokens, as a whole-text tokenization would give them.

SGLang's stock backend sends the program's whole text and the server tokenizes it once; the token-exact backends
keep the ids of what came before (generated tokens, `token_ids` markers) and tokenize only the text after them.
A SentencePiece tokenizer with a dummy prefix (Llama 2, Mistral: a Metaspace pre-tokenizer that prepends "▁")
starts EVERY encoding at a word boundary: "\\nA:" alone encodes as ["▁", "<0x0A>", "A", ":"], where the same text
inside a longer one is ["<0x0A>", "A", ":"].  Tokenized alone, a continuation would put a space before it that is
in no one's text.

    notion                                           code
    does this tokenizer add a word boundary          starts_at_word_boundary(tokenizer): "a" alone against "a"
    in front of every encoding                       after an anchor (a newline), cached per tokenizer
    a continuation's ids                             continuation_ids(tokenizer, text): the ids `text` gets
                                                     after the anchor, the anchor's own ids cut off; the plain
                                                     encoding when the tokenizer adds no boundary, or when the
                                                     text's first characters merge with the anchor's
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

ANCHOR = "\n"
"""Text put before a continuation when the tokenizer adds a word boundary: a newline is its own token in the
SentencePiece vocabularies that do (a byte-fallback token where no other exists)."""

_PROBE = "a"
_ANCHOR_IDS: "weakref.WeakKeyDictionary[Any, tuple[int, ...] | None]" = weakref.WeakKeyDictionary()
"""Per tokenizer: the anchor's ids when it adds a word boundary, else None (probed once)."""
_LOCK = threading.Lock()


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _boundary_anchor(tokenizer: Any) -> tuple[int, ...] | None:
    """The anchor's ids if `tokenizer` encodes text alone differently from the same text after the anchor (a
    SentencePiece dummy prefix), else None (byte-level BPE: GPT-2, Llama 3, Qwen 2, SmolLM2, which splits at a
    newline anyway).  Cached per tokenizer object (one where weak references fail: probed each time)."""
    try:
        with _LOCK:
            if tokenizer in _ANCHOR_IDS:
                return _ANCHOR_IDS[tokenizer]
    except TypeError:  # not weakly referenceable or not hashable
        return _probe(tokenizer)
    found = _probe(tokenizer)
    with _LOCK:
        _ANCHOR_IDS[tokenizer] = found
    return found


def _probe(tokenizer: Any) -> tuple[int, ...] | None:
    anchor = _encode(tokenizer, ANCHOR)
    after = _encode(tokenizer, ANCHOR + _PROBE)
    boundary = after[: len(anchor)] == anchor and after[len(anchor):] != _encode(tokenizer, _PROBE)
    return tuple(anchor) if boundary else None


def starts_at_word_boundary(tokenizer: Any) -> bool:
    """Whether `tokenizer` starts every encoding at a word boundary (see `_boundary_anchor`)."""
    return _boundary_anchor(tokenizer) is not None


def continuation_ids(tokenizer: Any, text: str) -> list[int]:
    """The ids of `text` continuing earlier ids (no special tokens added): see the module docstring."""
    anchor = _boundary_anchor(tokenizer) if text else None
    if anchor is None:
        return _encode(tokenizer, text)
    after = _encode(tokenizer, ANCHOR + text)
    if tuple(after[: len(anchor)]) == anchor:
        return after[len(anchor):]
    return _encode(tokenizer, text)  # the text's first characters merged into the anchor's tokens
