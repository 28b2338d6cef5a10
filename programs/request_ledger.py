"""What a chain's MH phase generated and what its walk used: wasted tokens and repeated requests.

Every variant generates suffix requests and realizes decisions from some of them.  The sequential sampler uses
every request it generates (each call serves the decision it was made for); a PreSTO variant also generates
requests of decisions the walk never reaches (the branch not taken, a level below a deferred node, a streamed
row aborted), and should never generate one request twice (`suffix_cache` serves a round's repeat; streaming
keeps a complete row).  The ledger counts both, per chain, with one definition for every traversal:

    generated tokens      Σ tokens of every generation (a request generated twice counts twice; a streamed row
                          aborted part-way counts the tokens it decoded)
    used tokens           Σ over the distinct requests some realized decision read of the tokens decoded of them:
                          their length T − c, fewer for a streamed proposal rejected early (the walk read its
                          tokens up to the rejection and the rest were never decoded)
    wasted tokens         generated − used;  wasted_token_fraction = wasted ÷ generated (0 when none generated)
    repeated requests     generations of a request (same prefix ids, length, τ, seed) that decode a position of it
                          an earlier generation in the chain already decoded
    resumed requests      generations that continue an aborted row of the request after the tokens it decoded
                          (streaming: the engine's noise is keyed by (seed, position), so the continuation decodes
                          exactly the tokens the uninterrupted row would have; none is decoded twice)

Block extensions are left out (identical in every variant and always used), as in the call metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from .suffixes import SuffixRequest


@dataclass
class RequestLedger:
    """Generated and used suffix requests of one chain's MH phase (module docstring)."""

    generated_tokens: int = 0
    """Tokens of every generation."""
    repeated_requests: int = 0
    """Generations of a request that decode again a position the chain had already decoded for it."""
    resumed_requests: int = 0
    """Generations that continue an aborted row of the request where it stopped."""
    _decoded: dict[SuffixRequest, int] = field(default_factory=dict, repr=False)
    """request -> how many of its tokens some generation has decoded."""
    _used: set[SuffixRequest] = field(default_factory=set, repr=False)

    def generated(self, request: SuffixRequest, tokens: int, start: int = 0) -> None:
        """The engine decoded `tokens` tokens of `request` from its token `start` on (a whole suffix from 0; an
        aborted row's part; the rest of it after `start` tokens an aborted row decoded)."""
        done = self._decoded.get(request)
        if done is not None and start < done and tokens > 0:
            self.repeated_requests += 1
        elif start > 0:
            self.resumed_requests += 1
        self._decoded[request] = max(done or 0, start + int(tokens))
        self.generated_tokens += int(tokens)

    def used(self, requests: Iterable[SuffixRequest]) -> None:
        """A realized MH decision read the suffixes of `requests`."""
        self._used.update(requests)

    @property
    def used_tokens(self) -> int:
        """Σ over the distinct used requests of the tokens the chain decoded of them (T − c, unless rejected early)."""
        return sum(min(r.max_tokens, self._decoded[r]) for r in self._used if r in self._decoded)

    @property
    def wasted_tokens(self) -> int:
        return self.generated_tokens - self.used_tokens

    @property
    def wasted_token_fraction(self) -> float:
        """Wasted ÷ generated tokens, in [0, 1]; 0 when nothing was generated."""
        return self.wasted_tokens / self.generated_tokens if self.generated_tokens else 0.0
