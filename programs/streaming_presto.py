"""Streaming PreSTO (issue 12): a prefetched request starts the moment its prefix exists.

Round-based PreSTO (`samplers.PrestoSampler`) generates a subtree per batched call, and Condition 1 keeps a
request whose cut c′ lies beyond its parent proposal's cut c out of the call that generates that proposal.
Here every request is a *row* of its own, started the moment it is feasible - its prefix x_{0:c′} is known,
possibly because the parent proposal's row has just decoded position c′ − 1 (`stream_tree`) - and the MH
walk decides transition k the moment the proposal of the realized state is complete.  After each step of
the engine (`stream_proposals.ProposalStreams.updates`) the sampler:

1. walks as far as the completed proposals allow - with the kernel's own `cut`, `requests`, `decide` and
   the decision stream's uniform at the realized state, i.e. exactly the sequential sampler's decisions; a
   PowerMH proposal (τ = 1/α) can be rejected before it is complete: each of its tokens can only lower log r,
   so once the bound over its tokens so far (`kernel.log_ratio_bound`) is at most log u the complete proposal
   would be rejected too, and the walk rejects it there and stops its row (`PrefetchConfig.early_reject`; the
   engine must report a running row's log q_τ and log p0, as the embedded engine does);
2. enumerates the tree below the realized state best first by the probability P that the walk reaches a
   node (ĥ: the predictive rule's classifier, else the chain's acceptance rate so far) and starts the
   requests of the feasible nodes in that order while fewer than N_pf rows run, but only for nodes worth
   their row: P·(1 + ĥ·D) ≥ λ (`PrefetchConfig.row_cost`, the measured cost of one more row relative to a
   decode step; a row of L tokens costs L·b and saves L·a of waiting for the node, reached with P, and for
   the acceptance subtree its tokens make feasible, about P·ĥ per level over the D levels below;
   `stream_tree.walk_tree`).  A running row is never displaced; it is aborted only
   when no node below the realized state asks for it any more (each row keeps the decision paths of the
   nodes that asked for it, and the next plan looks for a new one when the walk went the other way).  When a
   node the plan did not enumerate asks for an aborted row's request later, the request resumes after the
   tokens that row decoded (`RowUpdate.partial`: the embedded engine reports them with their per-token
   quantities and keeps their KV in its prefix cache), so no token is decoded twice; a server's abort reports
   no quantities, and there the request starts over (a repeated request in the ledger).

Exactness (Proposition 1): the walk looks rows up by the exact `SuffixRequest` the sequential sampler would
send at the realized state (same prefix ids, length, τ, seed of transition j); the engine keys noise by
(seed, absolute position) and is batch-invariant, so a row started early, next to other rows or with
shared KV, returns the suffix that request returns in any call.  Speculation only decides *which* rows run.

Windows.  A window is the streaming counterpart of a call: at most T engine decode steps (the longest a
round-based call or a sequential step can take) once it realized a transition, and a new one also opens when
the walk needs a request no row was running (a restart: the engine starts it from scratch, as a new call
would).  Windows partition the MH phase, so their wall times add up to the model-call time of Eq. 20 (block
extensions excluded), and transitions per window compare with transitions per call; within one the walk
crosses any number of acceptances.  Each window is one `CallRecord` (kind "mh") with the rows started and
aborted in it, the wasted tokens (of rows the walk never used), its decode steps and Σ rows over them.  (On a server, whose
events are not decode steps, only restarts open windows.)

    paper / notion                             code
    N_pf (concurrent distinct rows)            PrefetchConfig.budget
    λ = b / a (admission: P·(1 + ĥ·D) ≥ λ)      PrefetchConfig.row_cost
    ĥ of the ranking                           PrefetchConfig.traversal ("predictive": the classifier's;
                                               else the chain's acceptance rate, Laplace-smoothed)
    MHTransition at the realized state         _BlockRun.advance
    rejection decided while y still decodes    _BlockRun.reject_early
    prefetch: abort unreachable, start rows    _BlockRun.plan
    window (a "call")                          Window -> CallRecord
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from typing import Any, Callable

import numpy as np

from ..runtime_ext.protocol import EngineError
from .acceptance import accept_decision
from .cut_statistics import root_cut_features
from .prefetch_tree import accept_child
from .suffixes import ProposalModel, Suffix, SuffixRequest
from .random_streams import DecisionStream, MemoStream
from .records import CallRecord
from .samplers import BlockwiseSampler, ChainResult
from .sampler_config import PrefetchConfig, SamplerConfig
from .stream_proposals import ProposalStreams
from .stream_rows import Row, Window
from .stream_tree import StateRef, TreeNode, walk_tree
from .transitions import ChainState
from .traversal import CandidateNode


class StreamingPrestoSampler(BlockwiseSampler):
    """PreSTO with streamed rows (module docstring); `streams` defaults to `model.streams()`."""

    variant = "streaming"

    def __init__(self, model: ProposalModel, config: SamplerConfig, prefetch: PrefetchConfig = PrefetchConfig(),
                 streams: ProposalStreams | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__(model, config, clock)
        self.prefetch = prefetch.resolved(config)  # N_pf set: the given one, or the sampler's default
        self._streams = streams

    @property
    def name(self) -> str:
        return f"streaming-presto-{self.config.kind}"

    @property
    def streams(self) -> ProposalStreams:
        if self._streams is None:
            opener = getattr(self.model, "streams", None)
            if opener is None:
                raise EngineError(f"{type(self.model).__name__} cannot stream rows: streaming PreSTO needs a model "
                                  "with streams() (the program model on the embedded engine or a server)")
            self._streams = opener()
        return self._streams

    def _run_block(self, result: ChainResult, stream: DecisionStream, block: int) -> None:
        _BlockRun(self, result, stream, block).run()


class _BlockRun:
    """The K transitions of one block (module docstring)."""

    def __init__(self, sampler: StreamingPrestoSampler, result: ChainResult, stream: DecisionStream,
                 block: int) -> None:
        self.sampler, self.result, self.block = sampler, result, block
        self.kernel, self.pf = sampler.kernel, sampler.prefetch
        self.stream: Any = MemoStream(stream)
        self.io = sampler.streams
        self.K = sampler.config.steps_per_block
        self.T = result.state.length
        self.k = 0
        self.root = StateRef.root(result.state)
        self.rows: dict[SuffixRequest, Row] = {}
        self.by_rid: dict[str, Row] = {}
        self.started: list[Row] = []
        self.windows: list[Window] = []
        self.needs: tuple[SuffixRequest, ...] = ()
        self.max_nodes = self.pf.max_nodes
        self.hhat_memo: dict[Any, float] = {}
        """ĥ by (transition, cut, κ, accepts) below the current realized state (reset at every decision)."""
        self.accepts = sum(result.history)
        """Accepted decisions of the chain so far (the rate's numerator, kept as the walk decides)."""
        self.parked: dict[SuffixRequest, tuple[Suffix, Row]] = {}
        """request -> what an aborted row of it decoded (with per-token quantities) and that row: a later start
        of the request resumes after those tokens."""
        self.aborting: dict[str, Row] = {}
        """rid -> a row aborted whose abort the engine has not reported yet."""
        self.waits: dict[str, int] = {}
        """rid -> tokens that running row must decode before a node the last plan met becomes feasible."""
        self.dirty = True
        self.lockstep = bool(getattr(self.io, "lockstep", False))

    # ------------------------------------------------------------------------------------------ the loop
    def run(self) -> None:
        try:
            while self.k < self.K:
                if self.advance():
                    self.dirty = True
                    continue
                if self.dirty:  # re-plan only when the feasible set or the ranking may have changed
                    self.plan()
                self.consume()
        finally:
            for row in list(self.by_rid.values()):
                if row.running:
                    self.abort(row)
            self.io.pause()
            if self.windows:
                self.windows[-1].end = self.sampler.clock()
            self.record_windows()

    def consume(self) -> None:
        batch = self.io.updates()
        window = self.windows[-1]
        # at most T steps a window once it realized a transition (rows a step apart can take more: a window
        # has at least one transition, as a call does)
        if self.lockstep and window.decisions and window.steps + batch.steps > self.T:
            self.open_window()
            window = self.windows[-1]
        window.steps += batch.steps
        for u in batch.updates:
            row = self.by_rid.get(u.rid)
            if row is None and u.aborted:
                self.park(self.aborting.pop(u.rid, None), u.partial)
            if row is None or not row.running:
                continue
            if u.error is not None:
                raise EngineError(f"streamed row {u.rid} failed: {u.error}") from u.error
            if u.aborted:
                self.forget(row)
                self.park(row, u.partial)
                self.dirty = True
                continue
            # a resumed row's ids begin with its resumed part; the others are the engine's as they are
            ids = u.ids if not row.first else row.ids[: row.first] + tuple(u.ids)
            window.row_steps += max(len(ids) - len(row.ids), 0)
            row.ids = ids
            if u.logq is not None and u.logp0 is not None and len(u.logq) == len(u.ids) == len(u.logp0):
                head = row.resumed
                row.logq = tuple(u.logq) if head is None else tuple(head.logq.tolist()) + tuple(u.logq)
                row.logp0 = tuple(u.logp0) if head is None else tuple(head.logp0.tolist()) + tuple(u.logp0)
            if u.suffix is not None:
                row.suffix = u.suffix if row.resumed is None else row.resumed.then(u.suffix)
                self.dirty = True
            elif len(ids) >= self.waits.get(row.rid, len(ids) + 1):
                self.dirty = True

    # ------------------------------------------------------------------------------------------ the walk
    def requests_at(self, tokens: np.ndarray, cut: int, j: int) -> tuple[SuffixRequest, ...]:
        prefix = self.result.prompt_ids + tuple(tokens[:cut].tolist())
        return tuple(self.kernel.requests(prefix, cut, self.T, j, self.stream))

    def advance(self) -> bool:
        """Decide transition k at the realized state if its proposal is complete (the sequential decision)."""
        state = self.root.state
        assert state is not None
        j = self.k
        cut = self.kernel.cut(state, j, self.stream)
        self.needs = self.requests_at(state.tokens, cut, j)
        rows = [self.rows.get(r) for r in self.needs]
        if not self.windows or any(row is None for row in rows):
            return False
        if any(row is None or row.suffix is None for row in rows):
            return self.reject_early(state, cut, rows, j)
        suffixes = [row.suffix for row in rows if row is not None and row.suffix is not None]
        decision = self.kernel.decide(state, cut, suffixes, j, self.stream)
        accepted = accept_decision(self.stream.accept_log_uniform(j), decision.log_accept)
        self.decided(rows, (j, cut, decision.log_accept, accepted, state, None), decision.proposal if accepted else None)
        return True

    def reject_early(self, state: ChainState, cut: int, rows: list[Row | None], j: int) -> bool:
        """Decide transition j as a rejection while its proposal is still decoding, when the bound of log r over
        the tokens so far (`kernel.log_ratio_bound`) already gives log u ≥ log A: the decision the complete
        proposal would give (`acceptance.log_mh_ratio_bound`); the row stops there."""
        bound_of = getattr(self.kernel, "log_ratio_bound", None)
        if not self.pf.early_reject or bound_of is None or len(rows) != 1:
            return False
        (row,) = rows
        if row is None or not row.logq or len(row.logq) != len(row.ids):
            return False
        bound = bound_of(state, cut, row.logq, row.logp0, row.ids)
        if bound is None or accept_decision(self.stream.accept_log_uniform(j), min(0.0, bound)):
            return False
        self.abort(row)  # read up to here; no node asks for transition j's request again
        self.decided(rows, (j, cut, min(0.0, bound), False, state, len(row.ids)), None)
        return True

    def decided(self, rows: list[Row | None], decision: tuple[int, int, float, bool, Any, int | None],
                proposal: ChainState | None) -> None:
        """Book transition k's decision (j, cut, log A or its bound, accepted, state, the tokens read when decided
        early), move to the accepted `proposal`, prune the rows."""
        for row in rows:
            while row is not None:  # and the aborted rows it resumed
                row.used = True
                row = row.previous
        self.windows[-1].decisions.append(decision)
        self.result.history.append(decision[3])
        self.accepts += bool(decision[3])
        if proposal is not None:
            self.result.state = proposal
            self.root = StateRef.root(proposal)
        self.hhat_memo = {}
        self.prune(decision[3])
        self.k += 1
        self.sampler._advanced(1)

    # ------------------------------------------------------------------------------------------ prefetch
    def prune(self, accepted: bool) -> None:
        """The walk decided transition k: keep each row's paths that agree, one level shorter.  A running row
        left with none is an orphan - unless the new realized state asks for its request itself (an accepted
        proposal that repeats the old tokens up to the row's cut) - until the next `plan` finds a node of the
        new tree that asks for it or aborts it."""
        assert self.root.state is not None
        for row in [row for row in self.by_rid.values() if row.suffix is not None and row.transition <= self.k]:
            del self.by_rid[row.rid], self.rows[row.request]  # a decided transition's: never asked for again
        self.parked = {r: p for r, p in self.parked.items() if p[1].transition > self.k}  # (nor resumed)
        self.stream.forget_before(self.k + 1)  # the draws of decided transitions (EntropyCut: T Gumbels each)
        head, tokens = len(self.result.prompt_ids), tuple(self.root.state.tokens.tolist())
        for row in self.by_rid.values():
            row.paths = {p[1:] for p in row.paths if p and p[0] == accepted}
            below = row.transition - (self.k + 1)
            if row.running and not row.paths and below >= 0 and tuple(row.request.prefix_ids[head:]) == \
                    tokens[: len(row.request.prefix_ids) - head]:
                row.paths.add((False,) * below)  # the new state asks for it itself, after `below` rejections

    def plan(self) -> None:
        """Start rows for the feasible nodes best first by reach, while fewer than N_pf rows run, for nodes worth
        at least λ (module docstring); the walk's own requests always run.  A running row is never displaced; a row
        no reachable node needs was aborted by `prune`."""
        nodes = walk_tree(self.root, self.k, self.K - self.k, self.max_nodes, self.expand, hhat=self.hhat,
                          min_value=self.pf.row_cost)
        self.dirty, self.waits = False, {}
        missing = [r for r in dict.fromkeys(self.needs) if r not in self.rows]
        if missing or not self.windows:  # the walk waits on a request no row was running: a new window
            self.open_window()
        for r in self.needs:
            if r in self.rows:
                self.rows[r].paths.add(())
        target: dict[SuffixRequest, tuple[str | None, tuple[bool, ...], int]] = {r: (None, (), self.k) for r in missing}
        running = self.running_rows()
        slots = max(self.pf.budget - len(running) - len(missing), 0)
        orphans = [row for row in running if not row.paths]
        for node in nodes:
            if slots <= 0 and not orphans:
                break  # nothing left to start, no orphan left to look for
            if node.requests is None:
                if orphans:
                    orphans = self.keep_orphans_for(node, orphans)
                continue
            wanted = list(dict.fromkeys(node.requests))
            for r in wanted:
                if r in self.rows:
                    self.rows[r].paths.add(node.path)
            if orphans:
                orphans = [row for row in orphans if not row.paths]
            todo = [r for r in wanted if r not in self.rows and r not in target]
            if not todo:
                continue
            if len(todo) > slots:  # none left (only orphans to look for), or
                continue  # (MultiTryMH) too many rows for the slots left: a later node may need fewer
            assert node.cut is not None
            source = node.state.source(node.cut, self.rows)
            target.update((r, (source, node.path, node.transition)) for r in todo)
            slots -= len(todo)
        for row in self.running_rows():
            if not row.paths and row.request not in target:  # no node below the realized state asks for it
                self.abort(row)
        for req, (source, path, transition) in target.items():
            self.start(req, source, path, transition)
            self.dirty = True  # the next plan learns where the new row's children become feasible
        self.windows[-1].max_rows = max(self.windows[-1].max_rows, len(self.running_rows()))

    def keep_orphans_for(self, node: TreeNode, orphans: list[Row]) -> list[Row]:
        """A node whose requests are not known yet may still ask for an orphan's request: attach every orphan
        of its transition whose prefix agrees with what is known of the node's state; the orphans left."""
        head = len(self.result.prompt_ids)
        for row in orphans:
            if row.transition == node.transition:
                prefix = row.request.prefix_ids[head:]
                known = node.state.known(len(prefix), self.rows)
                if tuple(known.tolist()) == tuple(prefix[: len(known)]):
                    row.paths.add(node.path)
        return [row for row in orphans if not row.paths]

    def expand(self, node: TreeNode) -> None:
        """The node's cut and, once its prefix is known, its requests (the kernel's, at the node's state)."""
        if self.kernel.state_dependent_cut:
            state = node.state.complete(self.rows, self.kernel, self.stream)
            if state is None:
                return
            node.cut = self.kernel.cut(state, node.transition, self.stream)
        else:
            node.cut = self.kernel.cut(self.root.state, node.transition, self.stream)  # depends on T only
        tokens = node.state.tokens(node.cut, self.rows, self.kernel, self.stream, self.waits)
        if tokens is not None:
            node.requests = self.requests_at(tokens, node.cut, node.transition)

    def hhat(self, node: TreeNode) -> float:
        """ĥ(v+; ε) at the node: the predictive rule's (Features 3/4 from the realized state), else the chain's
        acceptance rate so far, (accepts + 1) / (decisions + 2)."""
        assert self.root.state is not None
        if self.pf.traversal != "predictive":
            return (self.accepts + 1.0) / (len(self.result.history) + 2.0)
        assert self.pf.branch_prob is not None
        cut = node.cut if node.cut is not None else self.kernel.cut(self.root.state, node.transition, self.stream)
        key = (node.transition, cut, node.known_cut, node.accepts) if self.pf.tree_position else (node.transition, cut, 0, 0)
        if key not in self.hhat_memo:
            where = dict(parent_cut=node.known_cut, accepts_on_path=node.accepts) if self.pf.tree_position else {}
            stats = root_cut_features(self.root.state, cut, self.sampler.config.alpha)
            cand = CandidateNode(node.depth, cut, self.T, features=stats, **where)
            self.hhat_memo[key] = float(self.pf.branch_prob(cand))
        return self.hhat_memo[key]

    # ------------------------------------------------------------------------------------------ rows
    def running_rows(self) -> list[Row]:
        return [r for r in self.by_rid.values() if r.running]

    def start(self, request: SuffixRequest, share_from: str | None, path: tuple[bool, ...], transition: int) -> None:
        """Start a row for `request`; one an aborted row decoded part of resumes after that part (the engine keys
        noise by (seed, absolute position): the continuation's tokens are those the whole request would get)."""
        partial, previous = self.parked.pop(request, (None, None))
        row = Row(rid=f"stream-{uuid.uuid4().hex[:16]}", request=request, window=len(self.windows) - 1,
                  transition=transition, paths={path}, resumed=partial, previous=previous,
                  ids=() if partial is None else tuple(int(t) for t in partial.ids))
        self.rows[request] = row
        self.by_rid[row.rid] = row
        self.started.append(row)
        self.windows[-1].rows_started += 1
        if partial is not None:  # the aborted row's KV went into the engine's prefix cache
            rest = SuffixRequest(request.prefix_ids + row.ids, request.max_tokens - len(row.ids), request.temperature,
                                 request.seed)
            self.io.start(row.rid, rest, None)
            return
        running = self.by_rid.get(share_from) if share_from else None
        self.io.start(row.rid, request, share_from if running is not None and running.running else None)

    def abort(self, row: Row) -> None:
        self.io.abort(row.rid)
        self.windows[-1].rows_aborted += 1
        self.aborting[row.rid] = row
        self.forget(row)

    def park(self, row: Row | None, partial: Suffix | None) -> None:
        """Keep what an aborted row decoded (the engine's report of it) for a later start of its request."""
        if row is None or row.used or partial is None or len(partial.ids) == 0 or row.request in self.rows or \
                row.transition < self.k:
            return  # (a row the walk read, e.g. an early rejection's, or of a decided transition: never asked again)
        whole = partial if row.resumed is None else row.resumed.then(partial)
        if 0 < len(whole.ids) < row.request.max_tokens:
            self.parked[row.request] = (whole, row)

    def forget(self, row: Row) -> None:
        row.aborted = True
        if self.rows.get(row.request) is row:
            del self.rows[row.request]
        self.by_rid.pop(row.rid, None)

    # ------------------------------------------------------------------------------------------ windows
    def node_record(self, call_index: int, j: int, cut: int, log_a: float, accepted: bool, state: ChainState,
                    read: int | None) -> Any:
        """The record of a realized decision; an early rejection's log A is the bound it was decided by (A is at
        most that): `extra` says so and how many proposal tokens it read."""
        rec = self.sampler._node_record(self.result, self.block, call_index, accept_child(0), self.T, cut, j, log_a,
                                        True, accepted, root_cut_features(state, cut, self.sampler.config.alpha))
        if read is None:
            return rec
        return replace(rec, extra={**rec.extra, "log_accept_is_bound": True, "early_rejection_read": read,
                                   "proposal_tokens": self.T - cut})

    def open_window(self) -> None:
        now = self.sampler.clock()
        if self.windows:
            self.windows[-1].end = now
        self.windows.append(Window(start=now))

    def record_windows(self) -> None:
        """One CallRecord per window: tokens and waste of the rows started in it; every row into the chain's
        `request_ledger`."""
        res, s = self.result, self.sampler
        of_window: dict[int, list[Row]] = {}
        for row in self.started:  # the chain's ledger: every started row is a generation (restarts repeat one)
            of_window.setdefault(row.window, []).append(row)
            res.requests.generated(row.request, row.decoded, start=row.first)
            if row.used:
                res.requests.used([row.request])
        for w_index, w in enumerate(self.windows):
            rows = of_window.get(w_index, [])
            tokens = sum(r.decoded for r in rows)
            wasted = sum(r.decoded for r in rows if not r.used)
            call_index = len(res.calls)
            nodes = tuple(self.node_record(call_index, *decision) for decision in w.decisions)
            res.calls.append(CallRecord(
                prompt_id=res.prompt_id, sampler=s.name, call_index=call_index, kind="mh", block=self.block,
                wall_time=w.end - w.start, nodes_scored=len(nodes), distinct_requests=len(rows),
                generated_requests=len(rows), generated_tokens=tokens, transitions=len(nodes), nodes=nodes,
                rows_started=w.rows_started, rows_aborted=w.rows_aborted, wasted_tokens=wasted, decode_steps=w.steps,
                row_steps=w.row_steps, max_rows=w.max_rows))
