"""What serving one request returns (`ServeResult`: the path of Algorithm 2, the first token, its latency), what it
counts on its session (`ServeReceipt`), and how a request that misses the fast path gets its path and Δ (Eq. 5)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..protocol import GenerateOutput
from .ready_cache import Lookup, MatchKind, ReadyDistribution

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


def as_restored(delta: int, reason: str, state_len: int, entry_len: int, cached: int, *, fell_through: bool = True
                ) -> tuple[int, str]:
    """(Δ, reason) as the engine's reported cache hit shows them: an engine under memory pressure may have
    dropped a pre-position's pin and evicted its KV, and then fewer tokens than planned are restored (one less
    is normal: the last token is recomputed for its logits).  Δ becomes the entry's tokens prefilled again.
    A fall-through whose engine restored MORE of the entry than was planned (an entry that is a strict prefix of a
    pre-positioned one, or shares its first tokens, matches none of them, yet the pinned KV holds those) reports the
    tokens the engine prefilled: Δ counted the whole entry.  A cold request (`fell_through` False) keeps its Δ: it is the baseline's by definition."""
    prepaid = entry_len - delta
    resident = cached - state_len
    if fell_through and resident > prepaid and prepaid < entry_len - 1:
        actual = entry_len - min(resident, entry_len)
        return actual, f"{reason}; the engine held {entry_len - actual} of its tokens already (Δ = {actual})"
    if resident >= prepaid - 1:
        return delta, reason
    actual = entry_len - max(0, resident)
    return actual, (f"{reason}; but the engine had dropped the pre-paid KV: {cached} of {state_len + prepaid} "
                    f"tokens restored (Δ = {actual})")


def fall_path(look: Lookup, realized: tuple[int, ...], gate_reason: str) -> tuple[ServePath, int, str, ServeReceipt]:
    """(path, Δ, reason, receipt) of a request that does not take the fast path (Eq. 5 / Eq. 2)."""
    if look.match == "exact":
        assert look.ready is not None
        return ("fall", 0, gate_reason + "; the pre-paid entry is restored (Δ = 0)",
                ServeReceipt((look.ready,), "fell_through"))
    if look.match == "relaxed":
        why = "relaxed match of the generic header, " + gate_reason
        if look.prepaid is not None:
            return ("fall", len(realized) - look.prepaid.entry_len, why,
                    ServeReceipt((look.prepaid,), "fell_through"))
        return "fall", len(realized), why + "; nothing of this entry is pre-paid", ServeReceipt((), "fell_through")
    if look.match == "prefix":
        assert look.ready is not None
        delta = len(realized) - look.ready.entry_len
        return ("fall", delta, f"the entry extends a pre-positioned one: resumes after it (Δ = {delta})",
                ServeReceipt((look.ready,), "fell_through"))
    if look.held:
        return ("fall", len(realized), "the entry matches no pre-positioned entry (no relaxed match allowed here)",
                ServeReceipt((), "fell_through"))
    return ("cold", len(realized), "no valid pre-position (none yet, invalidated by an update, or skipped)",
            ServeReceipt((), "cold"))
