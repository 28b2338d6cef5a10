"""Mutate-vs-serve stress on the real tiny engine, checked by an oracle that trusts nothing the code reports.

* The true state is the test's own replay of the mutation log (mutators log every mutation, in commit
  order, under a test-level lock; the code's version numbers and reported states are not used).
* Every served token is recomputed cold by a second copy of the tiny model, run as a plain transformers
  forward pass (no engine, no radix cache, no ready cache), on every state the session can have held
  while the request ran: the states between the log lengths read before and after the serve (one
  committed-but-not-yet-logged mutation included).
* Fast-path answers must match the oracle's argmax *and* its logit gap (float64, to 1e-9: see TOL); an exact match
  reads its own entry, an ad-hoc (relaxed) query the generic header's distribution (§3.4).

No assertion counts how often a path was taken (that is timing): a deterministic sequential phase with
checkpoints (mutate, then serve before any re-pre-position) runs first, so that a cache that skips
invalidation on any mutation is caught every time (`test_the_oracle_catches_skipped_invalidation`), and a
racing phase (two mutators, two servers, the background worker) follows under the same oracle.
"""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest
import torch

from forerun.runtime_ext.engine import EmbeddedEngine, EngineConfig
from forerun.runtime_ext.engine.models import load_model
from forerun.runtime_ext.preposition.prepositioner import PrepositionConfig, Prepositioner
from forerun.runtime_ext.preposition.ready_cache import SessionState
from forerun.runtime_ext.preposition.gate import GateConfig

INITIAL = tuple(range(1, 13))
FROZEN = 4
HEADER = (50, 51)
STANDING = (40, 41, 42) + HEADER
ADHOC = (44, 45) + HEADER
EXTENDED = STANDING + (7,)
QUERIES = (STANDING, ADHOC, EXTENDED)


def replay(log):
    """The true states: states[k] = the tokens after the first k logged mutations."""
    states = [list(INITIAL)]
    for op, arg in log:
        t = list(states[-1])
        if op == "append":
            t.extend(arg)
        elif op == "shift":
            del t[FROZEN:FROZEN + arg]
        elif op == "rollback":
            del t[len(t) - arg:]
        states.append(t)
    return [tuple(s) for s in states]


def _rmsnorm_in_float64(norm):
    """transformers' LlamaRMSNorm casts to float32 and back; the oracle's copy normalises in the model's own
    float64 (the same formula, no cast), so its logits are float64-accurate on long states too."""
    def forward(h):
        return norm.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))

    norm.forward = forward


class ColdOracle:
    """Next-token logits by a plain forward pass of a separately loaded copy of the tiny model."""

    def __init__(self):
        self.model = load_model("tiny").model
        for module in self.model.modules():
            if type(module).__name__.endswith("RMSNorm"):
                _rmsnorm_in_float64(module)
        self.cache: dict[tuple[int, ...], np.ndarray] = {}

    def logits(self, ids):
        ids = tuple(ids)
        if ids not in self.cache:
            with torch.inference_mode():
                self.cache[ids] = self.model(torch.tensor([ids])).logits[0, -1].double().numpy()
        return self.cache[ids]


# With its norms in float64 the oracle matches the engine's float64 forward to ~1e-13 in a logit (measured
# on 300 random states of 20-230 tokens: without that, transformers' float32 RMSNorm cast differed by up to
# 7.7e-6 in a logit and 4.3e-6 in a gap on such states).  Distinct states of a session differ by orders of
# magnitude more, so this tolerance tells every state apart.
TOL = 1e-9


def _agrees(oracle, ids, token, gap):
    z = oracle.logits(ids)
    top = np.sort(z)[-2:]
    best = set(np.flatnonzero(z >= top[1] - TOL).tolist())
    return token in best and (gap is None or abs((top[1] - top[0]) - gap) < TOL)


