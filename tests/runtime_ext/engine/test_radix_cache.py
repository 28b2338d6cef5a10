"""Radix KV cache: prefix reuse, splits, hit statistics, LRU eviction, locks (brute-force oracle)."""

from __future__ import annotations

import random

import pytest
import torch

from forerun.runtime_ext.engine.radix_cache import RadixCache


def kv_of(ids, start=0):
    """Fake KV [layers=1, 2, heads=1, tokens, dim=1] whose values encode (position, token)."""
    vals = torch.tensor([1000.0 * (start + i) + t for i, t in enumerate(ids)], dtype=torch.float64)
    return torch.stack([vals, -vals]).reshape(1, 2, 1, len(ids), 1)


def cat(segments):
    return torch.cat(list(segments), dim=3) if segments else torch.empty(1, 2, 1, 0, 1, dtype=torch.float64)


def test_insert_match_and_split():
    c = RadixCache(100)
    a = [1, 2, 3, 4, 5]
    c.insert(a, kv_of(a))
    m = c.match_prefix([1, 2, 3, 9])
    assert m.length == 3
    assert torch.equal(cat(m.segments), kv_of([1, 2, 3]))
    b = [1, 2, 3, 7, 8]
    node, covered = c.insert(b, kv_of(b[3:], start=3), offset=3)
    assert covered == 5 and c.total_tokens == 7
    for seq in (a, b):
        m = c.match_prefix(seq)
        assert m.length == 5 and torch.equal(cat(m.segments), kv_of(seq))
    assert c.match_prefix([9]).length == 0
    assert c.match_prefix(a, max_len=2).length == 2


def test_insert_requires_kv_for_uncached_tokens():
    c = RadixCache(100)
    with pytest.raises(ValueError, match="neither cached nor given"):
        c.insert([1, 2, 3], kv_of([3], start=2), offset=2)
    with pytest.raises(ValueError, match="kv has"):
        c.insert([1, 2, 3], kv_of([1, 2]))


def test_hit_rate_counts_queried_prefix_tokens():
    c = RadixCache(100)
    c.insert([1, 2, 3, 4], kv_of([1, 2, 3, 4]))
    c.match_prefix([1, 2, 3, 4])  # 4 of 4
    c.match_prefix([1, 2, 9, 9])  # 2 of 4
    assert c.hit_tokens == 6 and c.queried_tokens == 8
    assert c.stats()["hit_rate"] == pytest.approx(0.75)


def test_lru_eviction_under_budget():
    c = RadixCache(10)
    c.insert([1, 2, 3, 4], kv_of([1, 2, 3, 4]))
    c.insert([5, 6, 7, 8], kv_of([5, 6, 7, 8]))
    c.match_prefix([1, 2, 3, 4])  # touch the first: the second is now least recently used
    c.insert([9, 10, 11, 12], kv_of([9, 10, 11, 12]))
    assert c.total_tokens <= 10 and c.peak_tokens <= 10
    assert c.match_prefix([1, 2, 3, 4]).length == 4
    assert c.match_prefix([5, 6, 7, 8]).length == 0
    assert c.match_prefix([9, 10, 11, 12]).length == 4


def test_locked_nodes_are_never_evicted():
    c = RadixCache(8)
    node, _ = c.insert([1, 2, 3, 4], kv_of([1, 2, 3, 4]))
    c.lock(node)
    c.insert([5, 6, 7, 8], kv_of([5, 6, 7, 8]))
    # budget full; a new insert may only evict the unlocked [5..8]
    _, covered = c.insert([9, 10, 11, 12, 13, 14], kv_of([9, 10, 11, 12, 13, 14]))
    assert c.match_prefix([1, 2, 3, 4]).length == 4
    assert covered == 4 and c.skipped_tokens == 2  # only 4 tokens could be freed
    c.evict(100)
    assert c.match_prefix([1, 2, 3, 4]).length == 4
    c.unlock(node)
    c.evict(100)
    assert c.total_tokens == 0
    with pytest.raises(RuntimeError):
        c.unlock(node)


def test_split_keeps_locks_consistent():
    c = RadixCache(100)
    node, _ = c.insert([1, 2, 3, 4], kv_of([1, 2, 3, 4]))
    c.lock(node)
    c.match_prefix([1, 2, 9])  # splits the locked node
    c.evict(100)
    assert c.match_prefix([1, 2, 3, 4]).length == 4
    c.unlock(node)
    assert c.stats()["locked_tokens"] == 0


def test_random_workload_matches_brute_force():
    rng = random.Random(0)
    c = RadixCache(60)
    stored: dict[tuple[int, ...], None] = {}
    for _ in range(300):
        seq = tuple(rng.randrange(4) for _ in range(rng.randrange(1, 12)))
        m = c.match_prefix(seq)
        # the KV returned is exactly the KV of the matched prefix
        assert torch.equal(cat(m.segments), kv_of(seq[: m.length]))
        # brute force: the match is at most the longest common prefix with anything inserted
        best = max((next((i for i, (a, b) in enumerate(zip(s, seq)) if a != b), min(len(s), len(seq)))
                    for s in stored), default=0)
        assert m.length <= best
        c.insert(seq, kv_of(seq[m.length:], start=m.length), offset=m.length)
        stored[seq] = None
        assert c.total_tokens <= 60
        assert c.total_tokens == sum(len(n.key) for n in c._nodes())
        for n in c._nodes():  # each node's kept depth is the tokens on its path, counted here
            walk, up = 0, n
            while up is not None:
                walk, up = walk + len(up.key), up.parent
            assert n.depth == walk
