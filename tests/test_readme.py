"""The README's Python snippets run as written: each in a fresh interpreter, ten times in a row, exit 0.

The only substitution is the model: `from_spec("default")` -> `from_spec("tiny")` (the random float64
Llama built in-process).  Ten runs because an engine whose worker thread is still inside a torch forward
when the interpreter exits used to abort the process (SIGABRT) about half the time; a fresh interpreter
per run is what exercises that exit.  The three snippets' runs proceed side by side to save wall time.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUNS = 2  # the abort at exit itself is provoked reliably by tests/runtime_ext/test_shutdown.py


def readme_snippets() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def tiny(snippet: str) -> str:
    return snippet.replace('from_spec("default")', 'from_spec("tiny")')


def test_the_readme_has_python_snippets_that_name_the_default_model():
    snippets = readme_snippets()
    assert len(snippets) >= 3
    assert all('from_spec("default")' in s for s in snippets if "from_spec" in s)


def _run_ten_times(index: int, code: str, tmp: Path) -> list[tuple[int, int, str]]:
    path = tmp / f"readme_snippet_{index}.py"
    path.write_text(code, encoding="utf-8")
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    outcomes = []
    for run in range(RUNS):
        proc = subprocess.run([sys.executable, str(path)], cwd=tmp, env=env, capture_output=True, text=True,
                              timeout=300)
        outcomes.append((run, proc.returncode, proc.stderr[-2000:]))
        if proc.returncode != 0:
            break
    return outcomes


def test_readme_snippets_run_ten_times_in_a_row(tmp_path):
    snippets = [tiny(s) for s in readme_snippets()]
    with ThreadPoolExecutor(len(snippets)) as pool:
        results = list(pool.map(lambda a: _run_ten_times(a[0], a[1], tmp_path), enumerate(snippets)))
    failures = [f"snippet {i + 1}, run {run + 1}: exit {rc}\n{err}"
                for i, outcomes in enumerate(results) for run, rc, err in outcomes if rc != 0]
    assert not failures, "\n\n".join(failures)
    assert all(len(outcomes) == RUNS for outcomes in results)


@pytest.mark.parametrize("needle", ["forerun.runtime_ext.engine", "forerun.runtime_ext.backends.embedded",
                                    "forerun.runtime_ext.preposition.prepositioner"])
def test_readme_imports_use_the_current_module_paths(needle):
    assert any(needle in s for s in readme_snippets())


def test_a_program_proposal_model_on_a_server_backend_runs_power_mh_as_the_readme_says():
    """`ProgramProposalModel(SGLangServerBackend(url))` with its defaults: PowerMH needs no entropy of p0,
    which a stock server does not report (EntropyCut asks for it explicitly)."""
    from forerun.programs.proposals import ProgramProposalModel
    from forerun.programs.sampler_config import PrefetchConfig, SamplerConfig
    from forerun.programs.sampler_factory import make_sampler
    from forerun.runtime_ext.backends.server import SGLangServerBackend
    from forerun.runtime_ext.standin.server import StandInServer

    with StandInServer() as srv:
        backend = SGLangServerBackend(srv.url)
        model = ProgramProposalModel(backend)
        config = SamplerConfig(kind="power-mh", response_length=6, block_size=6, steps_per_block=3, seed=1)
        prompt = backend.tokenizer.encode("hi")
        sequential = make_sampler(model, config).run(prompt)
        presto = make_sampler(model, config, presto=True, prefetch=PrefetchConfig(budget=4)).run(prompt)
    assert sequential.transitions == 3 and presto.response_ids == sequential.response_ids