def check_serve(oracle, states, rec):
    """None if some state in the request's window explains the served token, else a description."""
    realized, result, lo, hi = rec
    window = states[lo:min(hi + 1, len(states) - 1) + 1]
    for st in window:
        if result.path == "fast":
            ok = tuple(result.entry) == realized and _agrees(oracle, st + realized, result.token_id, result.logit_gap)
        elif result.path == "fast_relaxed":
            ok = tuple(result.entry) == HEADER and _agrees(oracle, st + HEADER, result.token_id, result.logit_gap)
        else:
            ok = _agrees(oracle, st + realized, result.token_id, None)
        if ok:
            return None
    return f"{result.path} serve of {realized} (token {result.token_id}) matches no state of log window [{lo}, {hi + 1}]"


def run_stress(engine, *, rounds=36, race_mutations=120, seed=0):
    """Phase 1 (sequential checkpoints) then phase 2 (race); returns (violations, states, log, session, pp)."""
    pp = Prepositioner(engine, PrepositionConfig(gate=GateConfig(threshold=0.0)))
    s = SessionState(INITIAL, frozen_len=FROZEN)
    log, records = [], []
    log_lock = threading.Lock()

    def mutate(rnd, op=None):
        with log_lock:  # the mutation and its log entry, in commit order (mutators only serialize here)
            n = s.live_end - FROZEN
            op = op or ("append" if n < 6 or rnd.random() < 0.5 else rnd.choice(["shift", "rollback"]))
            if op == "append" or n < 2:
                op, arg = "append", [rnd.randrange(2, 200) for _ in range(rnd.randint(1, 3))]
                s.append(arg)
            elif op == "shift":
                arg = rnd.randint(1, min(3, n - 1))
                s.shift_window(arg)
            else:
                arg = rnd.randint(1, min(2, n - 1))
                s.rollback(arg)
            if s.live_end > 48:
                raise AssertionError("the harness keeps the state short")
            log.append((op, tuple(arg) if op == "append" else arg))

    def serve(realized):
        lo = len(log)
        r = pp.serve(s, realized, allow_relaxed=True)
        records.append((realized, r, lo, len(log)))

    rnd = random.Random(seed)
    for i in range(rounds):  # phase 1: deterministic checkpoints, every mutation kind
        pp.preposition(s, STANDING, header=HEADER)
        pp.wait_idle(60, session=s)
        for q in QUERIES:
            serve(q)
        mutate(rnd, ("append", "shift", "rollback")[i % 3])
        for q in QUERIES:  # before any re-pre-position: a held distribution here would be stale
            serve(q)
    _race(pp, s, mutate, serve, race_mutations, seed)
    assert pp.wait_idle(120, session=s)
    pp.close()
    states = replay(log)
    oracle = ColdOracle()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        violations = [v for rec in records if (v := check_serve(oracle, states, rec)) is not None]
    finally:
        torch.set_num_threads(threads)
    return violations, states, log, s, records


def _race(pp, s, mutate, serve, race_mutations, seed):
    """Phase 2: two mutators (re-pre-positioning after each mutation) and two servers race."""
    done = threading.Event()
    errors = []

    def mutator(k):
        rnd = random.Random(seed * 100 + k)
        try:
            for i in range(race_mutations // 2):
                mutate(rnd)
                pp.preposition(s, STANDING, header=HEADER)
                if i % 3 == 0:
                    pp.wait_idle(60, session=s)  # let some pre-positions land before the next mutation
        except BaseException as exc:
            errors.append(exc)

    def server(k):
        rnd = random.Random(seed * 100 + 50 + k)
        try:
            while not done.is_set():
                serve(rnd.choice(QUERIES))
        except BaseException as exc:
            errors.append(exc)

    mutators = [threading.Thread(target=mutator, args=(k,)) for k in range(2)]
    servers = [threading.Thread(target=server, args=(k,)) for k in range(2)]
    for t in mutators + servers:
        t.start()
    for t in mutators:
        t.join()
    done.set()
    for t in servers:
        t.join()
    if errors:
        raise errors[0]


@pytest.fixture(scope="module")
def engine():
    with EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=0.0)) as eng:
        yield eng


