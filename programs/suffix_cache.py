"""Generated suffixes reused across the prefetch rounds of one chain (no work done twice).

A round's depths beyond where its walk stopped were generated from the old root's prefix; when the next
round's root shares that prefix (rejections, or acceptances with a later cut), the same transition asks for
the same request again: same prefix ids, length, temperature and seed.  Measured before this cache: 14-15 %
of a chain's distinct requests (19-22 % of its generated tokens) repeated a request of an earlier round.
By the engine contract a suffix is a pure function of its request (noise keyed by seed and absolute
position), so serving the stored one leaves the chain unchanged.

Memory stays bounded: an entry is kept only while its transition is still ahead (`prune(k)` drops every
entry of a transition < k, i.e. already realized; the samplers use one cache per block), and at most
`capacity` entries, least recently used first out.

    notion                                  code
    request (x_{0:c}, T − c, τ, seed)       SuffixRequest (the key)
    transition j the request serves         the entry's transition (for pruning)
"""

from __future__ import annotations

from collections import OrderedDict

from .suffixes import Suffix, SuffixRequest

DEFAULT_CAPACITY = 512
"""Default bound on stored suffixes (each holds at most T tokens with their per-token arrays)."""


class SuffixCache:
    """Suffixes by request, for one chain's block; LRU-bounded and pruned by transition."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[SuffixRequest, tuple[Suffix, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, request: SuffixRequest) -> bool:
        return request in self._entries

    def get(self, request: SuffixRequest) -> Suffix | None:
        entry = self._entries.get(request)
        if entry is None:
            return None
        self._entries.move_to_end(request)
        return entry[0]

    def put(self, request: SuffixRequest, suffix: Suffix, transition: int) -> None:
        """Store the suffix generated for `request`, which serves transition `transition`."""
        self._entries[request] = (suffix, int(transition))
        self._entries.move_to_end(request)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def prune(self, transition: int) -> None:
        """Drop the entries of transitions before `transition` (already realized: never asked again)."""
        for key in [k for k, (_, j) in self._entries.items() if j < transition]:
            del self._entries[key]
