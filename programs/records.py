"""Per-call records of the power samplers: the benchmark's timings and the certainty classifier's data.

One `CallRecord` per model call (wall time of the program run, requests issued, transitions realized) and,
inside it, one `NodeRecord` per scored node of that call's prefetched subtree (a sequential call is a
subtree with one scored node).  `RecordWriter` appends them as JSONL, one line per scored node (the
classifier's training format) or per call.

    paper                              code (NodeRecord field)
    v+ (heap index of the proposal)    node_id
    d(v) (transition offset in round)  depth
    c_j                                cut
    c_v = κ(v) of the parent           parent_cut
    c_j / T                            cut_fraction
    accepts on the root→v path         accepts_on_path
    A(v+, v)                           accept_prob
    ε-class (ε = 0.01)                 certainty_class ∈ {"reject", "accept", "uncertain"}
    on the realized MH path            realized
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable


@dataclass(frozen=True)
class NodeRecord:
    prompt_id: str
    sampler: str
    block: int
    call_index: int
    node_id: int
    depth: int
    transition: int
    """Index j of the MH transition this node decides, within its block."""
    cut: int
    parent_cut: int
    cut_fraction: float
    accepts_on_path: int
    accept_prob: float
    log_accept: float
    certainty_class: str
    realized: bool
    accepted: bool | None
    """The MH decision if realized, else None."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CallRecord:
    prompt_id: str
    sampler: str
    call_index: int
    kind: str
    """"mh" for a proposal call, "extend" for a block extension (not counted in the MH metrics)."""
    block: int
    wall_time: float
    requests: int
    """Distinct engine requests in the call (MultiTryMH: candidates + references; identical requests of
    nodes that share a transition's inputs are generated once)."""
    decisions: int
    """Prefetched decisions (scored nodes) in the call."""
    transitions: int
    """MH transitions realized from this call."""
    nodes: tuple[NodeRecord, ...] = field(default_factory=tuple)

    def to_json(self, with_nodes: bool = True) -> dict[str, Any]:
        out = asdict(self)
        if not with_nodes:
            out.pop("nodes")
        else:
            out["nodes"] = [n.to_json() for n in self.nodes]
        return out


class RecordWriter:
    """Append-only JSONL writer: one line per scored node (`NodeRecord.to_json`); with `model`, each line
    also carries a "model" field (the model that produced it)."""

    def __init__(self, path: str | os.PathLike[str], *, model: str | None = None) -> None:
        self.path = Path(path)
        self.model = model
        if self.path.exists() and self.path.is_dir():
            raise ValueError(f"records path is a directory: {self.path}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def write_calls(self, calls: Iterable[CallRecord]) -> int:
        stamp = {} if self.model is None else {"model": self.model}
        lines = [json.dumps({**node.to_json(), **stamp}) for call in calls for node in call.nodes]
        with self._lock, self.path.open("a", encoding="utf-8") as fh:
            fh.write("".join(line + "\n" for line in lines))  # one write: an interrupt leaves whole lines
        return len(lines)


def read_node_records(path: str | os.PathLike[str]) -> list[NodeRecord]:
    """Read node records back (malformed line -> ValueError naming file and line)."""
    out = []
    with Path(path).open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                obj.pop("model", None)  # stamped by RecordWriter(model=...), not a NodeRecord field
                out.append(NodeRecord(**obj))
            except (json.JSONDecodeError, TypeError, AttributeError) as exc:
                raise ValueError(f"{path}:{lineno}: malformed node record ({exc})") from exc
    return out
