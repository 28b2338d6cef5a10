"""Constrained decoding of the embedded engine: xgrammar token bitmasks on the logits of the constrained rows.

SGLang's default grammar backend is xgrammar (`srt/constrained/xgrammar_backend.py`); the engine uses it the
same way - one `TokenizerInfo` per tokenizer (stop tokens = the model's EOS ids), `compile_regex` /
`compile_json_schema` (any whitespace, as SGLang's default) / `compile_grammar` (EBNF), a `GrammarMatcher` per
request - and applies the matcher's bitmask inside the batched decode step (`decode.sample_step`):

    notion                                          code
    grammar G of a request (SGLang's fields)        SamplingParams.constraint = (field, text)
    G compiled for a tokenizer, cached              grammar_compiler(tokenizer, V, eos).compile(field, text):
                                                    compilers keyed by tokenizer, compiled grammars by (field, text);
                                                    an engine's: EngineGrammars (built at its first constraint)
    parse state of a request after y_<t             RowGrammar (one xgrammar GrammarMatcher)
    A_t, the tokens G allows at step t              allowed_tokens(grammars, V) -> bool [R, V] (numpy)
    q_τ restricted to A_t and renormalised          restricted_stats(stats, rows, allowed)  (sampling)
    y_t ~ that distribution, u(seed, p) as always   draw_constrained(stats, items) -> {row: (y, log q)}
    G complete: A_t = the model's EOS ids only      the matcher (its stop tokens = the model's EOS ids, as SGLang's)
    G terminated (an EOS id accepted)               RowGrammar.terminated -> the request finishes (output.stop_reason)

A request's own stop_token_ids are no stop tokens of its grammar, as in SGLang (whose matchers keep the tokenizer's
EOS ids, `override_stop_tokens` None): the grammar allows such a token where its text fits (a special token never),
and when one is drawn the request ends by the ordinary stop rule (`output`, rule 3), its grammar unfinished.

Only the constrained rows pay: their bitmasks are filled, unpacked and applied on a copy of their own logits rows;
the unconstrained rows of the same step draw from the raw logits exactly as without any grammar.  The draw of a
constrained row reads only its own logits row, its own mask and u(seed, position), so it is batch-invariant like
every other draw.  log p0, the entropy and the top-k stay those of the raw logits; the drawn token's log q is of
the masked distribution (`meta_info["output_token_logprobs_masked"]`).
"""

from __future__ import annotations

import json
import sys
import threading
import weakref
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np
import torch

from ..protocol import EngineError, SamplingParams
from .sampling import Draw, VocabStats, draw_tokens, restricted_stats

ANY_JSON = "$$ANY$$"
"""SGLang's json_schema value for "any JSON" (its builtin JSON grammar)."""


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError as exc:  # pragma: no cover - xgrammar is a declared dependency
        raise EngineError("constrained decoding (regex / json_schema / ebnf) needs the xgrammar package: "
                          "pip install xgrammar") from exc
    return xgrammar


class RowGrammar:
    """One request's parse state: which tokens its grammar allows next, and whether it has terminated."""

    def __init__(self, compiled: Any, stop_token_ids: Sequence[int], key: tuple[str, str]) -> None:
        self.key = key
        self._matcher = _xgrammar().GrammarMatcher(compiled, override_stop_tokens=sorted(set(stop_token_ids)))

    def fill(self, bitmask: torch.Tensor, index: int) -> None:
        """Write the allowed tokens into row `index` of an xgrammar bitmask (int32 [R, ceil(V / 32)])."""
        self._matcher.fill_next_token_bitmask(bitmask, index)

    def accept(self, token: int) -> None:
        """Advance past `token`; a token the grammar does not allow is a bug (the draw was masked)."""
        if not self._matcher.accept_token(int(token)):
            raise EngineError(f"the grammar ({self.key[0]}) refused token {token} after a masked draw")

    @property
    def terminated(self) -> bool:
        """An EOS id was accepted where the grammar may end: nothing can follow."""
        return bool(self._matcher.is_terminated())


class GrammarCompiler:
    """Compiles constraints for one tokenizer (its vocabulary size and stop tokens); compiled grammars are kept
    in an LRU keyed by (field, text), so every request with the same constraint shares one compilation."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int], *, cache_size: int = 256) -> None:
        xgr = _xgrammar()
        self.vocab_size = int(vocab_size)
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size,
                                                       stop_token_ids=list(self.stop_token_ids))
        self._compiler = xgr.GrammarCompiler(self.info, cache_enabled=False)  # the LRU below is the cache
        self._cache: "OrderedDict[tuple[str, str], Any]" = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.compiles = 0
        self.hits = 0

    def compile(self, field: str, text: str) -> Any:
        """The compiled grammar of one constraint (EngineError when the grammar is invalid)."""
        key = (field, text)
        with self._lock:  # one compilation per key even when a program's fork threads send it together
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return hit
            try:
                compiled = self._compile(field, text)
            except (RuntimeError, ValueError, TypeError) as exc:
                raise EngineError(f"invalid {field} constraint: {exc}") from exc
            self.compiles += 1
            self._cache[key] = compiled
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
            return compiled

    def _compile(self, field: str, text: str) -> Any:
        if field == "regex":
            return self._compiler.compile_regex(text)
        if field == "ebnf":
            return self._compiler.compile_grammar(text)
        if field == "json_schema":
            if text == ANY_JSON:
                return self._compiler.compile_builtin_json_grammar()
            json.loads(text)  # a JSONDecodeError (a ValueError) names the bad schema text
            return self._compiler.compile_json_schema(text, any_whitespace=True)
        raise ValueError(f"unknown constraint field {field!r}")

    def row_grammar(self, params: SamplingParams) -> RowGrammar | None:
        """A fresh parse state for a request with `params` (None when it has no constraint).  Its stop tokens are
        the model's EOS ids only (SGLang's); the request's stop_token_ids are ordinary tokens to the grammar."""
        if params.constraint is None:
            return None
        compiled = self.compile(*params.constraint)
        return RowGrammar(compiled, self.stop_token_ids, params.constraint)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"grammar_compiles": self.compiles, "grammar_cache_hits": self.hits,
                    "grammar_cached": len(self._cache)}


