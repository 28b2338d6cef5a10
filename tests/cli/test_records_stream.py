"""`forerun sample --records`: each call's node lines are written (and flushed) as the call finishes, so a run
that fails or is interrupted keeps what finished; an engine failure during the run is exit 1 (a failure, not
a usage error)."""

from __future__ import annotations

import json

import pytest

from forerun.cli.main import main
from forerun.programs.proposals import ProgramProposalModel
from forerun.runtime_ext.protocol import EngineError


@pytest.mark.parametrize("presto", [False, True], ids=["sequential", "presto"])
def test_a_chain_that_fails_keeps_the_records_of_its_finished_calls(presto, tmp_path, monkeypatch, capsys):
    real, calls, seen = ProgramProposalModel.generate, [], []

    def failing(self, requests):  # the block extension, two proposal calls, then the engine fails
        calls.append(len(requests))
        if len(calls) == 4:
            seen.append(records.read_text().splitlines() if records.exists() else [])
            raise EngineError("the engine died")
        return real(self, requests)

    monkeypatch.setattr(ProgramProposalModel, "generate", failing)
    records = tmp_path / "nodes.jsonl"
    argv = ["sample", "--prompt", "hi", "--model", "tiny", "--n", "4", "--K", "50", "--records", str(records)]
    assert main(argv + (["--presto", "--npf", "2"] if presto else [])) == 1  # EngineError: a failure, exit 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1].split("\r")[-1] == "forerun sample: the engine died"
    lines = records.read_text().splitlines()
    assert seen == [lines]  # written before the failing call started, not at the end
    nodes = [json.loads(line) for line in lines]
    assert sorted({n["call_index"] for n in nodes}) == [1, 2]  # the two finished proposal calls (0: the extension)
    assert all(n["model"] == "tiny" for n in nodes) and (len(nodes) == 2 or presto)
