"""EngineStreams on the embedded engine: the decode steps it reports are the engine's own (an abort's report,
posted between two steps, is no step), counted against the engine's step counter."""

from __future__ import annotations

import pytest

from forerun.programs.stream_proposals import EngineStreams
from forerun.programs.suffixes import SuffixRequest
from forerun.runtime_ext.engine import EmbeddedEngine, EngineConfig
from forerun.runtime_ext.engine.models import load_model


@pytest.fixture(scope="module")
def engine():
    eng = EmbeddedEngine(load_model("tiny"), EngineConfig(batch_window_ms=1.0))
    yield eng
    eng.close()


@pytest.mark.parametrize("abort_at", [1, 2, 4])
def test_steps_are_the_engines_decode_steps_when_a_row_is_aborted(engine, abort_at):
    io = EngineStreams(engine)
    before = engine.stats()["decode_steps"]
    io.start("keep", SuffixRequest((1, 2, 3), 6, 0.5, 7))
    io.start("drop", SuffixRequest((1, 2, 4), 6, 0.5, 8))
    seen, done, aborted = 0, False, False
    while not done:
        batch = io.updates()
        seen += batch.steps
        for u in batch.updates:
            done = done or (u.rid == "keep" and u.suffix is not None)
            if u.rid == "drop" and len(u.ids) >= abort_at and not aborted:
                io.abort("drop")
                aborted = True
    io.pause()
    assert aborted
    assert seen == engine.stats()["decode_steps"] - before == 6
