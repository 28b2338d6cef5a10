"""What a token-exact backend remembers of the text it generated, so that a later prompt extending it is sent as the
exact ids the engine produced, not re-tokenized (`token_exact.TokenExactBackend.request_of`).

Three stores, looked up for the longest remembered text a prompt begins with:

* a shared LRU of `memory_size` entries (full program text after a generation -> its ids), for any program;
* per program stream (SGLang's `StreamExecutor`), its own latest generation, never evicted while the stream lives:
  a program's next gen extends its own ids however many other programs' generations (other threads, a sampler's
  thousands of requests) pushed it out of the LRU; it wins a tie (another program may have generated the same text
  as other ids), and so do the run's streams below over the LRU;
* the latest generations of the other streams of the same program run: a fork child (`ProgramState.fork`) is a new
  stream whose text begins with its parent's, so its first gen extends the parent's ids even after the LRU evicted
  them.  SGLang's interpreter gives every stream of one run the same `arguments` dict (`StreamExecutor.fork`
  passes `self.arguments` to the children, interpreter.py L381-390): that object is the run's identity here.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Sequence

Ids = tuple[int, ...]


class GenerationMemory:
    """Remembered generations: `remember(text, ids, stream)`, `longest(text, stream) -> (text, ids)`; thread-safe."""

    def __init__(self, memory_size: int = 4096) -> None:
        self.memory_size = memory_size
        self._lru: "OrderedDict[str, Ids]" = OrderedDict()
        self._lock = threading.Lock()
        self._by_stream: "weakref.WeakKeyDictionary[Any, tuple[str, Ids]]" = weakref.WeakKeyDictionary()
        """Per program stream, its latest remembered generation (text, ids): not evicted."""
        self._runs: "dict[int, weakref.WeakSet[Any]]" = {}
        """id of a program run's `arguments` dict -> its live streams that generated (a dead run's set empties; an id
        reused by a later dict then only gains that run's streams)."""
        self._purge_above = 64

    @staticmethod
    def _run_key(stream: Any) -> int | None:
        arguments = getattr(stream, "arguments", None)
        return id(arguments) if arguments is not None else None

    def remember(self, text: str, ids: Sequence[int], stream: Any = None) -> None:
        with self._lock:
            if stream is not None:
                self._by_stream[stream] = (text, tuple(ids))
                run = self._run_key(stream)
                if run is not None:
                    self._runs.setdefault(run, weakref.WeakSet()).add(stream)
                    if len(self._runs) > self._purge_above:  # drop ended runs, amortised O(1) per call
                        for key in [k for k, streams in self._runs.items() if not streams]:
                            del self._runs[key]
                        self._purge_above = max(64, 2 * len(self._runs))
            self._lru[text] = tuple(ids)
            self._lru.move_to_end(text)
            while len(self._lru) > self.memory_size:
                self._lru.popitem(last=False)

    def longest(self, text: str, stream: Any = None) -> tuple[str, Ids]:
        """The longest remembered text that `text` begins with, and its ids ("" and () if none)."""
        best = ""
        ids: Ids = ()
        with self._lock:
            own = self._by_stream.get(stream) if stream is not None else None
            if own is not None and text.startswith(own[0]):
                best, ids = own
            run = self._run_key(stream) if stream is not None else None
            for other in list(self._runs.get(run, ())) if run is not None else ():
                key, val = self._by_stream.get(other, ("", ()))
                if len(key) > len(best) and text.startswith(key):
                    best, ids = key, val
            for key, val in self._lru.items():
                if len(key) > len(best) and text.startswith(key):
                    best, ids = key, val
            if best in self._lru:
                self._lru.move_to_end(best)
        return best, ids
