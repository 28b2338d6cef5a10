"""The @sgl.function programs of pre-positioning, and `ProgramEngine`, which runs a session's requests through them
on any token-exact SGLang frontend backend (sessions: `programs.sessions`).

    paper                                 code
    decision point (Eq. 1)                decision_point (@sgl.function): one temperature-0 token, top-2 of p0
    the normal path of a turn             session_turn (@sgl.function): greedy generation after the entry
"""

from __future__ import annotations

from typing import Any, Sequence

from ..runtime_ext.backends.sglang_frontend import function, gen
from ..runtime_ext.backends.token_markers import token_ids
from ..runtime_ext.preposition.engines import PrepositionEngine, TopLogprobs, top_logprobs_at_decision_point
from ..runtime_ext.protocol import GenerateOutput, SamplingParams
from .proposals import without_template_stops

__all__ = ["ProgramEngine", "decision_point", "session_turn"]


@function
def decision_point(s, state_ids: Sequence[int], entry_ids: Sequence[int]):
    """The ready distribution at p = n_s + L_entry: one temperature-0 token with the top-2 of p0."""
    s += token_ids(list(state_ids) + list(entry_ids))
    s += gen("ready", max_tokens=1, temperature=0.0, return_logprob=True, top_logprobs_num=2)


@function
def session_turn(s, state_ids: Sequence[int], entry_ids: Sequence[int], max_tokens: int = 1):
    """The normal path from the session state: greedy generation after the realized entry."""
    s += token_ids(list(state_ids) + list(entry_ids))
    s += gen("answer", max_tokens=max_tokens, temperature=0.0, return_logprob=True)


class ProgramEngine(PrepositionEngine):
    """`PrepositionEngine` on a token-exact SGLang backend: the ready distribution through `decision_point`,
    greedy generation through `session_turn`.

    The SGLang frontend carries no request priority, so pre-positions sent this way run at the backend's
    normal priority (use the backend's engine, through `EngineAdapter`, to get `priority=-1`).
    """

    def __init__(self, backend: Any) -> None:
        self.backend = without_template_stops(backend)
        """The programs have no chat roles: their gens end at EOS or max_tokens, as the engine's own requests do,
        never at the chat template's stop strings, which SGLang's interpreter would add to every gen."""
        self.tokenizer = getattr(backend, "tokenizer", None)

    def ready_distribution(self, input_ids: Sequence[int], *, priority: int = -1) -> TopLogprobs:
        ids = list(input_ids)
        state = decision_point.run(state_ids=ids[:-1], entry_ids=ids[-1:], backend=self.backend)
        return top_logprobs_at_decision_point(self._output(state, "ready", ids))

    def generate(self, input_ids: Sequence[int], params: SamplingParams, *, priority: int = 0) -> GenerateOutput:
        if params.temperature != 0.0:
            raise ValueError(f"ProgramEngine runs greedy session turns only (temperature 0), got {params.temperature}")
        ids = list(input_ids)
        state = session_turn.run(state_ids=ids[:-1], entry_ids=ids[-1:], max_tokens=params.max_new_tokens,
                                 backend=self.backend)
        return self._output(state, "answer", ids)

    @staticmethod
    def _output(state: Any, name: str, ids: list[int]) -> GenerateOutput:
        meta = state.get_meta_info(name) or {}
        out_ids = tuple(int(e[1]) for e in meta.get("output_token_logprobs") or ())
        return GenerateOutput(input_ids=tuple(ids), output_ids=out_ids, text=state[name], meta_info=dict(meta))
