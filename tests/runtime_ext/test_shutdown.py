"""runtime_ext/shutdown.py: what a program forgot to close is closed at exit, newest first, and weakly held."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

from forerun.runtime_ext import shutdown


class Closable:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def close(self) -> None:
        self.log.append(self.name)


def test_close_all_closes_the_live_ones_newest_first_and_forgets_collected_ones():
    log: list[str] = []
    registry = shutdown.ExitRegistry()
    engine, pp = Closable(log, "engine"), Closable(log, "prepositioner")
    gone = Closable(log, "gone")
    for obj in (engine, gone, pp):
        assert registry.add(obj) is obj
    del gone
    gc.collect()
    registry.close_all()
    assert log == ["prepositioner", "engine"]
    registry.close_all()  # nothing left registered
    assert log == ["prepositioner", "engine"]


def test_objects_without_close_are_ignored():
    assert shutdown.ExitRegistry().add(42) == 42


CHILDREN = 4

UNCLOSED = textwrap.dedent("""
    import gc, os, sys
    from forerun.runtime_ext.engine import EmbeddedEngine
    from forerun.runtime_ext.preposition.prepositioner import Prepositioner, PrepositionConfig
    from forerun.programs.sessions import StreamingSession
    from transformers import LlamaForCausalLM  # noqa: F401 - the tiny model's class, imported before the forks

    def exit_with_work_in_flight():
        engine = EmbeddedEngine.from_spec("tiny")
        pp = Prepositioner(engine, PrepositionConfig(), tokenizer=engine.tokenizer)
        session = StreamingSession(pp, tokenizer=engine.tokenizer)
        session.register_query("trend", "Is the trend up or down? " * 30)  # its pre-position is a long prefill
        pp.wait_idle()
        session.append_data("prices: 101 102 104 103 107")  # a background pre-position is in flight at exit
        print("in flight at exit:", not pp.wait_idle(timeout=0), flush=True)

    gc.freeze()  # a child's exit then does not touch (copy) the parent's objects
    for _ in range(CHILDREN):
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            exit_with_work_in_flight()
            sys.exit(0)  # the child's interpreter exits normally: atexit handlers, then finalization
        print("child exit:", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
    exit_with_work_in_flight()  # and this interpreter's own exit
""").replace("CHILDREN", str(CHILDREN))


def test_an_unclosed_engine_with_work_in_flight_does_not_abort_the_interpreter(tmp_path):
    """An engine fed by a prepositioner, neither closed, a long pre-position in flight when the interpreter exits.
    Without the at-exit close such an exit aborts (SIGABRT: "terminate called without an active exception")
    about 9 times in 10 (measured with `atexit.unregister(shutdown.close_all)`: 11 of 12 forked exits, 5 of 6
    fresh interpreters; the short pre-position this test used before aborted about 1 time in 2).  Five exits:
    forked children after the imports (each a normal interpreter exit, a fraction of a second instead of a
    fresh interpreter's ~10 s of imports) and the parent's own."""
    script = tmp_path / "unclosed.py"
    script.write_text(UNCLOSED)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [line for line in lines if line.startswith("child exit")] == ["child exit: 0"] * CHILDREN, \
        f"{lines}\n{proc.stderr[-2000:]}"  # -6: a child aborted
    assert lines.count("in flight at exit: True") == CHILDREN + 1, lines  # every exit met work in flight
