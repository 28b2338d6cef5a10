"""Token-exact SGLang frontend backend for a launched SGLang 0.5.23 server (`python -m sglang.launch_server`).

`@sgl.function` programs run on the server through `SGLangServerBackend`: the program's text becomes exact
token ids (`token_exact`), and every model call goes to `server_client.SGLangServerClient`, the server as a
forerun `Engine` (two-pass log p0, retries, errors naming the request; its docstring has the paper-symbol
table of what the server reports and how).
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Sequence

import requests

from ..protocol import GenerateOutput, RowListener, SamplingParams
from .server_client import ServerConfig, SGLangServerClient, SGLangServerError
from .sglang_frontend import named_chat_template, sgl
from .token_exact import TokenExactBackend

__all__ = ["SGLangServerBackend", "ServerConfig", "SGLangServerError"]  # the config and error its users meet


class SGLangServerBackend(TokenExactBackend):
    """`@sgl.function` programs on a launched SGLang server, token-exact (`input_ids`, never text).

    `SGLangServerBackend("http://127.0.0.1:30000")` loads the tokenizer the server reports
    (`tokenizer_path`, else `model_path`) with `transformers.AutoTokenizer`; pass `tokenizer=` (an object
    or a path) to skip that.  `backend.engine` is the same server as a forerun `Engine`.  A streamed gen
    (`.run(stream=True)`) is one streamed server request (`server_stream`), chunked as `token_exact.StreamChunks`.
    The roles (`sgl.system/user/assistant`) use SGLang's chat template as `RuntimeEndpoint` picks it:
    `chat_template_name` if given, else matched by the server's `model_path`.
    """

    @property
    def streams(self) -> bool:  # type: ignore[override]
        """Stream unless inside `session_params` (the server's session mirror follows non-streamed requests)."""
        return self.engine.default_session_params is None

    def __init__(self, base_url: str, tokenizer: Any = None, *, config: ServerConfig | None = None,
                 memory_size: int = 4096, add_special_tokens: bool = True,
                 http: requests.Session | None = None, chat_template_name: str | None = None) -> None:
        client = SGLangServerClient(base_url, tokenizer, config=config, http=http)
        super().__init__(client.tokenizer, memory_size=memory_size, add_special_tokens=add_special_tokens)
        self.engine = client
        self.base_url = client.base_url
        self.config = client.config
        templates = sgl.lang.chat_template  # loaded by sglang_frontend (BaseBackend imports it)
        self.chat_template = (named_chat_template(chat_template_name) if chat_template_name is not None else
                              templates.get_chat_template_by_model_path(client.capabilities.model_path or ""))

    def with_routing_key(self, key: str | None) -> "SGLangServerBackend":
        """This backend whose engine is `engine.with_routing_key(key)` (one per chain; see `ROUTING_KEY_HEADER`)."""
        view = copy.copy(self)
        view.engine = self.engine.with_routing_key(key)
        return view

    # -- TokenExactBackend ------------------------------------------------------------------
    def run(self, input_ids: Sequence[int], params: SamplingParams, *, rid: str | None = None,
            priority: int = 0, session_params: dict[str, Any] | None = None) -> GenerateOutput:
        return self.engine.generate(input_ids, params, rid=rid, priority=priority, session_params=session_params)

    def run_stream(self, input_ids: Sequence[int], params: SamplingParams, *, rid: str,
                   listener: RowListener) -> None:
        self.engine.submit_stream(input_ids, params, rid=rid, listener=listener)

    def run_batch(self, requests_: Sequence[tuple[Sequence[int], SamplingParams]]) -> list[GenerateOutput]:
        return self.engine.generate_batch(requests_)

    def score(self, input_ids: Sequence[int], start: int, *, top_logprobs_num: int = 0) -> GenerateOutput:
        """Pure scoring (max_new_tokens=0): log p0 of input_ids[start:] is `input_logp0[1:]` (SGLang shift)."""
        if not 1 <= start <= len(input_ids):
            raise ValueError(f"start must be in [1, {len(input_ids)}], got {start}")
        params = SamplingParams(max_new_tokens=0, temperature=1.0, return_logprob=True,
                                logprob_start_len=start - 1, top_logprobs_num=top_logprobs_num)
        return self.engine.generate(input_ids, params)

    # -- BaseBackend ------------------------------------------------------------------------
    def get_server_info(self) -> dict[str, Any]:
        return self.engine.server_info()

    def get_model_name(self) -> str:
        info = self.engine.server_info()
        return str(info.get("served_model_name") or info.get("model_path") or "sglang-server")

    def flush_cache(self) -> bool:
        """Flush the server's prefix cache once it is idle (see `SGLangServerClient.flush_cache`)."""
        return self.engine.flush_cache()

    def open_session(self, capacity_of_str_len: int, *, session_id: str | None = None) -> str:
        return self.engine.open_session(capacity_of_str_len, session_id=session_id)

    def close_session(self, session_id: str) -> None:
        self.engine.close_session(session_id)

    def session_params(self, params: dict[str, Any]) -> contextlib.AbstractContextManager[None]:
        """`with backend.session_params({"id": sid, ...}):` - see `SGLangServerClient.session_params`."""
        return self.engine.session_params(params)
