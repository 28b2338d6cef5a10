"""The one engine interface of pre-positioning: the adapter for engines, the program adapter for backends."""

from __future__ import annotations

import pytest

from forerun.programs.sessions import ProgramEngine
from forerun.runtime_ext.preposition.engines import (
    EngineAdapter,
    PrepositionEngine,
    as_preposition_engine,
    ready_request_params,
)
from forerun.runtime_ext.preposition.prepositioner import PrepositionConfig, Prepositioner
from forerun.runtime_ext.protocol import GenerateOutput, SamplingParams
from forerun.runtime_ext.preposition.ready_cache import SessionState


class RecordingEngine:
    """Answers every request with token 7; the top-2 only when asked; records (priority, params)."""

    tokenizer = None

    def __init__(self, top=True):
        self.calls: list[tuple[int, SamplingParams]] = []
        self.top = top

    def generate(self, input_ids, params, *, rid=None, priority=0):
        self.calls.append((priority, params))
        meta = {}
        if params.top_logprobs_num and self.top:
            meta["output_top_logprobs"] = [[[-0.1, 7, None], [-2.5, 3, None]]]
        return GenerateOutput(tuple(input_ids), (7,), "<7>", meta)


def test_engine_adapter_sends_both_requests_with_their_priority():
    eng = RecordingEngine()
    adapter = EngineAdapter(eng)
    assert adapter.ready_distribution((1, 2, 3), priority=-1) == [[-0.1, 7, None], [-2.5, 3, None]]
    greedy = SamplingParams(max_new_tokens=2, temperature=0.0)
    assert adapter.generate((1, 2), greedy, priority=0).output_ids == (7,)
    assert eng.calls == [(-1, ready_request_params()), (0, greedy)]
    with pytest.raises(ValueError, match="output_top_logprobs"):
        EngineAdapter(RecordingEngine(top=False)).ready_distribution([1], priority=-1)


def test_the_prepositioner_picks_the_adapter_once_by_type():
    eng = RecordingEngine()
    pp = Prepositioner(eng, PrepositionConfig(background=False))
    assert pp.engine is eng and isinstance(pp.runner, EngineAdapter) and pp.runner.engine is eng
    s = SessionState([1, 2])
    assert pp.preposition(s, [3])
    assert [p for p, _ in eng.calls] == [-1] and s.ready_for([3]).top_token == 7

    class Native:
        def ready_distribution(self, input_ids, *, priority):
            return [[-0.2, 5, None], [-0.9, 6, None]]

        def generate(self, input_ids, params, *, priority):
            raise AssertionError("not called")

    native = Native()
    assert isinstance(native, PrepositionEngine) and as_preposition_engine(native) is native
    with Prepositioner(native) as pp_native:
        assert pp_native.runner is native


def test_a_frontend_backend_is_not_an_engine():
    from forerun.runtime_ext.backends.token_exact import TokenExactBackend
    from forerun.runtime_ext.standin.server import byte_tokenizer

    backend = TokenExactBackend(byte_tokenizer())
    with pytest.raises(TypeError, match="ProgramEngine"):
        Prepositioner(backend)
    program_engine = ProgramEngine(backend)
    assert isinstance(program_engine, PrepositionEngine)
    with Prepositioner(program_engine) as pp:
        assert pp.runner is program_engine
    with pytest.raises(ValueError, match="greedy"):
        program_engine.generate([1, 2], SamplingParams(max_new_tokens=1, temperature=0.7))
