"""Counter-based random inputs per MH decision (PreSTO Proposition 1, assumption A2).

Every random input of a power sampler is a pure function of a key, never of a generator's history:

    (seed, prompt_key, block ℓ, transition j, purpose, slot)  ->  Philox(SeedSequence(key))

so the sequential sampler and its PreSTO variant, which evaluate decisions in different orders and
batches, draw the *same* inputs for the same decision.  Deferring a request needs no bookkeeping: its
inputs are recomputed from j.

    paper                                  code
    ℓ (block index, 1-based)               block
    j (transition index within the block)  transition
    c_j ~ Unif{0..T-1} (cut uniform)       DecisionStream.cut_uniform(j)
    G_{j,t} (EntropyCut Gumbel-max cut)    DecisionStream.cut_gumbels(j, T)
    suffix-sampling randomness of y        DecisionStream.suffix_seed(j, slot)   (engine `sampling_seed`)
    u_j ~ Unif(0,1] (acceptance)           DecisionStream.accept_log_uniform(j) = log u_j
    MTM selection uniform                  DecisionStream.select_uniform(j)
    MTM slot temperature index             DecisionStream.slot_choice(j, slot, n)
    block extension x_{L+1:T} ~ q_τ        DecisionStream.extend_seed()
    the same draws, each computed once     MemoStream(stream) (streaming PreSTO asks for one j many times)

The engine keys its per-token noise by (sampling_seed, absolute position), so a suffix depends only on its
prefix ids and its seed - never on what else is in the batch.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Sequence

import numpy as np

SEED_RANGE = 2**31 - 1
"""Suffix seeds are drawn in [0, 2^31 - 1): valid for SGLang's `sampling_seed` and every engine."""


class Purpose(IntEnum):
    """Which random input of a decision a stream produces (part of the key)."""

    CUT = 1
    SUFFIX_SEED = 2
    ACCEPT = 3
    EXTEND_SEED = 4
    SELECT = 5
    SLOT_TEMPERATURE = 6
    REFERENCE_SEED = 7
    REFERENCE_TEMPERATURE = 8
    CUT_GUMBEL = 9


