"""Per-call records of the power samplers: the benchmark's timings and the certainty classifier's data.

One `CallRecord` per model call (wall time of the program run, nodes scored, distinct requests, requests
and tokens generated, transitions realized) and, inside it, one `NodeRecord` per scored node of that
call's prefetched subtree (a sequential call is a subtree with one scored node).  This module owns the one node-record schema: `RecordWriter` appends
records as JSONL, one line per scored node (stamped with the model's name), and `read_node_records` reads
them back for the classifier, with errors that name the file and line (a torn line, from a write cut short, is
skipped with a warning that names them).

    paper                              code (NodeRecord field)
    v+ (heap index of the proposal)    node_id
    d(v) (transition offset in round)  depth
    j (transition within the block)    transition
    c_j                                cut
    c_v = κ(v) of the parent           parent_cut
    c_j / T                            cut_fraction
    accepts on the root→v path         accepts_on_path
    A(v+, v), log A                    accept_prob, log_accept
    ε-class (ε = 0.01)                 certainty_class ∈ acceptance.CLASSES
    on the realized MH path            realized (and the decision there: accepted)
    Features 3/4 (root state at c_j)   extra: logq_at_cut, ..., entropy_suffix_mean (`cut_statistics`)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
import threading
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from .acceptance import CLASSES, epsilon_class


class RecordError(ValueError):
    """A malformed node record; the message names the file and line."""


MAX_LINE_CHARS = 1 << 20
"""Longest line `read_node_records` reads (a node record is about 1 KB)."""


@dataclass(frozen=True, kw_only=True)
class NodeRecord:
    """One scored node of a prefetched subtree (one JSONL line).  Fields with a default are written by the
    samplers but optional when reading (hand-made or older lines)."""

    prompt_id: str
    """Prompt the chain belongs to (the cross-validation group)."""
    sampler: str | None = None
    """Sampler that scored the node, e.g. "presto-power-mh"."""
    model: str | None = None
    """Model the chain ran on (stamped by `RecordWriter(path, model=...)`)."""
    traversal: str | None = None
    """PreSTO traversal that prefetched the node's call ("bfs", "predictive"; None: sequential or older lines):
    one `bench presto` run records each traversal's calls under the same prompt and call numbers."""
    block: int | None = None
    """Block ℓ (1-based) of the blockwise sampler."""
    call_index: int
    """Index of the batched model call (prefetch round) within the prompt's run."""
    node_id: int
    """Heap index of the proposal v+ = 2i+1 in the call's prefetched subtree (the expanded node v = i is
    its parent)."""
    depth: int
    """d(v): depth of the expanded node v (transition offset within the round)."""
    transition: int | None = None
    """Index j of the MH transition this node decides, within its block."""
    cut: int
    """c_j: cut index of the request at the acceptance child v+."""
    parent_cut: int
    """c_i: cut index (known cut κ) of v itself."""
    cut_fraction: float
    """c_j / T in [0, 1] (Feature 1)."""
    accepts_on_path: int
    """Number of acceptance edges on the path from the root to v."""
    accept_prob: float
    """A(v+, v), realized after scoring."""
    log_accept: float | None = None
    """log A (−inf when A = 0)."""
    certainty_class: str
    """"reject" | "accept" | "uncertain" (the classifier's label)."""
    realized: bool
    """Whether the MH walk of the call visited v."""
    accepted: bool | None = None
    """The MH decision if realized, else None."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Any further fields of a line (e.g. likelihood statistics), usable as classifier features by name."""

    def __post_init__(self) -> None:
        if self.certainty_class not in CLASSES:
            raise ValueError(f"certainty_class must be one of {list(CLASSES)}, got {self.certainty_class!r}")
        if not 0.0 <= self.cut_fraction <= 1.0:
            raise ValueError(f"cut_fraction must lie in [0, 1], got {self.cut_fraction!r}")
        if not 0.0 <= self.accept_prob <= 1.0:
            raise ValueError(f"accept_prob must lie in [0, 1], got {self.accept_prob!r}")
        for name in ("call_index", "node_id", "depth", "cut", "parent_cut", "accepts_on_path"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be non-negative, got {getattr(self, name)!r}")
        clash = sorted(set(self.extra) & _SCHEMA)
        if clash:
            raise ValueError(f"extra fields {clash} are schema fields; set them as fields")

    def values(self) -> dict[str, Any]:
        """Every field that has a value, extra fields flattened in (what a classifier feature may read)."""
        out = {k: v for k in _FIELDS if (v := getattr(self, k)) is not None}
        out.update(self.extra)
        return out

    def to_json(self) -> dict[str, Any]:
        """The JSONL object of this record (extra fields flattened in)."""
        out = asdict(self)
        out.update(out.pop("extra"))
        return out


# name -> (kind, required); every schema field except `extra`
_FIELDS: dict[str, tuple[str, bool]] = {
    "prompt_id": ("id", True), "sampler": ("str", False), "model": ("str", False), "traversal": ("str", False),
    "block": ("int", False),
    "call_index": ("int", True), "node_id": ("int", True), "depth": ("int", True), "transition": ("int", False),
    "cut": ("int", True), "parent_cut": ("int", True), "cut_fraction": ("float", True),
    "accepts_on_path": ("int", True), "accept_prob": ("float", True), "log_accept": ("logprob", False),
    "certainty_class": ("class", True), "realized": ("bool", True), "accepted": ("bool", False),
}
_SCHEMA = frozenset(_FIELDS) | {"extra"}
assert _SCHEMA == {f.name for f in dataclasses.fields(NodeRecord)}


def _convert(name: str, kind: str, value: Any) -> Any:
    if kind in ("id", "str"):
        ok = isinstance(value, str) or (kind == "id" and isinstance(value, int) and not isinstance(value, bool))
        if not ok:
            raise ValueError(f"field {name!r} must be a string{' or integer' if kind == 'id' else ''}, got {value!r}")
        return str(value)
    if kind == "int":
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"field {name!r} must be an integer, got {value!r}")
        return value
    if kind in ("float", "logprob"):
        number = not isinstance(value, bool) and isinstance(value, (int, float))
        if kind == "float" and not (number and math.isfinite(value)):
            raise ValueError(f"field {name!r} must be a finite number, got {value!r}")
        if kind == "logprob" and not (number and value <= 0.0):
            raise ValueError(f"field {name!r} must be a log-probability (<= 0, -inf allowed), got {value!r}")
        return float(value)
    if kind == "bool":
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise ValueError(f"field {name!r} must be true/false, got {value!r}")
    if value not in CLASSES:  # "class"
        raise ValueError(f"field {name!r} must be one of {list(CLASSES)}, got {value!r}")
    return value