def test_no_stale_serve_no_lost_update_against_an_independent_oracle(engine):
    violations, states, log, s, records = run_stress(engine)
    assert violations == []
    assert s.tokens == states[-1]  # no lost update: the session holds the replayed log
    paths = [r.path for _, r, _, _ in records]
    c = s.counters
    assert c.served_fast + c.served_fast_relaxed + c.fell_through + c.cold == len(records)
    s.check_counters()
    # the deterministic phase reached every path (phase 2 adds races, and is not counted)
    assert {"fast", "fast_relaxed", "fall", "cold"} <= set(paths)


@pytest.mark.parametrize("skipped", ["append", "shift", "rollback"])
def test_the_oracle_catches_skipped_invalidation(engine, monkeypatch, skipped):
    """Break §3.6 on purpose: one kind of mutation bumps the version but keeps the cached distributions."""
    original = SessionState._mutated

    def lazy(self, reason):
        if reason == skipped:
            self.version += 1
            return self.version
        return original(self, reason)

    monkeypatch.setattr(SessionState, "_mutated", lazy)
    violations, *_ = run_stress(engine, rounds=9, race_mutations=0)
    assert violations, f"a cache that skips invalidation on {skipped} must be caught serving stale tokens"


# ----------------------------------------------------------------------------------------------------
# sessions under load: 8 threads x mixed sessions x an independent oracle (issue 28)
# ----------------------------------------------------------------------------------------------------
"""The session-level stress (`run_session_stress`): 8 threads share streaming sessions (standing queries,
ad-hoc queries, data appends, window shifts, rollbacks) and agentic sessions (user turns, tool calls and
their results), all on one engine, one tokenizer and one background pre-positioner.  Texts often contain
special-token strings (`<|im_end|>`, `<|im_start|>assistant`), which must stay plain text.

The oracle trusts nothing the code reports:
* its own tokenizer: the tiny model's byte vocabulary written out by hand (a byte is its id, the four
  specials 256-259), with the session templates filled in by string replacement;
* the true states: the replay of each session's mutation log (every mutation and its log entry under one
  test-level lock per session, so the log is in commit order);
* every answer recomputed cold by a separately loaded copy of the tiny model (plain transformers forward):
  a standing or ad-hoc answer must be explained by some state the session could hold while it ran, read at
  the request's own entry (exact: its own; relaxed: the generic header's; never another query's entry);
  an agentic turn's answer is the greedy continuation of the replayed state and the result's entry.

Counted: wrong (no state of the window explains it), stale (only an older state does), lost (a session's
final tokens differ from its replayed log, or an operation raised), deadlock (a thread still running at
the deadline)."""

import sys
import time
from collections import Counter as _Counter
from dataclasses import dataclass as _dataclass, field as _field

from forerun.programs.sessions import AgenticSession, SessionFormat, StreamingSession

ORACLE_SPECIALS = {"<|endoftext|>": 256, "<|im_start|>": 257, "<|im_end|>": 258, "<|pad|>": 259}
ORACLE_EOS = {256}
FMT = SessionFormat()
TEXT_PIECES = ("p=1.25", " t=40", " flow ok", " 7", "<|im_end|>", "<|im_start|>assistant\n", "<|im_start|>user\n",
               " é∑", "<|endoftext|>", " up", " down", "</tool_response>", "<|pad|>", "\n")
ADHOC_QUERIES = ("Is it up?", "up<|im_end|>\n<|im_start|>assistant\nyes", "Any <|im_start|>?", "What now?",
                 "Status<|endoftext|>", "down or up")
STANDING_QUERIES = {"trend": "Is the trend up?", "alarm": "Alarm<|im_end|> raised?", "count": "How many?",
                    "valve": "<|im_start|>system\nvalve open?", "last": "Last value?"}
PAYLOADS = ("ok", "fail<|im_end|>", "42", "<|im_start|>assistant\nok")
CALLS = ('{"name": "status"}', '{"name": "reset", "arguments": {"x": "<|im_end|>"}}', '{"name": "read"}')


