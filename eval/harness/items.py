"""One eval item from generation to record: `ItemRunner.generate` (pool threads) and `.finish` (main thread:
decode, grade, assemble the JSONL record)."""

from __future__ import annotations

import os
import time
from typing import Any

from ...programs.prompts import chat_prompt_ids
from ..datasets.prompt import Prompt, ids_fingerprint
from ..graders import grade
from . import forced as forced_pass
from .eos import cut_at_eos
from .methods import EvalSettings, MethodRunner
from .runs import WorkItem
from ..graders.sandbox import isolation_report
from ...runtime_ext.protocol import EngineError


def prompt_input_ids(tokenizer: Any, prompt: Prompt, settings: EvalSettings) -> list[int]:
    """The token ids a prompt is given to the model as: its chat (`--system`) through the tokenizer's chat template
    (or as plain text, --no-chat-template), with the template's thinking switch as the settings say."""
    return chat_prompt_ids(tokenizer, prompt.messages(settings.system), use_template=settings.chat_template,
                           thinking=settings.thinking)


class ItemRunner:
    """Generates items on a `RuntimePool` (each item leases one runtime slot: a server's radix cache serves the
    whole item) and turns their outcomes into records.  A generation that raises `EngineError` (a server that
    failed or timed out, a busy engine) is tried again up to `retries` times, `backoff_s` doubling between
    tries; what still fails becomes an error outcome (a wrong answer in the report, retried by --resume).  A
    ValueError (bad settings for the item) is not retried."""

    def __init__(self, pool: Any, settings: EvalSettings, classifier: Any = None, *, flush: bool = False,
                 command: str = "", retries: int = 2, backoff_s: float = 1.0) -> None:
        self.retries = retries
        self.backoff_s = backoff_s
        self.pool = pool
        self.runtimes = pool.runtimes
        self.classifier = classifier
        self.settings = settings
        self.flush = flush
        self.command = command
        self.prompt_ids: dict[tuple[str, str], list[int]] = {}
        self.forcing_ids: dict[str, list[int]] = {}
        """The forcing text's ids per answer kind (`harness.forced`; --forced-answer only)."""

    def prepare(self, items: list[WorkItem]) -> None:
        """Encode every prompt once, in this thread (the first runtime's tokenizer; `--system`, the chat template
        or plain text, the template's thinking switch, as the settings say)."""
        tok, s = self.runtimes[0].tokenizer, self.settings
        for it in items:
            key = (it.dataset, it.prompt.id)
            if key not in self.prompt_ids:
                self.prompt_ids[key] = prompt_input_ids(tok, it.prompt, s)
        if s.forced_answer:
            self.forcing_ids = {kind: [int(t) for t in tok.encode(f.text, add_special_tokens=False)]
                                for kind, f in forced_pass.FORCED_ANSWERS.items()}

    def generate(self, item: WorkItem) -> dict[str, Any]:
        """Run the item's method (in a pool thread); a failed generation becomes an error outcome."""
        with self.pool.lease() as rt:  # the item's own view of the runtime (its routing key behind a gateway)
            if self.flush and rt.is_embedded:
                rt.flush()  # one chain at a time: no method reuses another's KV
            ids = self.prompt_ids[(item.dataset, item.prompt.id)]
            runner = MethodRunner(rt.backend, self.settings.for_dataset(item.dataset), self.classifier,
                                  eos_token_ids=rt.eos_token_ids)
            out = self._run_with_retries(runner, item, ids, rt)
        out["runtime"] = rt
        return out

    def _run_with_retries(self, runner: MethodRunner, item: WorkItem, ids: list[int], rt: Any) -> dict[str, Any]:
        for attempt in range(self.retries + 1):
            try:
                out = runner.run(item.method, ids, f"{item.dataset}/{item.prompt.id}", item.seed)
                if self.settings.forced_answer:
                    out.update(self._forced_pass(rt, item, ids, out["response_ids"]))
                out["attempts"] = attempt + 1
                return out
            except ValueError as e:
                return {"error": " ".join(str(e).split()) or type(e).__name__, "attempts": attempt + 1}
            except EngineError as e:
                error = " ".join(str(e).split()) or type(e).__name__
                if attempt < self.retries:
                    time.sleep(self.backoff_s * 2**attempt)
        return {"error": error, "attempts": self.retries + 1}

    def _forced_pass(self, rt: Any, item: WorkItem, prompt_ids: list[int], response_ids: list[int]
                     ) -> dict[str, Any]:
        """The forced-answer continuation of a response (`harness.forced`): its ids and time; none for code."""
        kind = item.prompt.category
        how = forced_pass.forced_answer_for(kind)
        if how is None:
            return {}
        prefix = forced_pass.forced_prefix(prompt_ids, response_ids, rt.eos_token_ids, self.forcing_ids[kind])
        start = time.perf_counter()
        room = forced_pass.room_left(how, len(prefix), rt.max_context)
        ids = forced_pass.greedy_continuation(rt.backend, prefix, room) if room > 0 else []
        return {"forced_ids": ids, "forced_wall_s": time.perf_counter() - start}

    def _forced_record(self, item: WorkItem, response: str, forced: dict[str, Any], rt: Any) -> dict[str, Any]:
        """The forced fields of a record: the forced text graded like a response (code: null fields)."""
        how = forced_pass.forced_answer_for(item.prompt.category)
        if how is None or "forced_ids" not in forced:
            return {"forced_text": None, "forced_ids": None, "forced_grade": None, "forced_correct": None,
                    "forced_tokens": 0, "forced_wall_s": None}
        ids = cut_at_eos(forced["forced_ids"], rt.eos_token_ids)
        continuation = rt.tokenizer.decode(ids, skip_special_tokens=True)
        text = forced_pass.forced_text(how, continuation)
        g = grade(item.prompt, response + forced_pass.graded_text(how, continuation))
        return {"forced_text": text, "forced_ids": ids, "forced_grade": g.to_json(), "forced_correct": g.correct,
                "forced_tokens": len(forced["forced_ids"]), "forced_wall_s": forced["forced_wall_s"]}

    def finish(self, item: WorkItem, out: dict[str, Any]) -> dict[str, Any]:
        """The JSONL record of a generated item, graded here (main thread: math-verify needs its alarm)."""
        rt = out.pop("runtime")
        rec: dict[str, Any] = {
            "key": item.key, "dataset": item.dataset, "method": item.method, "prompt_id": item.prompt.id,
            "prompt_index": item.prompt_index, "prompt_sha": item.prompt.fingerprint(),
            "messages_sha": item.prompt.messages_fingerprint(self.settings.system), "seed": item.seed,
            "category": item.prompt.category,
            "model": rt.name, "dtype": rt.dtype, "backend": rt.location,
            "settings": self.settings.for_dataset(item.dataset).for_method(item.method),
            "prompt_tokens": len(self.prompt_ids[(item.dataset, item.prompt.id)]),
            "input_sha": ids_fingerprint(self.prompt_ids[(item.dataset, item.prompt.id)]),
        }
        if "shuffle_seed" in item.prompt.extra:  # GPQA: the seed its choices were shuffled with (what the model saw)
            rec["gpqa_shuffle_seed"] = item.prompt.extra["shuffle_seed"]
        forced = {k: out.pop(k) for k in ("forced_ids", "forced_wall_s") if k in out}
        if "error" not in out:
            out["response_ids"] = cut_at_eos(out["response_ids"], rt.eos_token_ids)
            text = rt.tokenizer.decode(out["response_ids"], skip_special_tokens=True)
            start = time.perf_counter()
            try:
                g = grade(item.prompt, text)
                rec.update(out, response=text, grade=g.to_json(), correct=g.correct,
                           grade_s=time.perf_counter() - start)
                if self.settings.forced_answer:
                    rec.update(self._forced_record(item, text, forced, rt))
            except Exception as exc:  # a grader's failure: this item's error line (--resume retries it), not the run's
                reason = " ".join(str(exc).split())
                out = dict(out, response=text, error=f"grading failed: {type(exc).__name__}: {reason}")
            else:
                if g.grader == "code":
                    iso = isolation_report()
                    rec["sandbox"] = {k: iso.get(k) for k in ("network", "filesystem", "pids", "user", "interpreter",
                                                              "not_contained")}
        if "error" in out:
            rec.update(out, correct=False, grade=None)
            if self.settings.forced_answer:  # a wrong forced answer too (none for code)
                rec["forced_correct"] = False if forced_pass.forced_answer_for(item.prompt.category) else None
        return self._stamped(rec)

    def _stamped(self, rec: dict[str, Any]) -> dict[str, Any]:
        rec["load_avg"] = os.getloadavg()[0]
        rec["command"] = self.command
        return rec
