"""Close what runs a worker thread before the interpreter exits, even if the program forgot to.

An `EmbeddedEngine` computes on a daemon worker thread, and a `Prepositioner` feeds it from another one.
A program that ends while that worker is inside a torch forward (a background pre-position still in
flight, say) lets the interpreter tear down torch's thread pool under it: the process aborts with
"terminate called without an active exception" (SIGABRT).  `close_at_exit(obj)` registers `obj` (weakly:
a closed, unreferenced object is still collected) and one `atexit` handler closes every registered object
that is still alive, newest first (a prepositioner before the engine it feeds), so every worker finishes
its current step and stops before the interpreter tears anything down.  Closing is idempotent, so an
explicit `close()` or `with` block is still the normal way and this is only the safety net.
"""

from __future__ import annotations

import atexit
import itertools
import threading
import weakref
from typing import Any

__all__ = ["ExitRegistry", "close_at_exit", "close_all"]


class ExitRegistry:
    """Objects to close at exit, weakly held, closed newest first."""

    def __init__(self) -> None:
        self._live: dict[int, "weakref.ref[Any]"] = {}
        self._keys = itertools.count()
        self._lock = threading.Lock()

    def add(self, obj: Any) -> Any:
        """Remember `obj` (it has `close()`; anything else is ignored); returns `obj`."""
        if not callable(getattr(obj, "close", None)):
            return obj
        key = next(self._keys)

        def forget(_ref: Any, key: int = key) -> None:
            with self._lock:
                self._live.pop(key, None)

        with self._lock:
            self._live[key] = weakref.ref(obj, forget)
        return obj

    def close_all(self) -> None:
        """Close every remembered object that is still alive, newest first (errors ignored: exit is near)."""
        with self._lock:
            refs = [ref for _, ref in sorted(self._live.items(), reverse=True)]
            self._live.clear()
        for ref in refs:
            obj = ref()
            if obj is None:
                continue
            try:
                obj.close()
            except Exception:  # noqa: BLE001 - best effort at exit
                pass


_AT_EXIT = ExitRegistry()
close_at_exit = _AT_EXIT.add
"""Close `obj` at interpreter exit if it is still alive then; returns `obj`."""
close_all = _AT_EXIT.close_all
atexit.register(close_all)
