"""The one runtime factory: where the programs run, built from --model/--dtype or --backend/--tokenizer.

    open_runtime(model="default", dtype=None)            the embedded CPU engine + its frontend backend
    open_runtime(backend_url="http://host:30000")        a launched SGLang server + its frontend backend
    pool.open_pool(...)                                  several of them (servers, or one embedded engine
                                                         with several chains in flight): `pool.RuntimePool`

Both give a `Runtime`: `engine` speaks `protocol.Engine` (generate / generate_batch / flush_cache /
server_info), `backend` is the token-exact SGLang frontend backend that `@sgl.function` programs run on,
`tokenizer` encodes prompts.  A `Runtime` is a context manager: leaving it closes the engine (an embedded
engine's worker thread must stop before the interpreter exits).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .engine import EmbeddedEngine, EngineConfig
from .engine.models import LoadedModel, load_model


@dataclass
class Runtime:
    """Where the programs run: the embedded engine or a launched SGLang server."""

    name: str
    """Model name (the loaded model's, or the one the server serves)."""
    dtype: str
    """Model dtype of the embedded engine ("float32", ...); "server" for an SGLang server."""
    tokenizer: Any
    engine: Any
    """The engine (`protocol.Engine`): an `EmbeddedEngine` or an `SGLangServerClient`."""
    backend: Any
    """The token-exact SGLang frontend backend the programs run on."""
    location: str = "embedded"
    """"embedded", or the server URL."""
    loaded: LoadedModel | None = field(default=None, repr=False)
    """The loaded model (embedded engine only)."""

    @property
    def is_embedded(self) -> bool:
        return self.loaded is not None

    @property
    def max_context(self) -> int | None:
        """The model's context window in tokens: the embedded model's, or the one the server reports (None:
        unknown)."""
        if self.loaded is not None:
            return self.loaded.max_context
        return getattr(self.engine, "max_context", None)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The model's end-of-sequence ids: the embedded model's EOS set, else the tokenizer's EOS token."""
        if self.loaded is not None:
            return tuple(self.loaded.eos_token_ids)
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)

    @property
    def deterministic(self) -> bool:
        """Seeds are honoured (the embedded engine; a server with --enable-deterministic-inference)."""
        return bool(getattr(self.engine, "deterministic", True))

    @property
    def determinism_note(self) -> str | None:
        """Why seeded runs on this runtime reproduce only in law: a server without deterministic inference that
        was allowed anyway (`allow_nondeterministic`; not allowed, it refuses seeded work instead).  None when
        runs reproduce token for token."""
        from .backends.server_client import NONDETERMINISTIC_NOTE

        allowed = getattr(getattr(self.engine, "config", None), "allow_nondeterministic", False)
        return None if self.deterministic or not allowed else f"{self.location}: {NONDETERMINISTIC_NOTE}"

    def for_chain(self, key: str) -> "Runtime":
        """This runtime as one chain uses it: on a server every request carries the chain's routing key
        (`server_client.ROUTING_KEY_HEADER`), so behind the SGLang Model Gateway all of a chain's calls reach
        one worker and its radix prefix stays warm; the embedded engine is returned as it is."""
        keyed = getattr(self.backend, "with_routing_key", None)
        if keyed is None:
            return self
        backend = keyed(key)
        return replace(self, engine=backend.engine, backend=backend)

    def flush(self) -> bool:
        """Clear the prefix cache (between independent chains).  A server flushes only once idle and may
        stay busy (shared): False then, and the cache is left as it is."""
        flushed = self.engine.flush_cache()
        return True if flushed is None else bool(flushed)

    def close(self) -> None:
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_runtime(model: str = "default", dtype: str | None = None, *, backend_url: str | None = None,
                 tokenizer: Any = None, engine_config: EngineConfig | None = None,
                 allow_nondeterministic: bool = False, request_timeout_s: float | None = None) -> Runtime:
    """The embedded engine for `model` (a spec: default | tiny | HF folder | .gguf), or the SGLang server
    at `backend_url` (then `model`, `dtype` and `engine_config` are ignored; the tokenizer is `tokenizer`,
    a name, folder or tokenizer object, or else the one the server reports).  `allow_nondeterministic`: a
    server without --enable-deterministic-inference accepts seeded requests; `request_timeout_s`: give up on
    one request after that long (default `ServerConfig.timeout_s`; see `ServerConfig`)."""
    if backend_url:
        from .backends.server import SGLangServerBackend
        from .backends.server_client import ServerConfig

        if not backend_url.startswith(("http://", "https://")):
            raise ValueError(f"--backend must be a URL starting with http:// or https://, got {backend_url!r}")
        timeout = {} if request_timeout_s is None else {"timeout_s": request_timeout_s}
        backend = SGLangServerBackend(backend_url, tokenizer=tokenizer,
                                      config=ServerConfig(allow_nondeterministic=allow_nondeterministic, **timeout))
        return Runtime(name=backend.get_model_name(), dtype="server", tokenizer=backend.tokenizer,
                       engine=backend.engine, backend=backend, location=backend.base_url)
    from .backends.embedded import EmbeddedBackend

    loaded = load_model(model, dtype=dtype)
    engine = EmbeddedEngine(loaded, engine_config or EngineConfig())
    return Runtime(name=loaded.name, dtype=str(loaded.dtype).replace("torch.", ""), tokenizer=loaded.tokenizer,
                   engine=engine, backend=EmbeddedBackend(engine), loaded=loaded)
