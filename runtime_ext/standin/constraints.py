"""Constrained decoding on the stand-in server: SGLang's `regex`, `json_schema` and `ebnf` sampling params, compiled
by xgrammar for the byte vocabulary and applied as SGLang applies them.

    SGLang 0.5.23                                           stand-in
    one of json_schema / regex / ebnf / structural_tag      request_grammar(sp): two or more is HTTP 400 with
      (SamplingParams.verify L325-329)                      SGLang's message; structural_tag is refused (HTTP 400:
                                                            the stand-in does not implement it), never ignored
    xgrammar backend: TokenizerInfo with the model's EOS    the engine's GrammarCompiler over `byte_tokenizer`,
      ids as stop tokens, json_schema with any_whitespace,  stop tokens {EOS}; "$$ANY$$" the builtin JSON grammar
      "$$ANY$$" the builtin JSON grammar
    a grammar that does not compile: the request aborts     HTTP 400 "Failed to compile <field> grammar: <why>"
      with status 400 (grammar_manager.py L190-195), which
      a non-streaming /generate answers as HTTP 400
    the vocab mask: logits of tokens the grammar does not   ByteGrammar.disallowed(): those tokens join the
      allow are -inf before the sampler, after the          min_new_tokens `banned` set, so log q_τ, its top-k,
      penalizers (SamplingBatchInfo.apply_logits_bias), so  log p0 and the entropy (the plugin's logits are the
      every reported logprob is of the masked logits        sampler's) are all of the masked logits
    accept_token after each step; finished when the         ByteGrammar.accept; StopRules.finish_after(...,
      grammar terminated, after the stop-string, EOS and    grammar_terminated) ends the request with
      length checks (schedule_batch.py L2045-2047)          {"type": "stop", "matched": last id}
    accept_token refused: abort with status 500             HTTP 500 when no token is allowed (the grammar's end
                                                            while min_new_tokens masks EOS)
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from ..protocol import EngineError
from .byte_model import EOS_ID, VOCAB_SIZE, byte_tokenizer
from .routes import HTTPError, SchedulerAbort

GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")
"""SGLang's mutually exclusive constraint fields, in the order of its check."""


@lru_cache(maxsize=1)
def _grammar() -> Any:
    """The engine's grammar module, imported at the first constrained request: it imports torch, which the
    stand-in's workers otherwise never load (a second or two at each start)."""
    from ..engine import grammar

    return grammar


@lru_cache(maxsize=1)
def _compiler() -> Any:
    return _grammar().GrammarCompiler(byte_tokenizer(), VOCAB_SIZE, [EOS_ID])


class ByteGrammar:
    """One request's grammar over the byte vocabulary: the tokens it forbids next, accepting the drawn one."""

    def __init__(self, field: str, text: str) -> None:
        try:
            compiled = _compiler().compile(field, text)
        except EngineError as exc:
            raise SchedulerAbort(400, f"Failed to compile {field} grammar: {exc.__cause__ or exc}") from None
        self.field = field
        self._row = _grammar().RowGrammar(compiled, [EOS_ID], (field, text))

    def disallowed(self) -> frozenset[int]:
        """The tokens the grammar does not allow at this step (their logits become -inf)."""
        allowed = _grammar().allowed_tokens([self._row], VOCAB_SIZE)[0]
        return frozenset(int(t) for t in (~allowed).nonzero()[0])

    def accept(self, token: int) -> None:
        try:
            self._row.accept(token)
        except EngineError as exc:
            raise SchedulerAbort(500, f"Grammar accept_token failed: {exc}", "InternalServerError") from None

    def dead_end(self, position: int) -> None:
        """No token is allowed (the grammar allows only EOS, which min_new_tokens masks): HTTP 500."""
        raise SchedulerAbort(500, f"Grammar accept_token failed: no token is allowed at output position {position}",
                             "InternalServerError")

    @property
    def terminated(self) -> bool:
        return self._row.terminated


def request_grammar(sp: dict[str, Any]) -> ByteGrammar | None:
    """The grammar of a request's sampling_params (None without a constraint); HTTP 400 as SGLang refuses."""
    given = [f for f in GRAMMAR_FIELDS if sp.get(f) is not None]
    if len(given) > 1:
        raise HTTPError(400, "Only one of json_schema, regex, ebnf, or structural_tag can be set.")
    if not given:
        return None
    field = given[0]
    if field == "structural_tag":
        raise HTTPError(400, "the stand-in server does not implement structural_tag constraints")
    text = sp[field]
    if not isinstance(text, str):
        raise HTTPError(400, f"{field} must be a string, got {type(text).__name__}")
    return ByteGrammar(field, text)
