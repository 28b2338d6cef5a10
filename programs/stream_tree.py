"""The tree of future MH decisions as streaming PreSTO sees it: states that are still being generated.

Below the realized state x^(k) every node v at depth d decides transition k + d.  Its state is x^(k) or a
*proposal*: its parent's state up to the cut c, then the suffix of the proposal's rows - rows that may still
be decoding.  The round-based tree (`prefetch_tree`) can only use positions [0, κ(v)) of a node's state,
the root's (Condition 1); here a position of a proposal is known as soon as its row has decoded it, so the
request of transition j at cut c′ is *feasible* the moment its prefix x_{0:c′} is known (`StateRef.tokens`),
even while its parent's row is still running.  A kernel whose cut depends on the state (EntropyCut) knows
its cut only once the node's state is complete; MultiTryMH's proposal (the selected candidate) is known only
once all its candidates are.

    paper / notion                             code
    x^(k) (the realized state)                 StateRef.root(state)
    (x_{0:c}, y_{c:T}), y still decoding       StateRef(parent, cut, transition, requests)
    x_{0:c′} of a node's state (or unknown)    StateRef.tokens(c′, ...); what is known of it: .known(c′, ...)
    the row whose KV a child can share         StateRef.source(c′, ...)
    d(v), κ(v), accepts on the path            TreeNode.depth, .known_cut, .accepts
    ĥ(v+; ε) (Eq. 14)                          hhat(node) -> float (predictive rule)
    P(the walk reaches v)                      TreeNode.reach: Π ĥ over accept edges, Π (1 − ĥ) over rejects
    the decisions from x^(k) to v              TreeNode.path (True: accept)
    traversal order                            best first by reach (ĥ: the classifier's, or the acceptance rate)
    rows worth their cost (streaming)          walk_tree(..., min_value=λ): P·(1 + ĥ·D) ≥ λ, D = the levels below
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Protocol

import numpy as np

from .transitions import ChainState, TransitionKernel
from .suffixes import Suffix, SuffixRequest
from .random_streams import DecisionStream


class StreamRow(Protocol):
    """What the tree reads of a row: its id, the tokens decoded so far, the suffix once complete."""

    rid: str
    ids: tuple[int, ...]
    suffix: Suffix | None


Rows = Mapping[SuffixRequest, StreamRow]


class StateRef:
    """The state of a tree node: complete (`state`), or a proposal on a parent state (see module docstring)."""

    __slots__ = ("parent", "cut", "transition", "requests", "state")

    def __init__(self, parent: "StateRef | None", cut: int, transition: int,
                 requests: tuple[SuffixRequest, ...] | None, state: ChainState | None = None) -> None:
        self.parent = parent
        self.cut = cut
        self.transition = transition
        self.requests = requests
        self.state = state

    @classmethod
    def root(cls, state: ChainState) -> "StateRef":
        return cls(None, state.length, -1, None, state)

    def complete(self, rows: Rows, kernel: TransitionKernel, stream: DecisionStream) -> ChainState | None:
        """The whole state once its rows are complete (the kernel's own proposal: `decide(...).proposal`)."""
        if self.state is not None:
            return self.state
        if self.parent is None or self.requests is None or self.cut < 0:
            return None
        parent = self.parent.complete(rows, kernel, stream)
        if parent is None:
            return None
        suffixes = []
        for r in self.requests:
            row = rows.get(r)
            if row is None or row.suffix is None:
                return None
            suffixes.append(row.suffix)
        self.state = kernel.decide(parent, self.cut, suffixes, self.transition, stream).proposal
        return self.state

    def tokens(self, upto: int, rows: Rows, kernel: TransitionKernel, stream: DecisionStream,
               waits: dict[str, int] | None = None) -> np.ndarray | None:
        """x_{0:upto} of this state, or None while a position is not decoded yet (then `waits[rid]` = the
        tokens the running row must have decoded for it to be known)."""
        if self.state is not None:
            return self.state.tokens[:upto]
        if self.parent is None or self.cut < 0:
            return None
        if upto <= self.cut:
            return self.parent.tokens(upto, rows, kernel, stream, waits)
        if self.requests is None:
            return None
        if len(self.requests) > 1:  # MultiTryMH: the proposal is the selected candidate, known once all are
            state = self.complete(rows, kernel, stream)
            return None if state is None else state.tokens[:upto]
        row = rows.get(self.requests[0])
        if row is None or len(row.ids) < upto - self.cut:
            if row is not None and waits is not None:
                waits[row.rid] = min(waits.get(row.rid, upto - self.cut), upto - self.cut)
            return None
        head = self.parent.tokens(self.cut, rows, kernel, stream, waits)
        if head is None:
            return None
        return np.concatenate([head, np.asarray(row.ids[: upto - self.cut], dtype=np.int64)])

    def known(self, upto: int, rows: Rows) -> np.ndarray:
        """The longest prefix of x_{0:upto} of this state that is known now (decoded or realized)."""
        if self.state is not None:
            return self.state.tokens[:upto]
        if self.parent is None or self.cut < 0:
            return np.zeros(0, dtype=np.int64)
        head = self.parent.known(min(upto, self.cut), rows)
        if upto <= self.cut or len(head) < self.cut or self.requests is None or len(self.requests) != 1:
            return head  # (MultiTryMH: the selected candidate is unknown until all are complete)
        row = rows.get(self.requests[0])
        if row is None:
            return head
        return np.concatenate([head, np.asarray(row.ids[: upto - self.cut], dtype=np.int64)])

    def source(self, upto: int, rows: Rows) -> str | None:
        """The rid of the row that decodes position upto − 1 of this state, if one does (KV to share)."""
        node: StateRef | None = self
        while node is not None and node.parent is not None and upto <= node.cut:
            node = node.parent
        if node is None or node.parent is None or node.requests is None or len(node.requests) != 1:
            return None
        row = rows.get(node.requests[0])
        return None if row is None else row.rid


@dataclass
class TreeNode:
    """A node v of the tree below the realized state, with its request once it is known."""

    depth: int
    transition: int
    """j = k + depth: the transition the node decides."""
    state: StateRef
    known_cut: int
    accepts: int
    reach: float
    heap: int
    path: tuple[bool, ...] = ()
    """The decisions from the realized state to this node (True: accept), transitions k .. k + depth − 1."""
    cut: int | None = None
    """c_j of the node's request (None: the state-dependent cut of an incomplete state)."""
    requests: tuple[SuffixRequest, ...] | None = None
    """The engine requests of the node's proposal, once its prefix x_{0:c_j} is known (feasible)."""


Expand = Callable[[TreeNode], None]
"""Fills node.cut and node.requests (when known)."""


def walk_tree(root: StateRef, first_transition: int, depth_cap: int, max_nodes: int, expand: Expand, *,
              hhat: Callable[[TreeNode], float], min_value: float = 0.0) -> Iterator[TreeNode]:
    """The first `max_nodes` nodes below the realized state `root` (which decides transition
    `first_transition`; depth < depth_cap) best first by the probability that the walk reaches the node, with
    ĥ = hhat(node) at every expanded node (so the reach of the nodes it yields never increases; a constant
    ĥ = 1/2 gives depth-by-depth order), each expanded (lazily: a consumer that has spent its budget stops early).

    A node is enumerated only when its value P·(1 + ĥ·D) is at least `min_value` (the root always is): P its
    reach, ĥ its parent's, D the levels below it (depth_cap − depth − 1).  What a row for the node saves is
    its own wait, P·L steps, plus the waits of the acceptance subtree that only its tokens make feasible,
    whose reach sums to about P·ĥ per level; the value falls along every path, so nothing below a node that
    fails is enumerated either.  Below a node whose cut is unknown the acceptance child's state is unknown:
    it is enumerated, never feasible."""
    if depth_cap < 1 or max_nodes < 1:
        return
    order = itertools.count()
    start = TreeNode(depth=0, transition=first_transition, state=root, known_cut=root.cut, accepts=0, reach=1.0, heap=0)
    frontier = [(-1.0, 0, next(order), start)]
    count = 0
    while frontier and count < max_nodes:
        node = heapq.heappop(frontier)[3]
        expand(node)
        count += 1
        yield node
        if node.depth + 1 >= depth_cap:
            continue
        h = float(hhat(node))
        for child in _children(node, h):
            if child.reach * (1.0 + h * (depth_cap - child.depth - 1)) >= min_value:
                heapq.heappush(frontier, (-child.reach, child.depth, next(order), child))


def _children(node: TreeNode, h: float) -> Iterator[TreeNode]:
    # an unknown cut gives an acceptance child whose state is unknown (cut -1, no rows): it keeps the shape of
    # the enumeration stable while the state it hangs below completes
    cut = -1 if node.cut is None else node.cut
    state = StateRef(node.state, cut, node.transition, node.requests if cut >= 0 else None)
    yield TreeNode(depth=node.depth + 1, transition=node.transition + 1, state=state,
                   known_cut=max(min(cut, node.known_cut), 0), accepts=node.accepts + 1, reach=node.reach * h,
                   heap=2 * node.heap + 1, path=node.path + (True,))
    yield TreeNode(depth=node.depth + 1, transition=node.transition + 1, state=node.state, known_cut=node.known_cut,
                   accepts=node.accepts, reach=node.reach * (1.0 - h), heap=2 * node.heap + 2, path=node.path + (False,))
