"""Scale-out: independent chains (or eval items) run concurrently over several runtimes.

A `RuntimePool` holds runtimes, each with a number of slots (chains in flight on it at once):

    several SGLang servers                              one runtime per URL, `slots` chains each (default 1:
                                                        a chain keeps one server for its whole life, so that
                                                        server's radix cache serves its every call)
    the SGLang Model Gateway (smg) in front of N workers  one runtime, `slots` chains: each lease has a routing
                                                        key of its own, sent on every request of the chain, and
                                                        the gateway's sticky routing keeps the chain on one
                                                        worker (`scripts/launch_runtime --workers N --gateway`)
    the embedded engine                                 one runtime with `slots` chains: its continuous
                                                        batching runs their concurrent requests together

`pool.map(fn, items)` runs `fn(runtime, item)` for every item on a thread pool as wide as all slots; each
call leases a slot for its whole duration (the runtime with the most free slots, the first on a tie) and
results come back in item order.  No distribution of its own beyond that: a router or SGLang's own data
parallelism spreads requests inside one URL.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import uuid
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, Callable, Iterator, Sequence, TypeVar

from .runtime import Runtime, open_runtime

T = TypeVar("T")
R = TypeVar("R")


class RuntimePool:
    """Runtimes with per-runtime slots; a context manager that closes them all."""

    def __init__(self, runtimes: Sequence[Runtime], slots: int = 1) -> None:
        if not runtimes:
            raise ValueError("a RuntimePool needs at least one runtime")
        if slots < 1:
            raise ValueError(f"slots (chains in flight per runtime) must be >= 1, got {slots}")
        self.runtimes = list(runtimes)
        self.slots = int(slots)
        self._free = [self.slots] * len(self.runtimes)
        self._cond = threading.Condition()
        self.leases = [0] * len(self.runtimes)
        """Leases granted per runtime so far (how the work was spread)."""
        prefix = f"forerun-{uuid.uuid4().hex[:12]}"
        self._chain_keys = (f"{prefix}-{n}" for n in itertools.count())
        """One routing key per lease (chain): `<pool prefix>-<n>`."""

    @property
    def first(self) -> Runtime:
        return self.runtimes[0]

    @property
    def width(self) -> int:
        """Chains in flight at most: slots × runtimes."""
        return self.slots * len(self.runtimes)

    @property
    def determinism_notes(self) -> list[str]:
        return [n for n in (rt.determinism_note for rt in self.runtimes) if n]

    @contextlib.contextmanager
    def lease(self) -> Iterator[Runtime]:
        """A slot on the runtime with the most free slots (blocks while all are busy), as one chain uses it:
        with a routing key of its own (`Runtime.for_chain`), so a gateway keeps the chain on one worker."""
        with self._cond:
            while max(self._free) == 0:
                self._cond.wait()
            i = max(range(len(self._free)), key=lambda k: (self._free[k], -k))
            self._free[i] -= 1
            self.leases[i] += 1
            key = next(self._chain_keys)
        try:
            yield self.runtimes[i].for_chain(key)
        finally:
            with self._cond:
                self._free[i] += 1
                self._cond.notify()

    def map(self, fn: Callable[[Runtime, T], R], items: Sequence[T]) -> list[R]:
        """fn(runtime, item) for every item, at most `width` at once; results in item order.  The first
        exception is raised once the running calls have finished (items not started are not run)."""
        items = list(items)
        if not items:
            return []

        def run(item: T) -> R:
            with self.lease() as rt:
                return fn(rt, item)

        if self.width == 1 or len(items) == 1:
            return [run(it) for it in items]
        pool = ThreadPoolExecutor(max_workers=min(self.width, len(items)), thread_name_prefix="forerun-chain")
        try:
            futures = [pool.submit(run, it) for it in items]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            for f in done:
                if f.exception() is not None:
                    for g in futures:
                        g.cancel()
                    raise f.exception()  # type: ignore[misc]
            return [f.result() for f in futures]
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        for rt in self.runtimes:
            rt.close()

    def __enter__(self) -> "RuntimePool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def split_urls(values: Sequence[str] | str | None) -> list[str]:
    """--backend values: repeated and/or comma-separated URLs, in order, duplicates dropped; an empty item (a doubled
    or trailing comma, an unset variable in "http://a:1,$MORE") is a ValueError, as the CLI refuses it, never a
    server silently left out."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    urls = []
    for v in values:
        for i, u in enumerate(str(v).split(","), 1):
            if not u.strip():
                raise ValueError(f"backend URLs: item {i} of {str(v)!r} is empty")
            urls.append(u.strip())
    return list(dict.fromkeys(urls))


def open_pool(model: str = "default", dtype: str | None = None, *, backend_urls: Sequence[str] | str | None = None,
              tokenizer: Any = None, slots: int = 1, engine_config: Any = None,
              allow_nondeterministic: bool = False, request_timeout_s: float | None = None) -> RuntimePool:
    """One embedded engine with `slots` chains in flight, or one runtime per server URL with `slots` each
    (they must serve the same model: chains are comparable only then)."""
    urls = split_urls(backend_urls)
    if not urls:
        return RuntimePool([open_runtime(model, dtype, engine_config=engine_config)], slots)
    runtimes: list[Runtime] = []
    try:
        for url in urls:
            runtimes.append(open_runtime(backend_url=url, tokenizer=tokenizer if runtimes == [] else
                                         runtimes[0].tokenizer, allow_nondeterministic=allow_nondeterministic,
                                         request_timeout_s=request_timeout_s))
        names = {rt.name for rt in runtimes}
        if len(names) > 1:
            raise ValueError(f"--backend servers serve different models ({', '.join(sorted(names))}): "
                             "give URLs of servers of one model")
    except BaseException:
        for rt in runtimes:
            rt.close()
        raise
    return RuntimePool(runtimes, slots)
