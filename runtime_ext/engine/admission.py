"""Admission under the KV budget: a request starts decoding only when its KV fits (SGLang-style queueing).

`EngineConfig.max_total_tokens` bounds ALL the KV the engine holds, in tokens: the radix tree's cached
prefixes plus every running row's own KV.  The transformers fallback copies a row's whole prompt into the row,
so the row is charged for all of it.  The native forward reads the cached prefix in place (`shares_prefix`): the
prefix is already counted in the tree and stays resident while the row runs (the row locks it at its prefill,
and the admission locks it until then, `hold_prefix`), so the row is charged only for the tokens it adds -
charging the prefix again refused a request next to a pin of its own prompt, or one whose prompt extends a
cached unlocked prefix, that fits.  A decoding request reserves the most KV its row will ever hold when it is
admitted and releases it when it leaves; KV the row hands to the tree and then reads in place (its prompt at
its prefill) is paid from that reservation, which shrinks to what the row still holds outside the tree plus what
it may still generate (`kv_handoff`: each token counted once).  The radix tree caches nothing else beyond what
the reservations leave free (`RadixCache.reserved`), so

    radix.total_tokens + Σ_running KV outside the tree  <=  radix.total_tokens + radix.reserved  <=  max_total_tokens.

    notion                                       code
    KV a decoding row holds at most              row_demand(r) = len(prompt) - 1 + max_new_tokens
    what it adds (prefix read in place)          row_demand(r) - depth of cached_prefix(radix, r)
    fits now (after evicting unlocked prefixes)  RadixCache.reserve(row_demand(r), protect=r's cached prefix)
    can never fit                                row_demand(r) > max_total_tokens -> EngineError at submission
    queue order                                  FIFO per priority class: a request that does not fit yet
                                                 holds back the decoding requests behind it
Requests that never decode (logits, pin, prompt scoring) reserve nothing: their prompt KV goes to the tree
only as far as the free budget allows (a pin that cannot be kept resident fails, as before).
A normal-priority decoding request that does not fit first asks `make_room` (the engine drops the pins
background work holds, see the scheduler) before it queues or fails.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from ..protocol import EngineError
from .radix_cache import RadixCache, RadixNode
from .requests import Request

MakeRoom = Callable[[int, RadixNode], None]
"""`make_room(tokens, protect)`: free what background work holds so that `tokens` could be reserved."""


def row_demand(r: Request) -> int:
    """KV tokens the row of decoding request r holds when it has generated max_new_tokens tokens."""
    return len(r.input_ids) - 1 + r.params.max_new_tokens


def reused_prompt(r: Request) -> Sequence[int]:
    """The part of r's prompt whose cached KV its prefill can reuse: prompt[:-1], up to the first prompt position
    whose logprobs it returns (that position and later ones are recomputed)."""
    reuse = len(r.input_ids) - 1 if r.input_logprob_start < 0 else min(len(r.input_ids) - 1, r.input_logprob_start)
    return r.input_ids[: max(reuse, 0)]


def cached_prefix(radix: RadixCache, r: Request) -> tuple[RadixNode, int]:
    """The deepest tree node caching a prefix of r's row KV that its prefill reuses (`reused_prompt`) and that
    prefix's length: what a row that reads its prefix in place adds nothing for, once the prefix cannot be
    evicted."""
    node = radix.deepest_cached(reused_prompt(r))
    depth, p = 0, node
    while p is not None:
        depth, p = depth + len(p.key), p.parent
    return node, depth


def hold_prefix(radix: RadixCache, r: Request, node: RadixNode) -> None:
    """Lock the cached prefix r's reservation did not count until r's prefill locks it for the row (then
    `prefill.compute_prompt_kv` calls `release_held_prefix`; so does `release` when r leaves earlier): another
    admission or prefill of the same pass cannot evict it meanwhile."""
    radix.lock(node)
    r.held_prefix = node


def release_held_prefix(radix: RadixCache, r: Request) -> None:
    """Drop the admission's lock on r's prefix (idempotent)."""
    if r.held_prefix is not None:
        radix.unlock(r.held_prefix)
        r.held_prefix = None


def check_fits_budget(r: Request, max_total_tokens: int) -> None:
    """EngineError when r's row could not fit even in an empty engine."""
    if r.decodes and row_demand(r) > max_total_tokens:
        raise EngineError(
            f"request {r.rid}: its KV needs {row_demand(r)} tokens (prompt {len(r.input_ids)} - 1 + max_new_tokens "
            f"{r.params.max_new_tokens}) and can never fit the engine's max_total_tokens {max_total_tokens}"
        )


def release(radix: RadixCache, r: Request) -> None:
    """Give back r's reservation and the admission's hold on its prefix (idempotent)."""
    if r.reserved:
        radix.release(r.reserved)
        r.reserved = 0
    release_held_prefix(radix, r)


def _admit_class(waiting: Iterable[Request], radix: RadixCache, free_rows: int,
                 take: list[Request], failed: list[tuple[Request, EngineError]],
                 make_room: MakeRoom | None = None, shares_prefix: bool = False) -> None:
    def prefix_of(r: Request) -> tuple[RadixNode, int]:
        return cached_prefix(radix, r) if shares_prefix else (radix.root, 0)

    blocked = False
    for r in waiting:
        if not r.decodes:
            take.append(r)
            continue
        if blocked or free_rows <= 0:
            blocked = True
            continue
        prefix, depth = prefix_of(r)
        demand = row_demand(r) - depth
        protect = radix.deepest_cached(reused_prompt(r))  # what its prefill will read, no more
        if make_room is not None and radix.free_tokens < demand:
            make_room(demand, protect)
        if radix.reserve(demand, protect=protect):
            r.reserved = demand
            if depth > 0:
                hold_prefix(radix, r, prefix)
            take.append(r)
            free_rows -= 1
        elif radix.reserved == 0:  # nothing running will give memory back: only pins hold the pool
            failed.append((r, EngineError(
                f"request {r.rid}: its KV needs {demand} tokens but only {radix.free_tokens} of max_total_tokens "
                f"{radix.max_total_tokens} can be freed (the rest is pinned)")))
        else:
            blocked = True


def take_admissible(waiting: Sequence[Request], radix: RadixCache, *, free_rows: int, free_background_rows: int,
                    normal_running: bool, make_room: MakeRoom | None = None, shares_prefix: bool = False,
                    ) -> tuple[list[Request], list[tuple[Request, EngineError]]]:
    """What starts now, and what fails: normal requests first (FIFO, each decoding one needs a free row and
    its KV reserved, after `make_room` when it does not fit); background requests (priority < 0) only when
    no normal request is queued or running (they never make room).  `shares_prefix`: rows read their cached
    prefix in place (the native forward), so the prefix is not charged again; it is held locked from here to
    the request's prefill (`release_held_prefix`)."""
    take: list[Request] = []
    failed: list[tuple[Request, EngineError]] = []
    normal = [r for r in waiting if r.priority >= 0]
    _admit_class(normal, radix, free_rows, take, failed, make_room, shares_prefix)
    if not normal and not normal_running:
        _admit_class([r for r in waiting if r.priority < 0], radix, free_background_rows, take, failed,
                     shares_prefix=shares_prefix)
    return take, failed