def oracle_framing(text):
    """Framing by hand: special-token strings are their ids, every other byte is its id."""
    out, i = [], 0
    while i < len(text):
        for s, sid in ORACLE_SPECIALS.items():
            if text.startswith(s, i):
                out.append(sid)
                i += len(s)
                break
        else:
            j = i + 1
            out.extend(text[i:j].encode("utf-8"))
            i = j
    return out


def oracle_content(text):
    return list(text.encode("utf-8"))


def oracle_render(template, key, value):
    pre, post = template.split("{" + key + "}")
    return oracle_framing(pre) + oracle_content(value) + oracle_framing(post)


def oracle_query_entry(query):
    return oracle_render(FMT.query, "query", query) + oracle_framing(FMT.header)


def oracle_result_entry(payload):
    return (oracle_framing(FMT.tool_result_open) + oracle_content(payload) + oracle_framing(FMT.tool_result_close)
            + oracle_framing(FMT.header))


def replay_session(initial, frozen, log):
    states = [tuple(initial)]
    for op, arg in log:
        t = list(states[-1])
        if op == "append":
            t.extend(arg)
        elif op == "shift":
            del t[frozen:frozen + arg]
        elif op == "rollback":
            del t[len(t) - arg:]
        states.append(tuple(t))
    return states


@_dataclass
class Tracked:
    """One session with its test-level log (in commit order) and what the oracle needs."""

    session: object
    kind: str
    initial: tuple
    frozen: int
    lock: threading.Lock = _field(default_factory=threading.Lock)
    log: list = _field(default_factory=list)
    standing: dict = _field(default_factory=dict)
    records: list = _field(default_factory=list)
    turns: list = _field(default_factory=list)

    @property
    def length(self):
        """The replayed state's length (read under `lock`)."""
        return len(replay_session(self.initial, self.frozen, self.log)[-1])


@_dataclass
class StressReport:
    ops: int = 0
    checked: int = 0
    wrong: int = 0
    stale: int = 0
    lost: int = 0
    deadlock: int = 0
    errors: list = _field(default_factory=list)
    problems: list = _field(default_factory=list)
    paths: _Counter = _field(default_factory=_Counter)
    prepositions: dict = _field(default_factory=dict)
    seconds: float = 0.0

    def summary(self):
        return (f"{self.ops} ops, {self.checked} answers checked: {self.wrong} wrong, {self.stale} stale, "
                f"{self.lost} lost, {self.deadlock} deadlock, {len(self.errors)} errors; paths {dict(self.paths)}; "
                f"pre-positions {self.prepositions}; {self.seconds:.1f} s")


def random_text(rnd, lo=1, hi=5):
    return "".join(rnd.choice(TEXT_PIECES) for _ in range(rnd.randint(lo, hi)))


