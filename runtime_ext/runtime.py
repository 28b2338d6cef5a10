"""The one runtime factory: where the programs run, built from --model/--dtype or --backend/--tokenizer.

    open_runtime(model="default", dtype=None)            the embedded CPU engine + its frontend backend
    open_runtime(backend_url="http://host:30000")        a launched SGLang server + its frontend backend

Both give a `Runtime`: `engine` speaks `protocol.Engine` (generate / generate_batch / flush_cache /
server_info), `backend` is the token-exact SGLang frontend backend that `@sgl.function` programs run on,
`tokenizer` encodes prompts.  A `Runtime` is a context manager: leaving it closes the engine (an embedded
engine's worker thread must stop before the interpreter exits).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .engine import EmbeddedEngine, EngineConfig
from .engine.models import LoadedModel, load_model
from .shutdown import close_at_exit


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

    def flush(self) -> None:
        """Clear the prefix cache (between independent chains)."""
        self.engine.flush_cache()

    def close(self) -> None:
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_runtime(model: str = "default", dtype: str | None = None, *, backend_url: str | None = None,
                 tokenizer: str | None = None, engine_config: EngineConfig | None = None) -> Runtime:
    """The embedded engine for `model` (a spec: default | tiny | HF folder | .gguf), or the SGLang server
    at `backend_url` (then `model`, `dtype` and `engine_config` are ignored; the tokenizer is `tokenizer`,
    a name or folder, or else the one the server reports)."""
    if backend_url:
        from .backends.server import SGLangServerBackend

        if not backend_url.startswith(("http://", "https://")):
            raise ValueError(f"--backend must be a URL starting with http:// or https://, got {backend_url!r}")
        backend = SGLangServerBackend(backend_url, tokenizer=tokenizer)
        return Runtime(name=backend.get_model_name(), dtype="server", tokenizer=backend.tokenizer,
                       engine=backend.engine, backend=backend, location=backend.base_url)
    from .backends.embedded import EmbeddedBackend

    loaded = load_model(model, dtype=dtype)
    engine = close_at_exit(EmbeddedEngine(loaded, engine_config or EngineConfig()))
    return Runtime(name=loaded.name, dtype=str(loaded.dtype).replace("torch.", ""), tokenizer=loaded.tokenizer,
                   engine=engine, backend=EmbeddedBackend(engine), loaded=loaded)
