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


UNCLOSED = textwrap.dedent("""
    from forerun.runtime_ext.engine import EmbeddedEngine
    from forerun.runtime_ext.preposition.prepositioner import Prepositioner, PrepositionConfig
    from forerun.programs.sessions import StreamingSession

    engine = EmbeddedEngine.from_spec("tiny")
    pp = Prepositioner(engine, PrepositionConfig(), tokenizer=engine.tokenizer)
    session = StreamingSession(pp, tokenizer=engine.tokenizer)
    session.register_query("trend", "Is the trend up or down?")
    session.append_data("prices: 101 102 104 103 107")  # a background pre-position is in flight at exit
""")


def test_an_unclosed_engine_with_work_in_flight_does_not_abort_the_interpreter(tmp_path):
    """Without the at-exit close this aborted (SIGABRT, exit 134) about half the time."""
    script = tmp_path / "unclosed.py"
    script.write_text(UNCLOSED)
    for _ in range(3):
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
