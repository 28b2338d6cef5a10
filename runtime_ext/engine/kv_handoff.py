"""KV that moves from a decoding row into the radix tree, paid for once.

The KV budget counts each token the engine holds once, whatever holds it: a tree node, a running row's own
KV, or a row's reservation for the tokens it has not generated yet (`admission`).  A row that reads its prefix
in place (the native forward, `share_prefix`) keeps no copy of what the tree holds for it, so when its KV goes
into the tree and the row reads the tree's copy from then on, that KV changes holder, not size: the tree's
tokens are paid from the row's reservation, and the reservation shrinks to what the row still holds outside
the tree plus what it may still generate.  The prompt a row's prefill computed moves so
(`prefill.compute_prompt_kv`).  Inserting it from free room instead charged the prompt twice (once in the
reservation, once in the tree) until the row finished: the engine admitted fewer rows than its budget holds, and
the tree took only part of a prompt once the reservations filled the budget.  So do the generated tokens a
streamed child shares from its running parent (`row_streams`): the parent then reads them from the tree
(`read_from_tree`) instead of keeping them in its buffer beside the tree's copy until it finished.

The transformers fallback copies its whole prefix into the row's buffer: there the tree's copy is a second one
and takes free room only (`hand_row_kv_to_tree` is not used).

    notion                                          code
    the most KV a decoding row r holds              admission.row_demand(r)
    what r holds in the tree (the path it locks)    r.node.depth
    r's reservation once KV moved                   row_demand(r) - r.node.depth  (>= what r holds outside)
                                                    hand_row_kv_to_tree, settle_reservation (nothing to move)
    a finished row's KV into the tree               cache_finished_row (its reservation already released)
    r's lock moves to a node                        move_lock
"""

from __future__ import annotations

from typing import Sequence

import torch

from .admission import row_demand
from .batch import RunningBatch
from .forward import TOKEN_AXIS, all_finite
from .radix_cache import RadixCache, RadixNode, path_kv
from .requests import Request


def hand_row_kv_to_tree(radix: RadixCache, r: Request, ids: Sequence[int], kv: torch.Tensor, *,
                        offset: int) -> tuple[RadixNode, int]:
    """Insert `ids` (KV of `ids[offset:]` given, `RadixCache.insert`) for decoding row r, which reads the tree's
    copy from now on and drops its own: the insertion is paid from r's reservation, which then becomes what r
    may still hold outside the tree, row_demand(r) - the tokens the returned node covers.  Returns (node,
    covered) as `insert` does; the caller moves r's lock to that node."""
    lent, r.reserved = r.reserved, 0
    radix.release(lent)  # room for the insertion, which never evicts: it takes at most what r held outside
    node, covered = radix.insert(ids, kv, offset=offset)
    keep = row_demand(r) - covered
    if not radix.reserve(keep):  # cannot happen: the tree took at most lent - keep of the lent tokens
        raise RuntimeError(f"embedded engine: row {r.rid} lost {keep} reserved KV tokens moving its KV to the tree")
    r.reserved = keep
    return node, covered


def settle_reservation(radix: RadixCache, r: Request, covered: int) -> None:
    """Decoding row r reads its first `covered` tokens from the tree, which already held them (its prefill found
    its whole prompt cached, e.g. computed by a request admitted beside it): its reservation shrinks to
    row_demand(r) - covered."""
    keep = row_demand(r) - covered
    if keep > r.reserved:
        raise RuntimeError(f"embedded engine: row {r.rid} would need {keep} KV tokens, {r.reserved} reserved")
    radix.release(r.reserved - keep)
    r.reserved = keep


def move_lock(radix: RadixCache, r: Request, node: RadixNode) -> None:
    """r's lock on the tree moves to `node`'s path (locked before the old path is unlocked: the nodes both paths
    share are never unlocked in between, so they cannot be evicted)."""
    radix.lock(node)
    radix.unlock(r.node)  # None: nothing held yet
    r.node = node


def read_from_tree(radix: RadixCache, r: Request, node: RadixNode) -> None:
    """Running row r reads the KV of `node`'s path in place from now on, as its prefix (its buffer columns keep only
    the tokens after it, the newest ones, where they are): its lock moves to `node`."""
    move_lock(radix, r, node)
    r.prefix, r.prefix_len = path_kv(node), node.depth


def cache_finished_row(radix: RadixCache, batch: RunningBatch, r: Request) -> None:
    """Insert a finished row's prompt + output KV (all fed tokens) into the radix tree, as far as free room allows
    (its reservation is released first); move its lock there."""
    seq = r.input_ids + tuple(r.output_ids[:-1])
    assert len(seq) == r.kv_len
    kv = batch.row_kv(r)  # tokens [prefix_len, kv_len): the row's own KV
    if not all_finite(kv[:, :, :, -len(r.output_ids):]):
        return
    try:
        node, _ = radix.insert(seq, kv, offset=r.prefix_len)
    except ValueError:  # part of the prefix is not in the tree (it did not fit): give all the KV
        node, _ = radix.insert(seq, torch.cat([*r.prefix, kv], dim=TOKEN_AXIS), offset=0)
    move_lock(radix, r, node)
    r.prefix = []
