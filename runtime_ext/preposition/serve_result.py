"""What serving one request returns (`ServeResult`: the path of Algorithm 2, the first token, its latency) and
what it counts on its session (`ServeReceipt`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..protocol import GenerateOutput
from .ready_cache import MatchKind, ReadyDistribution

ServePath = Literal["fast", "fast_relaxed", "fall", "cold"]


@dataclass(frozen=True)
class ServeResult:
    """One served request: which path it took (Algorithm 2), its first token and critical-path latency."""

    path: ServePath
    token_id: int
    text: str
    """The answer's text as a fresh request returns it (the engines skip special tokens: an EOS answer is '')."""
    latency_s: float
    """Wall time from arrival to the first token (the critical path)."""
    logit_gap: float | None
    """γ of the ready distribution the gate tested (exact or relaxed match); None when none was tested."""
    delta: int
    """Tokens of the realized entry beyond the pre-paid one (0 on the fast path; L_entry when cold)."""
    state: tuple[int, ...] = field(repr=False)
    """The session's tokens at the moment the request was checked (what a fresh forward pass would read)."""
    entry: tuple[int, ...] = field(repr=False)
    """The entry the served token conditions on (the realized entry, or the header for `fast_relaxed`)."""
    cached_tokens: int | None = None
    """Engine-reported prefix-cache hit of the fall-through request (SGLang `meta_info.cached_tokens`)."""
    output: GenerateOutput | None = field(default=None, repr=False)
    version: int = -1
    """The state version the request was checked against (a commit built on it passes `expect_version`)."""
    match: MatchKind = "none"
    reason: str = ""
    """Why this path: the gate's decision (γ vs τ, â vs A) or why no distribution applied."""
    receipt: "ServeReceipt | None" = field(default=None, repr=False, compare=False)
    """What this serve counts on its session (`Prepositioner.record`), applied once it has succeeded."""


@dataclass(frozen=True)
class ServeReceipt:
    """The bookkeeping of one serve: the distributions it read (hits) and its serve counter."""

    consumed: tuple[ReadyDistribution, ...]
    counter: str
