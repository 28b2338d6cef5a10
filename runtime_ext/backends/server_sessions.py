"""The prompt an SGLang server builds for a session request, mirrored on the client.

A non-streaming session request (`session_params={"id", "rid", "offset", "replace", "drop_previous_output"}`)
is not run on the ids it carries: `srt/session/session_controller.py` (`Session.create_req`) prepends the
history of the session request named by `rid` and strips a leading BOS from the new turn.  forerun's scoring
pass (log p0 of the generated tokens) must score the same context, so the client keeps, per session it
opened, each request's full input and output, and builds the full prompt exactly as the server does:

    SGLang (Session.create_req, _concat_token_arrays)          SessionMirror.full_prompt
    rid None, replace False                  no history        new ids as sent
    rid None, replace True                   crashes 0.5.23    never sent (`server_wire.check_session`)
    rid R (must exist)                       last = node R     strip BOS; last.input + last.output[:max_new]
    drop_previous_output                     no last output    last.input only
    offset o (o != 0, Python slice)          context[:o]       context[:o] + new ids

The scoring pass then carries the full prompt with no `session_params` (sessions stay off the scoring
path; the radix cache still serves the shared prefix), and the client checks that the server's
`prompt_tokens` equals the mirrored length, so a drift is an error rather than a silently wrong log p0.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class _Node:
    input_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    max_new_tokens: int


class SessionMirror:
    """Full inputs and outputs of the session requests sent through one client (thread-safe)."""

    def __init__(self, bos_token_id: int | None) -> None:
        self.bos_token_id = bos_token_id
        self._sessions: dict[str, dict[str, _Node]] = {}
        self._lock = threading.Lock()

    def opened(self, session_id: str) -> None:
        with self._lock:
            self._sessions[session_id] = {}

    def closed(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)

    def knows(self, session_id: str) -> bool:
        with self._lock:
            return session_id in self._sessions

    def full_prompt(self, session: dict[str, Any], ids: Sequence[int]) -> list[int] | None:
        """The ids the server will run for a request carrying `session` and `ids`; None when the session was
        not opened through this client (its history is unknown) or names an unknown rid (the server aborts)."""
        sid, rid = session.get("id"), session.get("rid")
        with self._lock:
            nodes = self._sessions.get(sid)
            if nodes is None:
                return None
            if rid is None:
                return list(ids)
            last = nodes.get(rid)
        if last is None:
            return None
        new = list(ids)
        if self.bos_token_id is not None and new and new[0] == self.bos_token_id:
            new = new[1:]
        context = list(last.input_ids)
        if not session.get("drop_previous_output"):
            context += list(last.output_ids[: last.max_new_tokens])
        offset = session.get("offset")
        if offset:
            context = context[:offset]
        return context + new

    def record(self, session: dict[str, Any], rid: str, full_input: Sequence[int], output_ids: Sequence[int],
               max_new_tokens: int) -> None:
        """A finished session request: it becomes node `rid` (replace with a rid clears that node's children on
        the server, which the mirror need not track: they stay named)."""
        with self._lock:
            nodes = self._sessions.get(session.get("id"))
            if nodes is None:
                return
            nodes[rid] = _Node(tuple(int(t) for t in full_input), tuple(int(t) for t in output_ids),
                               int(max_new_tokens))