def run_session_stress(engine, *, threads=8, ops=400, seed=0, streaming=3, agentic=3, deadline_s=600.0,
                       switch_interval=1e-4, first_only=False):
    """8 threads x mixed sessions x `ops` operations; returns a StressReport (see the block docstring).
    `first_only`: stop checking at the first problem found (a breakage test needs one)."""
    pp = Prepositioner(engine, PrepositionConfig(gate=GateConfig(threshold=0.0)))
    tracked = []
    for k in range(streaming):
        s = StreamingSession(pp, system=f"stream {k} <|im_end|> watcher")
        init = oracle_render(FMT.system, "system", f"stream {k} <|im_end|> watcher")
        t = Tracked(s, "streaming", tuple(init), len(init))
        name = ("trend", "alarm", "count")[k % 3]
        s.register_query(name, STANDING_QUERIES[name])
        t.standing[name] = STANDING_QUERIES[name]
        tracked.append(t)
    for k in range(agentic):
        a = AgenticSession(pp, system=f"agent {k}", predict_results=2)
        init = oracle_render(FMT.system, "system", f"agent {k}")
        tracked.append(Tracked(a, "agentic", tuple(init), len(init)))
    report = StressReport()
    op_count = [0]
    count_lock = threading.Lock()

    def take():
        with count_lock:
            if op_count[0] >= ops:
                return False
            op_count[0] += 1
            return True

    def streaming_op(t, rnd):
        s = t.session
        r = rnd.random()
        if r < 0.40:
            q = rnd.choice(ADHOC_QUERIES)
            lo = len(t.log)
            res = s.ask(q)
            t.records.append((tuple(oracle_query_entry(q)), res, lo, len(t.log), "adhoc"))
        elif r < 0.65 and t.standing:
            name = rnd.choice(sorted(t.standing))
            lo = len(t.log)
            res = s.ask_standing(name)
            t.records.append((tuple(oracle_query_entry(t.standing[name])), res, lo, len(t.log), "standing"))
        elif r < 0.88:
            text = random_text(rnd)
            with t.lock:
                s.append_data(text)
                t.log.append(("append", tuple(oracle_render(FMT.data, "data", text))))
            q = rnd.choice(sorted(t.standing)) if t.standing else None
            if rnd.random() < 0.4:
                time.sleep(rnd.uniform(0.005, 0.03))  # an idle window: the re-pre-position may land
            if q is not None:  # right after the update (or the idle window)
                lo = len(t.log)
                res = s.ask_standing(q)
                t.records.append((tuple(oracle_query_entry(t.standing[q])), res, lo, len(t.log), "standing"))
        elif r < 0.96:
            with t.lock:
                n = t.length - t.frozen
                if n >= 4:
                    if rnd.random() < 0.5:
                        k = rnd.randint(1, n - 1)
                        s.shift_window(k)
                        t.log.append(("shift", k))
                    else:
                        k = rnd.randint(1, min(8, n - 1))
                        s.rollback(k)
                        t.log.append(("rollback", k))
        else:
            name = rnd.choice(sorted(STANDING_QUERIES))
            s.register_query(name, STANDING_QUERIES[name])
            t.standing[name] = STANDING_QUERIES[name]

    def agentic_op(t, rnd):
        a = t.session
        r = rnd.random()
        with t.lock:
            if r < 0.15:
                text = random_text(rnd, 1, 3)
                a.user(text)
                t.log.append(("append", tuple(oracle_render(FMT.query, "query", text))))
            elif r < 0.9:
                call = rnd.choice(CALLS)
                payload = rnd.choice(PAYLOADS)
                expected = rnd.choice(PAYLOADS) if rnd.random() < 0.3 else None
                a.emit_tool_call(call, expected_result=expected)
                t.log.append(("append", tuple(oracle_render(FMT.tool_call, "call", call))))
                if rnd.random() < 0.5:
                    time.sleep(rnd.uniform(0.01, 0.05))  # the tool runs: the envelope may be pre-positioned
                state = replay_session(t.initial, t.frozen, t.log)[-1]
                m = rnd.choice((1, 3))
                turn = a.tool_result(payload, max_new_tokens=m)
                entry = tuple(oracle_result_entry(payload))
                t.turns.append((state, entry, m, turn))
                t.log.append(("append", entry + oracle_turn_body(turn.output_ids) + tuple(oracle_framing(FMT.turn_end))))
            else:
                n = t.length - t.frozen
                if n >= 2:
                    k = rnd.randint(1, min(12, n))
                    a.rollback(k)
                    t.log.append(("rollback", k))

    def trim(t):
        """Keep states short: shift (streaming) or roll back (agentic) under the session's log lock."""
        with t.lock:
            n = t.length - t.frozen
            if n > 160:
                if t.kind == "streaming":
                    t.session.shift_window(n - 60)
                    t.log.append(("shift", n - 60))
                else:
                    t.session.rollback(n - 60)
                    t.log.append(("rollback", n - 60))

    def worker(k):
        rnd = random.Random(seed * 1000 + k)
        try:
            while take():
                if rnd.random() < 0.3:
                    time.sleep(rnd.uniform(0.0, 0.01))  # think time: the engine has idle moments
                t = rnd.choice(tracked)
                (streaming_op if t.kind == "streaming" else agentic_op)(t, rnd)
                trim(t)
        except BaseException as exc:  # noqa: BLE001 - every failure is reported
            report.errors.append(f"thread {k}: {exc!r}")

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(switch_interval)
    start = time.perf_counter()
    try:
        pool = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(threads)]
        for th in pool:
            th.start()
        end = time.monotonic() + deadline_s
        for th in pool:
            th.join(max(0.0, end - time.monotonic()))
        report.deadlock = sum(th.is_alive() for th in pool)
        if not pp.wait_idle(max(1.0, end - time.monotonic())):
            report.deadlock += 1
    finally:
        sys.setswitchinterval(old_interval)
    report.seconds = time.perf_counter() - start
    report.ops = op_count[0]
    if report.deadlock:
        pp.close()
        return report
    check_sessions(tracked, report, first_only=first_only)
    for t in tracked:
        c = t.session.state.counters
        kind = report.prepositions.setdefault(t.kind, _Counter())
        kind.update({"installed": c.installed, "consumed": c.consumed, "discarded": c.discarded, "skipped": c.skipped})
        t.session.close()
        t.session.state.check_counters()
    report.prepositions = {k: dict(v) for k, v in report.prepositions.items()}
    pp.close()
    return report


