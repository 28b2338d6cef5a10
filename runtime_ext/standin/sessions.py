"""The stand-in SGLang server's sessions, following `srt/session/session_controller.py` (0.5.23) line by line for
non-streaming sessions: a request naming a session request `rid` runs on that request's input + output
(`output_ids[:max_new_tokens]`; only its input with `drop_previous_output`), cut at `offset` (a Python slice
when non-zero), followed by the new ids with a leading BOS stripped.  `rid` None: no history.  An unknown
rid, a rid whose request has not finished, or a request that would run on no tokens, is aborted with SGLang's
messages (the server answers HTTP 400 with them).  Written independently of the client's `SessionMirror`, which
the tests check against it.

`replace` without `rid` on a session that holds requests is what 0.5.23 crashes on: `Session.create_req`
iterates `self.req_nodes.items()` and each `SessionReqNode.clear` deletes from that dict
(session_controller.py:245-246 and :62), so the scheduler raises "dictionary changed size during iteration"
and SIGQUITs the server (scheduler.py:6373).  `create` raises `SchedulerCrash` there; on an empty tree the
loop does nothing and the request runs, as on the real server.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


CRASH_MESSAGE = ("Scheduler hit an exception: RuntimeError: dictionary changed size during iteration "
                 "(srt/session/session_controller.py:245, session_params replace=True without rid)")


class SchedulerCrash(RuntimeError):
    """What the real scheduler raises (and dies of) for this request."""


@dataclass
class _Req:
    input_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    max_new_tokens: int = 0
    children: list[str] = field(default_factory=list)
    finished: bool = False


@dataclass
class _Session:
    capacity_of_str_len: int
    nodes: dict[str, _Req] = field(default_factory=dict)


class Sessions:
    """Open sessions and their request trees."""

    def __init__(self, bos_token_id: int) -> None:
        self.bos_token_id = bos_token_id
        self.sessions: dict[str, _Session] = {}
        self.lock = threading.Lock()

    def __contains__(self, sid: str) -> bool:
        return sid in self.sessions

    def open(self, sid: str, capacity: int) -> bool:
        with self.lock:
            if sid in self.sessions:
                return False
            self.sessions[sid] = _Session(capacity)
            return True

    def close(self, sid: str) -> bool:
        with self.lock:
            return self.sessions.pop(sid, None) is not None

    def _clear(self, s: _Session, rid: str) -> None:
        for child in s.nodes[rid].children:
            if child in s.nodes:
                self._clear(s, child)
        del s.nodes[rid]

    def create(self, params: dict[str, Any], rid: str, ids: list[int], max_new_tokens: int
               ) -> tuple[list[int] | None, str]:
        """(the ids the request runs on, "") or (None, abort message), as Session.create_req; SchedulerCrash
        where the real scheduler crashes (module docstring)."""
        with self.lock:
            s = self.sessions[params["id"]]
            last_rid = params.get("rid")
            last = None
            if params.get("replace"):
                if last_rid is None:
                    if s.nodes:
                        raise SchedulerCrash(CRASH_MESSAGE)
                elif last_rid not in s.nodes:
                    return None, "Invalid request session id"
                else:
                    last = s.nodes[last_rid]
                    for child in list(last.children):
                        if child in s.nodes:
                            self._clear(s, child)
                    last.children = []
            elif last_rid is not None:
                if last_rid not in s.nodes:
                    return None, "Invalid request session id"
                last = s.nodes[last_rid]
                if not last.finished:
                    return None, "Session request is appending to a request that hasn't finished."
            if last is not None:
                if ids and ids[0] == self.bos_token_id:
                    ids = ids[1:]
                context = list(last.input_ids)
                if not params.get("drop_previous_output"):
                    context += last.output_ids[:last.max_new_tokens]
                offset = params.get("offset")
                full = (context[:offset] if offset else context) + ids
            else:
                full = list(ids)
            if not full:
                return None, "A session request must contain input tokens after restoring history."
            if last is not None:
                last.children.append(rid)
            s.nodes[rid] = _Req(full, max_new_tokens=max_new_tokens)
            return full, ""

    def finish(self, sid: str, rid: str, output_ids: list[int]) -> None:
        with self.lock:
            s = self.sessions.get(sid)
            if s is not None and rid in s.nodes:
                s.nodes[rid].output_ids = list(output_ids)
                s.nodes[rid].finished = True
