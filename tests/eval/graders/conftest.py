"""Every sandbox test of this folder runs on one pytest-xdist worker (`--dist loadgroup`): as root each run
has uids of its own, but a normal user's fallback mode (no namespaces) runs every program as that user, so two
sandboxed programs could see each other, which a test that hunts for the pass signal would find - a real
limit of the fallback, which is why it is opt-in only."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/eval/graders/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.xdist_group("sandbox"))