_COMPILERS: "weakref.WeakKeyDictionary[Any, dict[tuple[int, tuple[int, ...]], GrammarCompiler]]" = (
    weakref.WeakKeyDictionary())
_COMPILERS_LOCK = threading.Lock()


def grammar_compiler(tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int]) -> GrammarCompiler:
    """The GrammarCompiler of a tokenizer (shared by every engine that uses the same tokenizer object)."""
    key = (int(vocab_size), tuple(int(t) for t in stop_token_ids))
    with _COMPILERS_LOCK:
        try:
            per_tokenizer = _COMPILERS.setdefault(tokenizer, {})
        except TypeError:  # a tokenizer that cannot be weakly referenced: a compiler of its own
            return GrammarCompiler(tokenizer, vocab_size, stop_token_ids)
        compiler = per_tokenizer.get(key)
        if compiler is None:
            compiler = per_tokenizer[key] = GrammarCompiler(tokenizer, vocab_size, stop_token_ids)
        return compiler


class EngineGrammars:
    """An engine's grammars: the compiler of its tokenizer, built at the first constrained request (importing
    xgrammar takes seconds), and each request's parse state, made at submission on the caller's thread (a
    compilation, or a cache hit, never stalls the decode loop)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self._args = (tokenizer, vocab_size, tuple(eos_token_ids))
        self._compiler: GrammarCompiler | None = None

    @property
    def compiler(self) -> GrammarCompiler:
        if self._compiler is None:
            self._compiler = grammar_compiler(*self._args)
        return self._compiler

    def for_request(self, rid: str, params: SamplingParams, decodes: bool) -> RowGrammar | None:
        """The parse state of a decoding request with a constraint, else None (EngineError names the request)."""
        if not decodes or params.constraint is None:
            return None
        try:
            return self.compiler.row_grammar(params)
        except EngineError as exc:
            raise EngineError(f"request {rid}: {exc}") from exc

    def stats(self) -> dict[str, int]:
        return self._compiler.stats() if self._compiler is not None else {}


def allowed_tokens(grammars: Sequence[RowGrammar], vocab_size: int) -> np.ndarray:
    """bool [R, V]: which tokens each grammar allows next.  xgrammar's bitmask is int32 [R, ceil(V / 32)] with
    token v at bit v % 32 of word v // 32: on a little-endian machine its bytes, unpacked least significant bit
    first, are the tokens in order."""
    xgr = _xgrammar()
    bitmask = xgr.allocate_token_bitmask(len(grammars), vocab_size)
    for j, g in enumerate(grammars):
        g.fill(bitmask, j)
    words = bitmask.numpy()
    if sys.byteorder != "little":  # pragma: no cover - big-endian hosts: bytes of each word in little order
        words = words.astype("<i4")
    bits = np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little")
    return bits[:, :vocab_size].view(np.bool_)


def draw_constrained(stats: VocabStats, items: Sequence[tuple[int, RowGrammar | None, Sequence[int], SamplingParams,
                                                                 int, int]]) -> dict[int, Draw | Exception]:
    """For each (row, grammar or None, banned tokens, params, seed, position): (y, log q) drawn from q_τ restricted
    to the tokens the grammar allows (all without one) less the banned ones (`output.banned_tokens`: EOS and the
    stop ids before min_new_tokens) - the same inverse-CDF draw, the same u(seed, position); a failure is
    returned, not raised."""
    if not items:
        return {}
    rows = [row for row, *_ in items]
    try:
        vocab = stats.logits.shape[-1]
        allowed = np.ones((len(items), vocab), dtype=np.bool_)
        with_grammar = [j for j, (_, g, *_) in enumerate(items) if g is not None]
        if with_grammar:
            allowed[with_grammar] = allowed_tokens([items[j][1] for j in with_grammar], vocab)
        for j, (_, _, banned, *_) in enumerate(items):
            allowed[j, list(banned)] = False
        masked = restricted_stats(stats, rows, allowed)
    except Exception as exc:  # reported for these rows only
        return {row: exc for row in rows}
    out: dict[int, Draw | Exception] = {}
    drawable = []
    for j, (row, _, banned, p, seed, position) in enumerate(items):
        if masked.finite[j]:
            drawable.append((j, p, seed, position))
        else:
            what = "the grammar" if items[j][1] is not None else "min_new_tokens (EOS and the stop ids masked)"
            out[row] = EngineError(f"{what} allows no token of the model's vocabulary at position {position}")
    for j, drawn in draw_tokens(masked, drawable).items():
        out[rows[j]] = drawn
    return out