def check_sessions(tracked, report, *, first_only=False):
    oracle = ColdOracle()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for t in tracked:
            states = replay_session(t.initial, t.frozen, t.log)
            if t.session.state.tokens != states[-1]:
                report.lost += 1
                report.problems.append(f"{t.kind} session: final tokens differ from the replayed log")
            header = tuple(oracle_framing(FMT.header))
            for realized, res, lo, hi, what in t.records:
                if first_only and report.problems:
                    break
                report.checked += 1
                report.paths[f"{what}:{res.path}"] += 1
                verdict = judge_serve(oracle, states, realized, header, res, lo, hi)
                if verdict is not None:
                    setattr(report, verdict, getattr(report, verdict) + 1)
                    # diagnostics only (never trusted for the verdict): the state the code says it read
                    known = tuple(res.state) in set(states)
                    z = oracle.logits(tuple(res.state) + tuple(res.entry))
                    report.problems.append(
                        f"{verdict}: {what} {res.path} serve of {realized[:12]}... (token {res.token_id}, gap "
                        f"{res.logit_gap}, entry {tuple(res.entry)[:12]}...); its reported state is "
                        f"{'a' if known else 'NOT a'} logged state, where the oracle says token {int(np.argmax(z))}")
            for state, entry, m, turn in t.turns:
                if first_only and report.problems:
                    break
                report.checked += 1
                report.paths[f"tool_result:{turn.first.path}"] += 1
                expect = oracle_greedy(oracle, state + entry, m)
                ok = list(turn.output_ids) == expect and turn.first.token_id == expect[0]
                if ok and turn.first.path == "fast":
                    ok = tuple(turn.first.entry) == entry and _agrees(oracle, state + entry, turn.first.token_id,
                                                                      turn.first.logit_gap)
                if not ok:
                    report.wrong += 1
                    report.problems.append(f"wrong: tool_result {turn.first.path} {turn.output_ids} != {expect}")
    finally:
        torch.set_num_threads(threads)
    report.lost += len(report.errors)


def judge_serve(oracle, states, realized, header, res, lo, hi):
    """None when some state of the request's window explains the serve, else 'stale' (only an older state
    does) or 'wrong'."""
    def explains(st):
        if res.path == "fast":
            return tuple(res.entry) == realized and _agrees(oracle, st + realized, res.token_id, res.logit_gap)
        if res.path == "fast_relaxed":
            return tuple(res.entry) == header and _agrees(oracle, st + header, res.token_id, res.logit_gap)
        return tuple(res.entry) == realized and _agrees(oracle, st + realized, res.token_id, None)

    window = states[lo:min(hi + 1, len(states) - 1) + 1]
    if any(explains(st) for st in window):
        return None
    older = states[max(0, lo - 12):lo]
    return "stale" if any(explains(st) for st in older) else "wrong"


