"""Sequential PowerMH per MH step against the reference implementation of Karan & Du, side by side.

The reference ("reasoning-with-sampling", `llm_experiments/power_samp_utils.py`) is NOT shipped with forerun:
point `--reference` at a checkout's copy of that file.  Its `AutoregressiveSampler`, `naive_temp` and
`mcmc_power_samp` are read from the file unchanged (by name, so the module's other imports are not needed)
and run on the same SmolLM2 weights: every MH step re-prefills prompt + prefix with transformers `generate`
(HF's default top-k = 50 truncates its q; forerun's q is the full vocabulary).  Both run one block of n
tokens (fixed horizon: EOS is disabled for the reference, ignored by forerun), α = 4 (τ = 1/4), K steps.

    what is timed                          code
    reference MH step                      one `naive_temp` call after the block's first (its model call)
    forerun MH step                        `CallRecord.wall_time` of a sequential PowerMH call
    per MH step, fair to the random cuts   least squares time = a + b·L over the steps, read at
                                           E[L] = (n + 1) / 2 (both draw the suffix length L uniformly)

    forerun bench reference --reference PATH/power_samp_utils.py [--prompts 5 --K 20 --n 64] [--json]
"""

from __future__ import annotations

import ast
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...programs.sampler_config import SamplerConfig
from ...runtime_ext.protocol import check_inverse_alpha

REFERENCE_NAMES = ("AutoregressiveSampler", "naive_temp", "mcmc_power_samp")
MAX_REFERENCE_BYTES = 4 << 20
"""Largest reference file read (power_samp_utils.py is a few KB)."""


@dataclass(frozen=True)
class ReferenceConfig:
    """One `forerun bench reference` run (the CLI's defaults)."""

    reference: str
    """Path to the reference's llm_experiments/power_samp_utils.py."""
    prompts: int = 5
    """First MATH500 prompts."""
    K: int = 20
    """MH steps per chain."""
    n: int = 64
    """Response length, one block."""
    alpha: float = SamplerConfig().alpha
    """Power α; τ = 1/α."""
    seed: int = 0
    threads: int | None = None
    """torch threads of both (None: torch's choice)."""

    def __post_init__(self) -> None:
        for name in ("prompts", "K", "n"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.alpha > 0:
            raise ValueError(f"alpha must be > 0, got {self.alpha}")
        check_inverse_alpha(self.alpha)


def load_reference(path: str | Path) -> dict[str, Any]:
    """The reference's three definitions, executed from its file with only the globals they use."""
    import torch

    with Path(path).open("rb") as fh:  # bounded: /dev/zero or a huge file must not fill the memory
        source = fh.read(MAX_REFERENCE_BYTES + 1)
    if len(source) > MAX_REFERENCE_BYTES:
        raise ValueError(f"{path}: larger than {MAX_REFERENCE_BYTES >> 20} MiB, not the reference's "
                         "power_samp_utils.py (a few KB)")
    tree = ast.parse(source.decode("utf-8"))
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in REFERENCE_NAMES]
    missing = set(REFERENCE_NAMES) - {n.name for n in defs}
    if missing:
        raise ValueError(f"{path}: no {sorted(missing)} (expected the reference's power_samp_utils.py)")
    quiet = lambda *a, **k: None  # noqa: E731 - its prints and progress bars
    ns: dict[str, Any] = {"torch": torch, "F": torch.nn.functional, "np": np, "random": random,
                          "tqdm": lambda it, *a, **k: it, "print": quiet}
    try:
        exec(compile(ast.Module(body=defs, type_ignores=[]), str(path), "exec"), ns)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - its own code: a name it lacks, a class body exit()
        raise ValueError(f"{path}: its {', '.join(REFERENCE_NAMES)} do not load on their own "
                         f"({type(exc).__name__}: {exc}); expected the reference's power_samp_utils.py") from None
    _check_calls(ns, path)
    return ns


_CALLS = {"AutoregressiveSampler": ((None, None, "cpu"), {}), "naive_temp": ((None, None, 1.0, 1), {}),
          "mcmc_power_samp": ((None, [], 1.0, 1, 1), {"block_num": 1})}
"""How `_reference_steps` calls each definition (its arguments' shapes)."""


def _check_calls(ns: dict[str, Any], path: str | Path) -> None:
    """A ValueError, before any model loads, when a definition cannot take the call `_reference_steps` makes."""
    import inspect

    for name, (args, kwargs) in _CALLS.items():
        try:
            inspect.signature(ns[name]).bind(*args, **kwargs)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: {name} does not take the reference's arguments ({exc}); expected the "
                             "reference's power_samp_utils.py") from None


class _NoEos:
    """The tokenizer with eos_token_id = None: the reference generates a fixed horizon."""

    eos_token_id = None

    def __init__(self, tok: Any) -> None:
        self._tok = tok

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)