def parse_node_record(obj: Any, *, epsilon: float | None = None) -> NodeRecord:
    """A NodeRecord from one decoded JSON object.

    With ``epsilon`` given, the label is recomputed from ``accept_prob`` (the recorded
    ``certainty_class`` is then optional and ignored); otherwise the recorded class is the label.
    """
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    data = dict(obj)
    if epsilon is not None and "accept_prob" in data:
        data["certainty_class"] = epsilon_class(_convert("accept_prob", "float", data["accept_prob"]), epsilon)
    missing = [k for k, (_, required) in _FIELDS.items() if required and k not in data]
    if missing:
        raise ValueError(f"missing field(s) {', '.join(missing)}")
    values = {k: _convert(k, kind, data.pop(k)) for k, (kind, required) in _FIELDS.items()
              if k in data and (required or data[k] is not None)}
    data = {k: v for k, v in data.items() if k not in _FIELDS}  # optional fields written as null
    return NodeRecord(**values, extra=data)


def read_node_records(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]], *,
                      epsilon: float | None = None, warn: Callable[[str], object] | None = None) -> list[NodeRecord]:
    """Node records from one or more JSONL files; blank lines are skipped, and so are torn lines (`_torn`: a write
    cut short by a kill or a full disk), each with one call of `warn` naming the file and line (None:
    `warnings.warn`).

    Any other malformed line raises RecordError naming the file and the 1-based line number.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    records: list[NodeRecord] = []
    for path in map(Path, paths):
        try:
            handle = path.open("r", encoding="utf-8")
        except OSError as exc:
            raise RecordError(f"{path}: cannot read records file ({exc.strerror or exc})") from exc
        def skip(lineno: int) -> None:
            (warn or warnings.warn)(f"{path}:{lineno}: skipped a torn line (a write cut short by a kill or a full "
                                    "disk)")

        pending: tuple[int, RecordError] | None = None  # a terminated torn-looking line: torn if more lines follow
        with handle:
            for lineno, line in enumerate(iter(lambda: handle.readline(MAX_LINE_CHARS + 1), ""), start=1):
                if len(line) > MAX_LINE_CHARS:  # /dev/zero or a file with no newlines: never read whole
                    raise RecordError(f"{path}:{lineno}: a line longer than {MAX_LINE_CHARS >> 20} Mi characters, "
                                      "not a node record (one is about 1 KB)")
                if not line.strip():
                    continue
                if pending is not None:
                    skip(pending[0])
                    pending = None
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    bad = RecordError(f"{path}:{lineno}: not valid JSON ({exc.msg})")
                    if not line.endswith("\n"):  # the file's unterminated last line
                        skip(lineno)
                        continue
                    if _torn(line):
                        pending = (lineno, bad)
                        continue
                    raise bad from exc
                except RecursionError:
                    raise RecordError(f"{path}:{lineno}: not a node record (JSON nested too deeply)") from None
                try:
                    records.append(parse_node_record(obj, epsilon=epsilon))
                except ValueError as exc:
                    raise RecordError(f"{path}:{lineno}: {exc}") from exc
        if pending is not None:  # the last line, terminated: a malformed record, not a write cut short
            raise pending[1]
    return records


_LINE_START = '{"' + dataclasses.fields(NodeRecord)[0].name + '": '
"""How every line `RecordWriter` writes begins (`NodeRecord.to_json`'s first key)."""


def _torn(line: str) -> bool:
    """Whether a terminated line that is not valid JSON looks torn: it begins as the writer's lines do, or is cut
    inside that beginning.  It is skipped only when more lines follow it (`read_node_records`): the shape
    `RecordWriter` leaves when it appends after a torn last line (a new line first, so its records stay whole).
    The file's unterminated last line is torn whatever it holds (as the run-file reader takes it,
    `eval.harness.runs`); any other line that is not JSON is an error."""
    text = line.strip()
    return text.startswith(_LINE_START) or _LINE_START.startswith(text)


@dataclass(frozen=True)
class CallRecord:
    """One model call (or one prefetch round served from earlier calls) of a chain."""

    prompt_id: str
    sampler: str
    call_index: int
    kind: str
    """"mh": a proposal call; "extend": a block extension (not counted in the MH metrics); "reuse": a PreSTO
    round whose every request was generated in an earlier round of the chain (no model call)."""
    block: int
    wall_time: float
    nodes_scored: int
    """Scored nodes (prefetched decisions) of the round; the paper's N_pf counts these."""
    distinct_requests: int
    """Distinct suffix requests the scored nodes use (nodes of one depth share one request; MultiTryMH:
    candidates + references), including those served from the chain's suffix cache."""
    generated_requests: int
    """Distinct requests the engine generated in this call (distinct_requests minus reused ones)."""
    generated_tokens: int
    """Tokens the engine generated in this call (Σ of T − c over the generated requests)."""
    transitions: int
    """MH transitions realized from this call."""
    speculation_misses: int = 0
    """EntropyCut proposals requested below an acceptance whose node's own cut, once its state was
    generated, differed from the root's (not scored; the walk defers there)."""
    decode_steps: int = 0
    """Engine decode steps of the call (sequential and round-based: its longest request's length; streaming:
    the steps observed in the window).  With `row_steps` it feeds the cost model time ≈ a·steps + b·row_steps."""
    row_steps: int = 0
    """Σ over the decode steps of the rows decoding (= tokens generated by the call's rows)."""
    rows_started: int = 0
    """Streaming: rows started in the window."""
    rows_aborted: int = 0
    """Streaming: rows aborted in the window (their node became unreachable, or preempted by the walk)."""
    wasted_tokens: int = 0
    """Streaming: tokens of rows started in the window that the walk never used."""
    max_rows: int = 0
    """Streaming: most rows running at once in the window (at most N_pf, or the walk's own 2M − 1)."""
    nodes: tuple[NodeRecord, ...] = field(default_factory=tuple)

    @property
    def reused_requests(self) -> int:
        """Requests served from the chain's suffix cache instead of being generated again."""
        return self.distinct_requests - self.generated_requests

    def to_json(self, with_nodes: bool = True) -> dict[str, Any]:
        out = asdict(self)
        out["reused_requests"] = self.reused_requests
        if not with_nodes:
            out.pop("nodes")
        else:
            out["nodes"] = [n.to_json() for n in self.nodes]
        return out


class RecordWriter:
    """Append-only JSONL writer: one line per scored node (`NodeRecord.to_json`), each stamped with
    `model` when it is given.  Each `write_*` call appends whole lines in one write and flushes them before it
    returns, so writing each call's nodes as the call finishes (`BlockwiseSampler.run(on_call=...)`) leaves
    every finished call in the file when the run is interrupted or fails.  A file whose last line is torn (a kill or a
    full disk mid-write) gets the new lines after a newline: glued to the torn line, the first would be lost too."""

    def __init__(self, path: str | os.PathLike[str], *, model: str | None = None) -> None:
        self.path = Path(path)
        self.model = model
        if self.path.exists() and self.path.is_dir():
            raise ValueError(f"records path is a directory: {self.path}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def write_calls(self, calls: Iterable[CallRecord]) -> int:
        """Append the scored nodes of `calls`; returns the number of lines written."""
        return self.write_nodes(node for call in calls for node in call.nodes)

    def write_nodes(self, nodes: Iterable[NodeRecord]) -> int:
        """Append `nodes`; returns the number of lines written."""
        stamp = (lambda n: n) if self.model is None else (lambda n: dataclasses.replace(n, model=self.model))
        lines = [json.dumps(stamp(node).to_json()) for node in nodes]
        try:
            with self._lock, self.path.open("a", encoding="utf-8") as fh:
                torn = "\n" if lines and _ends_torn(self.path) else ""
                fh.write(torn + "".join(line + "\n" for line in lines))  # one write: an interrupt leaves whole lines
                fh.flush()
        except OSError as exc:  # a full disk (or /dev/full): the error names the file
            raise OSError(exc.errno, exc.strerror, str(self.path)) from exc
        return len(lines)


def _ends_torn(path: Path) -> bool:
    """True when `path` is a non-empty regular file whose last byte is not a newline."""
    try:
        with path.open("rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode) or not fh.seek(0, os.SEEK_END):
                return False
            fh.seek(-1, os.SEEK_END)
            return fh.read(1) != b"\n"
    except OSError:
        return False
