"""What a model spec may name, checked without loading anything (no torch import): `"default"`, `"tiny"`, or an
existing path (a Hugging Face folder or a .gguf file).  `engine.models.load_model` refuses a missing path with
this message, and the command line checks `--model` with it before any heavy import (a typo is reported at
once, not after seconds of importing torch and transformers).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["NAMED_MODELS", "missing_model_path"]

NAMED_MODELS = ("default", "tiny")


def missing_model_path(spec: str | os.PathLike[str]) -> str | None:
    """Why `spec` names no model (a path that does not exist), or None when it may name one."""
    text = str(spec)
    if text in NAMED_MODELS or Path(text).expanduser().exists():
        return None
    return f"model path {text!r} does not exist (use 'default', 'tiny', a HF folder or a .gguf file)"
