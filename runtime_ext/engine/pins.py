"""Pins of the embedded engine: KV held resident for a session until unpinned (`protocol` pins).

A pin is a PIN-mode request whose prompt KV stays locked in the radix cache under the pin's own lock.  A
background pin (priority < 0) is dropped, oldest first, when a normal-priority request needs its room; its
later `unpin` does nothing.  `EmbeddedEngine` mixes this in; every method runs its radix work on the engine
thread (`_command`)."""

from __future__ import annotations

from typing import Any, Sequence

from ..protocol import EngineError, SamplingParams
from .prefill import PromptKV
from .radix_cache import RadixNode
from .requests import Request, RequestMode


class PinsMixin:
    """pin / unpin / pinned_prefix, and the engine-thread halves: holding a finished PIN request, yielding
    background pins."""

    _pins: dict[int, Any]
    _yielding: dict[int, Any]
    _yielded: set[int]

    def pin(self, ids: Sequence[int], *, priority: int = 0) -> int:
        """Keep the KV of `ids` resident (computing it if needed) until `unpin(handle)`; returns the handle.

        priority < 0: a background pin (queued like background work) that the engine drops when a
        normal-priority request needs its room (module docstring)."""
        req = self._make_request(ids, SamplingParams(max_new_tokens=0), rid=None, priority=priority,
                                 mode=RequestMode.PIN)
        self._submit([req])
        return self._wait(req)

    def unpin(self, handle: int) -> None:
        def run() -> None:
            if int(handle) in self._yielded:  # a background pin the engine already dropped
                self._yielded.discard(int(handle))
                return
            node = self._pins.pop(int(handle), None)
            if node is None:
                raise EngineError(f"unpin: unknown pin handle {handle}")
            self._yielding.pop(int(handle), None)
            self.radix.unlock(node)

        self._command(run)

    def pinned_prefix(self, ids: Sequence[int]) -> int:
        """How many leading tokens of `ids` are held resident by pins (what pinning `ids` would not add)."""
        ids = tuple(int(i) for i in ids)

        def run() -> int:
            pinned: set[int] = set()
            for node in self._pins.values():
                while node is not None and id(node) not in pinned:
                    pinned.add(id(node))
                    node = node.parent
            node, pos = self.radix.root, 0
            while pos < len(ids):
                child = node.children.get(ids[pos])
                if child is None or id(child) not in pinned:
                    break
                n = 0
                while n < len(child.key) and pos + n < len(ids) and child.key[n] == ids[pos + n]:
                    n += 1
                pos += n
                if n < len(child.key):
                    break
                node = child
            return pos

        return self._command(run)

    def _yield_pins(self, want: int, protect: RadixNode) -> None:
        """Drop background pins, oldest first, until `want` tokens could be freed (free + evictable, sparing
        `protect`'s path) for a normal-priority request, or none is left."""
        while self._yielding and self.radix.free_tokens + self.radix.evictable_tokens(protect) < want:
            handle, node = next(iter(self._yielding.items()))
            del self._yielding[handle]
            del self._pins[handle]
            self._yielded.add(handle)
            self.radix.unlock(node)
            self._counters["pins_yielded"] += 1

    def _hold_pin(self, r: Request, kv: PromptKV) -> None:
        """PIN: the whole prompt stays resident under the pin's own lock until unpin."""
        n = len(r.input_ids)
        if kv.covered < n:
            raise EngineError(f"pin: could not keep {n} tokens resident within max_total_tokens "
                              f"{self.config.max_total_tokens} (the rest of the pool is locked)")
        handle = next(self._pin_ids)
        self.radix.lock(r.node)  # the pin's own lock, kept until unpin
        self._pins[handle] = r.node
        if r.priority < 0:
            self._yielding[handle] = r.node
        self._release(r)
        r.result = handle
        r.done.set()