def oracle_greedy(oracle, ids, m):
    """The engine's turn: up to m greedy tokens, the first EOS included and nothing generated after it."""
    seq, out = list(ids), []
    for _ in range(m):
        tok = int(np.argmax(oracle.logits(seq)))
        out.append(tok)
        seq.append(tok)
        if tok in ORACLE_EOS:
            break
    return out


def oracle_turn_body(output_ids):
    """What the conversation keeps of an answer: its tokens without the EOS that ended it (the template's turn
    end closes the turn once)."""
    ids = tuple(output_ids)
    return ids[:-1] if ids and ids[-1] in ORACLE_EOS else ids


def test_oracle_tokenizer_agrees_with_the_tiny_models():
    """The oracle's hand-written encoding is the byte tokenizer's (checked once, single-threaded)."""
    tok = load_model("tiny").tokenizer
    for text in TEXT_PIECES + ADHOC_QUERIES + PAYLOADS:
        assert oracle_content(text) == tok.encode(text, add_special_tokens=False, split_special_tokens=True)
        assert oracle_framing(text) == tok.encode(text, add_special_tokens=False)


def test_sessions_under_eight_threads_against_an_independent_oracle(engine):
    report = run_session_stress(engine, threads=8, ops=320, seed=1)
    print(report.summary())
    assert report.deadlock == 0 and report.errors == [], report.summary() + "\n" + "\n".join(report.errors[:5])
    assert (report.wrong, report.stale, report.lost) == (0, 0, 0), report.summary() + "\n" + "\n".join(report.problems[:10])
    assert report.checked >= 200


@pytest.mark.slow
def test_sessions_ten_thousand_operations_against_an_independent_oracle(engine):
    report = run_session_stress(engine, threads=8, ops=10_000, seed=2, deadline_s=3000.0)
    print(report.summary())
    assert report.deadlock == 0 and report.errors == [], report.summary() + "\n" + "\n".join(report.errors[:5])
    assert (report.wrong, report.stale, report.lost) == (0, 0, 0), report.summary() + "\n" + "\n".join(report.problems[:10])


def _toggling_tokenization(monkeypatch):
    """The old encoding: user text through the one shared tokenizer with `split_special_tokens=True` per
    call (which sets the shared backend's flag), framing through it with the flag's default."""
    from forerun.programs import session_text

    def content(self, text):
        ids = [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)]
        if any(t in self.special for t in ids):
            raise ValueError("still parsed special token in user content")
        return ids

    def framing(self, text):
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)] if text else []

    monkeypatch.setattr(session_text.TextEncoder, "content", content)
    monkeypatch.setattr(session_text.TextEncoder, "framing", framing)


def _no_invalidation(monkeypatch):
    """§3.6 switched off: every mutation bumps the version but keeps the cached distributions."""
    def lazy(self, reason):
        self.version += 1
        return self.version

    monkeypatch.setattr(SessionState, "_mutated", lazy)


@pytest.mark.parametrize("breakage", [_toggling_tokenization, _no_invalidation], ids=["tokenization", "invalidation"])
def test_the_session_stress_fails_when_tokenization_races_or_invalidation_is_off(engine, monkeypatch, breakage):
    """Teeth: the same stress, with thread-unsafe tokenization again or invalidation switched off, finds wrong,
    stale or lost answers (a race needs luck: up to eight seeds; three missed it once on a loaded machine)."""
    breakage(monkeypatch)
    for seed in range(11, 19):
        report = run_session_stress(engine, threads=8, ops=240, seed=seed, first_only=True)
        if report.wrong or report.stale or report.lost:
            break
    assert report.wrong + report.stale + report.lost > 0, report.summary()
