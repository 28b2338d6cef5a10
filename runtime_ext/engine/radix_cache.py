"""Token-level radix prefix tree of KV segments (RadixAttention semantics) for the embedded engine.

Each node holds a run of token ids (its edge label) and the KV of exactly those tokens as one tensor whose
token axis is `token_axis` (the engine stores ``[layers, 2, kv_heads, tokens, head_dim]``, axis 3).  A
request reuses the longest cached prefix (`match_prefix`) and inserts what it computed (`insert`).
Nodes a running request or a session pin uses are locked (reference count on the node and all its
ancestors) and never evicted; unlocked leaves are evicted least-recently-used first when an insertion
would exceed `max_total_tokens` minus the tokens `reserved` for the running rows' own KV (the engine's
admission reserves them, see `admission`).  The tree is not thread-safe by itself: the engine mutates it from its
scheduler thread only (and `pin`/`unpin` go through that thread too).

    notion                                   code
    cached prefix length of a request        PrefixMatch.length  -> meta_info["cached_tokens"]
    prefix hit rate                          hit_tokens / queried_tokens (RadixCache.stats())
    KV pool use                              total_tokens (current) / peak_tokens
    KV reserved by running rows              reserved (counted against max_total_tokens too)
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch


@dataclass(eq=False)
class RadixNode:
    """One edge of the tree: `key` token ids and their KV (`kv`, token axis = tree's token_axis)."""

    key: tuple[int, ...]
    kv: torch.Tensor | None
    parent: "RadixNode | None"
    children: dict[int, "RadixNode"] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0
    depth: int = 0
    """Tokens on the path from the root to the end of `key` (a split leaves a node's depth as it was)."""


def path_kv(node: RadixNode) -> list[torch.Tensor]:
    """The KV tensors of the nodes from the root down to `node` (the tree's own, not copies), in token order."""
    kv: list[torch.Tensor] = []
    while node.parent is not None:
        assert node.kv is not None, "radix cache: a node on a live path has no KV (it was evicted)"
        kv.append(node.kv)
        node = node.parent
    return kv[::-1]


@dataclass(frozen=True)
class PrefixMatch:
    """Result of `match_prefix`: the deepest matched node, the matched length and the KV segments."""

    node: RadixNode
    length: int
    segments: tuple[torch.Tensor, ...]


class RadixCache:
    """Prefix tree of KV under a token budget (see module docstring)."""

    splits = 0
    """Node splits so far, in every cache of the process: the only change of the tree that moves the tensors a
    live path holds (`RunningBatch.track_tree` re-reads the rows' paths only after one)."""

    def __init__(self, max_total_tokens: int, *, token_axis: int = 3) -> None:
        if max_total_tokens <= 0:
            raise ValueError(f"max_total_tokens must be > 0, got {max_total_tokens}")
        self.max_total_tokens = int(max_total_tokens)
        self.token_axis = token_axis
        self._clock = itertools.count(1)
        self.root = RadixNode(key=(), kv=None, parent=None)
        self.root.lock_ref = 1  # never evicted
        self.total_tokens = 0
        self.reserved = 0
        self.peak_tokens = 0
        self.hit_tokens = 0
        self.queried_tokens = 0
        self.evicted_tokens = 0
        self.inserted_tokens = 0
        self.skipped_tokens = 0

    # ----------------------------------------------------------------------------------- basics
    def _touch(self, node: RadixNode) -> None:
        t = next(self._clock)
        while node is not None:
            node.last_access = t
            node = node.parent

    def _split(self, node: RadixNode, at: int) -> RadixNode:
        """Split `node` so that its first `at` tokens form a new parent node; return that parent."""
        assert 0 < at < len(node.key)
        parent = node.parent
        assert parent is not None and node.kv is not None
        head = RadixNode(
            key=node.key[:at],
            kv=node.kv.narrow(self.token_axis, 0, at).clone(),
            parent=parent,
            lock_ref=node.lock_ref,
            last_access=node.last_access,
            depth=parent.depth + at,
        )
        node.kv = node.kv.narrow(self.token_axis, at, len(node.key) - at).clone()
        RadixCache.splits += 1
        node.key = node.key[at:]
        node.parent = head
        head.children[node.key[0]] = node
        parent.children[head.key[0]] = head
        return head

    # ----------------------------------------------------------------------------------- lookup
    def match_prefix(self, ids: Sequence[int], *, max_len: int | None = None) -> PrefixMatch:
        """Longest cached prefix of `ids[:max_len]` (a partially matched node is split at the match); the
        query counts in the hit-rate statistics (hit tokens / queried tokens)."""
        ids = tuple(int(i) for i in ids)
        limit = len(ids) if max_len is None else max(0, min(int(max_len), len(ids)))
        node = self.root
        pos = 0
        segments: list[torch.Tensor] = []
        while pos < limit:
            child = node.children.get(ids[pos])
            if child is None:
                break
            n = 0
            key = child.key
            while n < len(key) and pos + n < limit and key[n] == ids[pos + n]:
                n += 1
            if n < len(key):
                child = self._split(child, n)
            assert child.kv is not None
            segments.append(child.kv)
            node = child
            pos += n
            if n < len(key):
                break
        self.hit_tokens += pos
        self.queried_tokens += limit
        self._touch(node)
        return PrefixMatch(node=node, length=pos, segments=tuple(segments))

    def deepest_cached(self, ids: Sequence[int]) -> RadixNode:
        """The deepest node fully matched by a prefix of `ids` (no split, no statistics, no LRU touch)."""
        node, pos = self.root, 0
        while pos < len(ids):
            child = node.children.get(int(ids[pos]))
            if child is None or tuple(int(i) for i in ids[pos : pos + len(child.key)]) != child.key:
                break
            node, pos = child, pos + len(child.key)
        return node

    # ----------------------------------------------------------------------------------- locks
    def lock(self, node: RadixNode) -> None:
        while node is not None:
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        while node is not None:
            if node.lock_ref <= 0:
                raise RuntimeError("radix cache: unlock of a node that is not locked")
            node.lock_ref -= 1
            node = node.parent

    # ----------------------------------------------------------------------------------- insert
    def insert(self, ids: Sequence[int], kv: torch.Tensor, *, offset: int = 0) -> tuple[RadixNode, int]:
        """Insert `ids` whose KV for `ids[offset:]` is `kv` (token axis = token_axis).

        Tokens already cached are kept (their KV is not replaced); new tokens get clones of slices of
        `kv`.  Returns the deepest node covering the inserted prefix and how many tokens it covers (less
        than len(ids) when the budget could not be freed because the rest of the tree is locked).
        """
        ids = tuple(int(i) for i in ids)
        if kv.shape[self.token_axis] != len(ids) - offset:
            raise ValueError(
                f"radix insert: kv has {kv.shape[self.token_axis]} tokens, expected {len(ids) - offset}"
            )
        node = self.root
        pos = 0
        while pos < len(ids):
            child = node.children.get(ids[pos])
            if child is None:
                break
            n = 0
            key = child.key
            while n < len(key) and pos + n < len(ids) and key[n] == ids[pos + n]:
                n += 1
            if n < len(key):
                child = self._split(child, n)
            node = child
            pos += n
        if pos < len(ids):
            if pos < offset:
                raise ValueError(f"radix insert: tokens [{pos}, {offset}) are neither cached nor given")
            want = len(ids) - pos
            room = self._make_room(want, protect=node)
            take = min(want, room)
            if take < want:
                self.skipped_tokens += want - take
            if take > 0:
                seg = kv.narrow(self.token_axis, pos - offset, take).clone()
                leaf = RadixNode(key=ids[pos : pos + take], kv=seg, parent=node, depth=node.depth + take)
                node.children[ids[pos]] = leaf
                self.total_tokens += take
                self.inserted_tokens += take
                self.peak_tokens = max(self.peak_tokens, self.total_tokens)
                node = leaf
                pos += take
        self._touch(node)
        return node, pos

    # ----------------------------------------------------------------------------------- eviction
    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def evictable_tokens(self, protect: RadixNode | None = None) -> int:
        """Tokens of unlocked nodes (what `evict` could free), except those on `protect`'s path."""
        spared, p = 0, protect
        while p is not None:
            if p.lock_ref == 0:
                spared += len(p.key)
            p = p.parent
        return sum(len(n.key) for n in self._nodes() if n.lock_ref == 0) - spared

    @property
    def free_tokens(self) -> int:
        """Tokens of the budget neither cached nor reserved."""
        return self.max_total_tokens - self.total_tokens - self.reserved

    def _make_room(self, want: int, protect: RadixNode | None = None) -> int:
        """Evict LRU unlocked leaves until `want` tokens fit; return how many fit."""
        if self.free_tokens >= want:
            return want
        self.evict(want - self.free_tokens, protect=protect)
        return max(0, min(want, self.free_tokens))

    def reserve(self, want: int, protect: RadixNode | None = None) -> bool:
        """Reserve `want` tokens of the budget (evicting unlocked LRU leaves off `protect`'s path as needed);
        False, reserving nothing, when they do not fit."""
        if self._make_room(want, protect=protect) < want:
            return False
        self.reserved += want
        return True

    def release(self, tokens: int) -> None:
        if not 0 <= tokens <= self.reserved:
            raise RuntimeError(f"radix cache: release of {tokens} tokens with {self.reserved} reserved")
        self.reserved -= tokens

    def evict(self, num_tokens: int, protect: RadixNode | None = None) -> int:
        """Evict at least `num_tokens` tokens of unlocked leaves (LRU first), sparing `protect`'s path."""
        protected: set[int] = set()
        p = protect
        while p is not None:
            protected.add(id(p))
            p = p.parent
        freed = 0
        while freed < num_tokens:
            leaves = [n for n in self._nodes() if not n.children and n.lock_ref == 0 and id(n) not in protected]
            if not leaves:
                break
            leaves.sort(key=lambda n: n.last_access)
            for leaf in leaves:
                if freed >= num_tokens:
                    break
                freed += self._remove_leaf(leaf)
        return freed

    def _remove_leaf(self, leaf: RadixNode) -> int:
        assert leaf.parent is not None and not leaf.children and leaf.lock_ref == 0
        del leaf.parent.children[leaf.key[0]]
        n = len(leaf.key)
        leaf.kv = None
        self.total_tokens -= n
        self.evicted_tokens += n
        return n

    # ----------------------------------------------------------------------------------- stats
    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    def stats(self) -> dict[str, Any]:
        return {
            "max_total_tokens": self.max_total_tokens,
            "total_tokens": self.total_tokens,
            "reserved_tokens": self.reserved,
            "peak_tokens": self.peak_tokens,
            "hit_tokens": self.hit_tokens,
            "queried_tokens": self.queried_tokens,
            "hit_rate": self.hit_rate,
            "evicted_tokens": self.evicted_tokens,
            "inserted_tokens": self.inserted_tokens,
            "skipped_tokens": self.skipped_tokens,
            "locked_tokens": sum(len(n.key) for n in self._nodes() if n.lock_ref > 0),
            "num_nodes": sum(1 for _ in self._nodes()),
        }