def prompt_key(prompt_ids: Sequence[int]) -> int:
    """A stable 63-bit key of a prompt's token ids (sha256; independent of Python's hash seed)."""
    ids = [int(t) for t in prompt_ids]
    if not ids:
        raise ValueError("prompt_ids must be non-empty")
    if min(ids) < 0:
        raise ValueError("prompt_ids must be non-negative token ids")
    digest = hashlib.sha256(",".join(map(str, ids)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


PAPER_SEED = 10086
"""The run seed of PreSTO's Table 6: the default seed of every sampler, baseline, benchmark and `forerun eval`."""


def keyed_generator(*key: int) -> np.random.Generator:
    """A numpy Generator (Philox) that is a pure function of a tuple of non-negative ints."""
    if any(int(k) < 0 for k in key):
        raise ValueError(f"stream key entries must be non-negative, got {key}")
    return np.random.Generator(np.random.Philox(np.random.SeedSequence([int(k) for k in key])))


@dataclass(frozen=True)
class DecisionStream:
    """Random inputs of one block of one chain, keyed by (seed, prompt_key, block, transition)."""

    seed: int
    """Run seed (Table 6: `PAPER_SEED`)."""
    prompt_key: int
    """`prompt_key(prompt_ids)`: distinguishes prompts run with the same seed."""
    block: int
    """Block index ℓ (1-based)."""

    def __post_init__(self) -> None:
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.prompt_key < 0:
            raise ValueError(f"prompt_key must be >= 0, got {self.prompt_key}")
        if self.block < 1:
            raise ValueError(f"block must be >= 1, got {self.block}")

    def _gen(self, transition: int, purpose: Purpose, slot: int = 0) -> np.random.Generator:
        if transition < 0:
            raise ValueError(f"transition index must be >= 0, got {transition}")
        return keyed_generator(self.seed, self.prompt_key, self.block, transition, int(purpose), slot)

    def cut_uniform(self, transition: int) -> float:
        """U_j ~ Unif[0, 1): the uniform cut floor(U_j T) of PowerMH and MultiTryMH (EntropyCut draws from
        `cut_gumbels` instead)."""
        return float(self._gen(transition, Purpose.CUT).random())

    def cut_gumbels(self, transition: int, horizon: int) -> np.ndarray:
        """G_{j,0..T-1} i.i.d. standard Gumbel: a state-dependent cut law is drawn as argmax_t log ρ(t) + G_t."""
        if horizon < 1:
            raise ValueError(f"horizon T must be >= 1, got {horizon}")
        return self._gen(transition, Purpose.CUT_GUMBEL).gumbel(size=int(horizon))

    def suffix_seed(self, transition: int, slot: int = 0) -> int:
        """Sampling seed of the suffix proposal of transition j (slot: MTM candidate index)."""
        return int(self._gen(transition, Purpose.SUFFIX_SEED, slot).integers(0, SEED_RANGE))

    def reference_seed(self, transition: int, slot: int) -> int:
        """Sampling seed of MTM reference point `slot` of transition j."""
        return int(self._gen(transition, Purpose.REFERENCE_SEED, slot).integers(0, SEED_RANGE))

    def accept_log_uniform(self, transition: int) -> float:
        """log u_j with u_j ~ Unif(0, 1] (never -inf); accept iff log u_j < log A."""
        u = 1.0 - float(self._gen(transition, Purpose.ACCEPT).random())
        return math.log(u)

    def select_uniform(self, transition: int) -> float:
        """Uniform [0, 1) that selects the MTM candidate by inverse CDF of the normalized weights."""
        return float(self._gen(transition, Purpose.SELECT).random())

    def slot_choice(self, transition: int, slot: int, n: int, *, reference: bool = False) -> int:
        """Index in range(n) of the temperature of MTM candidate (or reference) `slot` of transition j."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        purpose = Purpose.REFERENCE_TEMPERATURE if reference else Purpose.SLOT_TEMPERATURE
        return int(self._gen(transition, purpose, slot).integers(0, n))

    def extend_seed(self) -> int:
        """Sampling seed of the block extension x_{L+1:T} ~ q_τ (one per block)."""
        return int(keyed_generator(self.seed, self.prompt_key, self.block, 0, int(Purpose.EXTEND_SEED), 0)
                   .integers(0, SEED_RANGE))


def uniform_cut(u: float, horizon: int) -> int:
    """c = floor(U T) ~ Unif{0, ..., T-1} (PowerMH cut law, §3.1) from U ~ Unif[0, 1)."""
    if horizon < 1:
        raise ValueError(f"horizon T must be >= 1, got {horizon}")
    if not (0.0 <= u < 1.0):
        raise ValueError(f"u must be in [0, 1), got {u}")
    return min(int(u * horizon), horizon - 1)


class MemoStream:
    """A `DecisionStream` whose draws are computed once (the tree asks for the same j many times); the draws of
    transitions no later decision reads are dropped by `forget_before`."""

    def __init__(self, stream: DecisionStream) -> None:
        self._stream = stream
        self._memo: dict[Any, dict[Any, Any]] = {}
        """transition (a draw's first argument; None for `extend_seed`) -> {(name, args, kwargs): the draw}."""

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._stream, name)
        if not callable(fn):
            return fn

        def call(*args: Any, **kwargs: Any) -> Any:
            key = (name, args, tuple(sorted(kwargs.items())))
            memo = self._memo.setdefault(args[0] if args else kwargs.get("transition"), {})
            if key not in memo:
                memo[key] = fn(*args, **kwargs)
            return memo[key]
        return call

    def forget_before(self, transition: int) -> None:
        """Drop the draws of transitions < `transition` (decided: their draws are never asked for again)."""
        for j in [j for j in self._memo if j is not None and j < transition]:
            del self._memo[j]

    @property
    def kept(self) -> int:
        """Draws held."""
        return sum(len(m) for m in self._memo.values())
