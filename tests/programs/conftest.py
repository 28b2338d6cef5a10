"""Fixtures shared by the program tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny_loaded_backend():
    """(the tiny model as loaded, an EmbeddedBackend over an engine of it), closed after the module."""
    from forerun.runtime_ext.backends.embedded import EmbeddedBackend
    from forerun.runtime_ext.engine import EmbeddedEngine
    from forerun.runtime_ext.engine.models import load_model

    loaded = load_model("tiny")
    engine = EmbeddedEngine(loaded)
    yield loaded, EmbeddedBackend(engine)
    engine.close()
