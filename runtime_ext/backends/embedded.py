"""The SGLang frontend backend on the embedded CPU engine (token-exact).

    sgl.set_default_backend(EmbeddedBackend(EmbeddedEngine.from_spec("default")))

Any `@sgl.function` - fork, gen with logprobs, select, run_batch, constrained gens (regex, json_schema, the
dtype gens), streaming - runs on it: program text becomes exact token ids through `TokenExactBackend` (markers
from `token_markers`, remembered generated ids), and every request goes to `EmbeddedEngine.generate`, whose
concurrent calls (the fork threads) share one batched forward per decode step; a streamed gen goes to
`EmbeddedEngine.submit_stream` and its chunks follow SGLang's contract (`token_exact.StreamChunks`).
"""

from __future__ import annotations

from typing import Any, Sequence

from ..engine import EmbeddedEngine
from ..protocol import GenerateOutput, RowListener, SamplingParams
from .sglang_frontend import named_chat_template, sgl
from .token_exact import TokenExactBackend


def chat_template_for(engine: EmbeddedEngine) -> Any:
    """SGLang's chat template for the model: matched by model path/name, else chatml when the tokenizer
    speaks `<|im_start|>` (SmolLM2, the tiny test model), else SGLang's default."""
    templates = sgl.lang.chat_template  # loaded by sglang_frontend (BaseBackend imports it)
    info = engine.model_info
    for key in (info.path, info.name):
        if key:
            tmpl = templates.get_chat_template_by_model_path(key)
            if tmpl.name != "default":
                return tmpl
    vocab_has_chatml = "<|im_start|>" in (getattr(engine.tokenizer, "chat_template", None) or "")
    return templates.get_chat_template("chatml" if vocab_has_chatml else "default")


class EmbeddedBackend(TokenExactBackend):
    """Token-exact SGLang frontend backend whose requests run on an `EmbeddedEngine`."""

    streams = True

    def __init__(self, engine: EmbeddedEngine, *, memory_size: int = 4096, chat_template_name: str | None = None
                 ) -> None:
        """`chat_template_name`: one of SGLang's registered chat templates (as SGLangServerBackend takes it, and
        `--chat-template` of an SGLang server); None: matched by the model's path / name (`chat_template_for`)."""
        if not isinstance(engine, EmbeddedEngine):
            raise TypeError(f"EmbeddedBackend needs an EmbeddedEngine, got {type(engine).__name__}")
        template = named_chat_template(chat_template_name) if chat_template_name is not None else None
        super().__init__(engine.tokenizer, memory_size=memory_size)
        self.engine = engine
        self.chat_template = template if template is not None else chat_template_for(engine)

    def run(self, input_ids: Sequence[int], params: SamplingParams) -> GenerateOutput:
        return self.engine.generate(input_ids, params)

    def run_batch(self, requests: Sequence[tuple[Sequence[int], SamplingParams]]) -> list[GenerateOutput]:
        return self.engine.generate_batch(requests)

    def run_stream(self, input_ids: Sequence[int], params: SamplingParams, *, rid: str,
                   listener: RowListener) -> None:
        self.engine.submit_stream(input_ids, params, rid=rid, listener=listener)

    def get_model_name(self) -> str:
        return self.engine.model_info.name

    def get_server_info(self) -> dict[str, Any]:
        return self.engine.server_info()

    def flush_cache(self) -> None:
        self.engine.flush_cache()

    def shutdown(self) -> None:
        self.engine.close()
