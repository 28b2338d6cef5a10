"""The KV an embedded engine holds, read from its tensors (not its counters): the oracle of its KV budget.

A KV segment is [layers, 2, kv_heads, tokens, head_dim]; a tensor's tokens are those of its whole storage, and a
storage several holders share (a tree node a running row reads in place) counts once.  A running row holds its
prefix segments the tree does not hold and its own buffer columns: its fed tokens (the prompt but its last token,
every output but the last) less the tokens of its segments."""

from __future__ import annotations

from typing import Any

import torch


def tokens_of(t: torch.Tensor) -> int:
    """Tokens of KV behind t's whole storage."""
    return t.untyped_storage().nbytes() // (t[:, :, :, :1].numel() * t.element_size())


def tree_storages(eng: Any) -> dict[int, int]:
    """{storage address: tokens} of every radix-tree node's KV."""
    held, stack = {}, list(eng.radix.root.children.values())
    while stack:
        node = stack.pop()
        held[node.kv.untyped_storage().data_ptr()] = tokens_of(node.kv)
        stack.extend(node.children.values())
    return held


def running_rows(eng: Any) -> list[Any]:
    return [r for b in (eng._normal, eng._background) for r in b.rows]


def fed_tokens(r: Any) -> int:
    """Tokens whose KV running row r has computed or read: its prompt but the last, every output but the last."""
    return len(r.input_ids) - 1 + len(r.output_ids)


def held_outside_tree(r: Any, tree: dict[int, int]) -> int:
    """Tokens of KV running row r holds that the tree (`tree_storages`) does not: segments of other storages and its
    own columns."""
    other = {t.untyped_storage().data_ptr(): tokens_of(t) for t in r.prefix
             if t.untyped_storage().data_ptr() not in tree}
    return sum(other.values()) + fed_tokens(r) - sum(int(t.shape[3]) for t in r.prefix)


def held_tokens(eng: Any) -> int:
    """Tokens of KV alive in the tree and the running rows, each storage once."""
    tree = tree_storages(eng)
    return sum(tree.values()) + sum(held_outside_tree(r, tree) for r in running_rows(eng))
