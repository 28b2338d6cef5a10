"""One eval item from generation to record: `ItemRunner.generate` (pool threads) and `.finish` (main thread:
decode, grade, assemble the JSONL record)."""

from __future__ import annotations

import os
import time
from typing import Any

from ...programs.prompts import chat_prompt_ids
from ..graders import grade
from .methods import EvalSettings, MethodRunner
from .runs import WorkItem
from ..graders.sandbox import isolation_report
from ...runtime_ext.protocol import EngineError


class ItemRunner:
    """Generates items on a `RuntimePool` (each item leases one runtime slot: a server's radix cache serves the
    whole item) and turns their outcomes into records."""

    def __init__(self, pool: Any, settings: EvalSettings, classifier: Any = None, *, flush: bool = False,
                 command: str = "") -> None:
        self.pool = pool
        self.runtimes = pool.runtimes
        self.runners = [MethodRunner(rt.backend, settings, classifier) for rt in self.runtimes]
        self.settings = settings
        self.flush = flush
        self.command = command
        self.prompt_ids: dict[tuple[str, str], list[int]] = {}

    def prepare(self, items: list[WorkItem]) -> None:
        """Encode every prompt once, in this thread (chat template of the first runtime's tokenizer)."""
        tok = self.runtimes[0].tokenizer
        for it in items:
            key = (it.dataset, it.prompt.id)
            if key not in self.prompt_ids:
                self.prompt_ids[key] = chat_prompt_ids(tok, it.prompt.messages())

    def generate(self, item: WorkItem) -> dict[str, Any]:
        """Run the item's method (in a pool thread); a failed generation becomes an error outcome."""
        with self.pool.lease() as rt:
            idx = self.runtimes.index(rt)
            if self.flush and rt.is_embedded:
                rt.flush()  # one chain at a time: no method reuses another's KV
            ids = self.prompt_ids[(item.dataset, item.prompt.id)]
            try:
                out = self.runners[idx].run(item.method, ids, f"{item.dataset}/{item.prompt.id}", item.seed)
            except (EngineError, ValueError) as e:
                out = {"error": " ".join(str(e).split()) or type(e).__name__}
        out["runtime_index"] = idx
        return out

    def finish(self, item: WorkItem, out: dict[str, Any]) -> dict[str, Any]:
        """The JSONL record of a generated item, graded here (main thread: math-verify needs its alarm)."""
        rt = self.runtimes[out.pop("runtime_index", 0)]
        rec: dict[str, Any] = {
            "key": item.key, "dataset": item.dataset, "method": item.method, "prompt_id": item.prompt.id,
            "prompt_index": item.prompt_index, "seed": item.seed, "category": item.prompt.category,
            "model": rt.name, "dtype": rt.dtype, "backend": rt.location,
            "settings": self.settings.for_method(item.method),
            "prompt_tokens": len(self.prompt_ids[(item.dataset, item.prompt.id)]),
        }
        if "error" in out:
            rec.update(error=out["error"], correct=False, grade=None)
        else:
            text = rt.tokenizer.decode(out["response_ids"], skip_special_tokens=True)
            start = time.perf_counter()
            g = grade(item.prompt, text)
            rec.update(out, response=text, grade=g.to_json(), correct=g.correct, grade_s=time.perf_counter() - start)
            if g.grader == "code":
                iso = isolation_report()
                rec["sandbox"] = {k: iso.get(k) for k in ("network", "filesystem", "pids", "user")}
        rec["load_avg"] = os.getloadavg()[0]
        rec["command"] = self.command
        return rec
