"""An engine-free `CompletionModel` on the `LogitTableModel` toy, with an EOS token (a test double)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..programs.completions import Completion, CompletionRequest
from .logit_table_model import LogitTableModel


class LogitTableCompletions:
    """Completions that stop at `eos` (kept as the last id): Gumbel-max with noise keyed by (seed, absolute
    position) like the engine, greedy at temperature 0; per-token log q_τ, log p0 and entropy of p0."""

    def __init__(self, table: LogitTableModel, eos: int | None = 0) -> None:
        self.table = table
        self.eos = eos
        self.calls: list[list[CompletionRequest]] = []

    def _one(self, req: CompletionRequest) -> Completion:
        ids = list(req.prefix_ids)
        toks, lq, lp, ent = [], [], [], []
        finished = False
        for _ in range(req.max_tokens):
            pos = len(ids)
            logp0 = self.table.log_p0(ids[-1], pos)
            if req.temperature == 0:
                tok, logq = int(np.argmax(logp0)), 0.0
            else:
                logq_all = self.table.log_q(ids[-1], pos, req.temperature)
                tok = int(np.argmax(logq_all + self.table.gumbel(req.seed, pos)))
                logq = float(logq_all[tok])
            toks.append(tok), lq.append(logq), lp.append(float(logp0[tok]))
            ent.append(-float(np.dot(np.exp(logp0), logp0)))
            ids.append(tok)
            if tok == self.eos:
                finished = True
                break
        return Completion(np.asarray(toks, dtype=np.int64), np.asarray(lq), np.asarray(lp), np.asarray(ent), finished)

    def complete(self, requests: Sequence[CompletionRequest]) -> list[Completion]:
        if not requests:
            raise ValueError("a model call needs at least one request")
        self.calls.append(list(requests))
        return [self._one(r) for r in requests]