def _reference_steps(ns: dict[str, Any], model: Any, tok: Any, ids: list[int], cfg: ReferenceConfig) -> list:
    """(seconds, suffix tokens) of each MH step of one reference chain."""
    import torch

    calls: list[tuple[float, int]] = []
    inner = ns["naive_temp"]

    def timed(p, context, temp, seq_len):
        t0 = time.perf_counter()
        out = inner(p, context, temp, seq_len)
        calls.append((time.perf_counter() - t0, seq_len - len(context)))
        return out

    ns["naive_temp"] = timed
    try:
        sampler = ns["AutoregressiveSampler"](model, _NoEos(tok), "cpu")
        with torch.inference_mode():
            ns["mcmc_power_samp"](sampler, list(ids), 1.0 / cfg.alpha, cfg.K, cfg.n, block_num=1)
    except Exception as exc:  # noqa: BLE001 - the file's own code, not forerun's: one line naming the file
        raise ValueError(f"{cfg.reference}: its code failed while it ran ({type(exc).__name__}: {exc}); expected "
                         "the reference's power_samp_utils.py") from exc
    finally:
        ns["naive_temp"] = inner
    if len(calls) < 2:
        raise ValueError(f"{cfg.reference}: its mcmc_power_samp called naive_temp {len(calls)} time(s) for K = "
                         f"{cfg.K} MH steps (the reference's: once to extend the block, then once per step)")
    return calls[1:]  # the first call extends the block


def _forerun_steps(runtime: Any, ids: list[int], cfg: ReferenceConfig) -> list:
    from ...programs.sampler_factory import make_sampler
    from ...programs.proposals import proposal_model_for

    sc = SamplerConfig(kind="power-mh", response_length=cfg.n, block_size=cfg.n, steps_per_block=cfg.K,
                       alpha=cfg.alpha, seed=cfg.seed)
    runtime.engine.flush_cache()
    res = make_sampler(proposal_model_for(runtime.backend, "power-mh"), sc).run(ids)
    return [(c.wall_time, cfg.n - c.nodes[0].cut) for c in res.mh_calls]


def fitted_step(steps: list[tuple[float, int]], length: float) -> float:
    """Least-squares time = a + b·L over the steps, at L = length."""
    b, a = np.polyfit(np.asarray([n for _, n in steps], float), np.asarray([t for t, _ in steps], float), 1)
    return float(a + b * length)


def run(cfg: ReferenceConfig) -> dict[str, Any]:
    """Both implementations on the same prompts, alternating per prompt; ratios from this run."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ...programs.prompts import chat_prompt_ids
    from ...runtime_ext.engine import EngineConfig
    from ...runtime_ext.engine.models import convert_gguf, default_model_path
    from ...runtime_ext.engine.native import on_transient_thread
    from ...runtime_ext.runtime import open_runtime
    from ..datasets.loading import load_prompts

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    ns = load_reference(cfg.reference)
    folder = convert_gguf(default_model_path())
    # the reference's torch work runs on transient threads (native.on_transient_thread): on the main thread its
    # OpenMP pool would slow forerun's engine thread
    hf = on_transient_thread(lambda: AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval())
    hf.generation_config.eos_token_id = None
    tok = AutoTokenizer.from_pretrained(str(folder))
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    ref, fr = [], []
    with open_runtime("default", engine_config=EngineConfig(num_threads=cfg.threads)) as runtime:
        for p in load_prompts("math500", limit=cfg.prompts):
            ids = chat_prompt_ids(runtime.tokenizer, p.messages())
            ref += on_transient_thread(_reference_steps, ns, hf, tok, ids, cfg)
            fr += _forerun_steps(runtime, ids, cfg)
    return _summary(ref, fr, cfg)


def _summary(ref: list, fr: list, cfg: ReferenceConfig) -> dict[str, Any]:
    import torch

    mean_t = lambda s: statistics.mean(t for t, _ in s)
    per_token = lambda s: sum(t for t, _ in s) / sum(n for _, n in s)
    length = (cfg.n + 1) / 2
    return {"n": cfg.n, "K": cfg.K, "alpha": cfg.alpha, "prompts": cfg.prompts, "threads": torch.get_num_threads(),
            "steps": [len(ref), len(fr)], "mean_suffix_tokens": [statistics.mean(n for _, n in ref),
                                                                 statistics.mean(n for _, n in fr)],
            "reference_s_per_step": mean_t(ref), "forerun_s_per_step": mean_t(fr),
            "ratio_per_step_raw": mean_t(ref) / mean_t(fr),
            "reference_s_per_step_fitted": fitted_step(ref, length), "forerun_s_per_step_fitted": fitted_step(fr, length),
            "ratio_per_step_fitted": fitted_step(ref, length) / fitted_step(fr, length),
            "ratio_per_generated_token": per_token(ref) / per_token(fr)}
