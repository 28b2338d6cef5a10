"""Evaluation prompts read online from the Hugging Face datasets of PreSTO Table 3 (`load_prompts(hub=True)`).

Only when the `datasets` package is importable (it is not a forerun dependency) and the hub is reachable;
rows go through the same parsers as the offline copies (`parsers`), so a prompt is the same object
whichever way it was read.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from .parsers import (MBPP_TEST_IDS, as_aime, parse_aime2024, parse_aime2025, parse_gpqa, parse_humaneval, parse_lcb,
                      parse_math500, parse_mbpp, parse_mmlu)
from .prompt import Prompt
from .registry import DatasetError, DatasetSpec

__all__ = ["read_hub"]


def read_hub(spec: DatasetSpec, gpqa_seed: int) -> list[Prompt]:
    """The prompts of `spec` read from its Hugging Face source (Table 3), in upstream order."""
    if importlib.util.find_spec("datasets") is None:
        raise DatasetError("hub=True needs the Hugging Face `datasets` package (pip install datasets); it is not "
                           "a forerun dependency. Without it, point FORERUN_DATA_DIR at an offline copy.")
    import datasets as hf  # type: ignore[import-not-found]

    def rows(*args: Any, **kw: Any) -> list[dict[str, Any]]:
        return [dict(r) for r in hf.load_dataset(*args, **kw)]

    name = spec.name
    if name == "math500":
        return [parse_math500(r, f"hub:{spec.hf}[{i}]") for i, r in enumerate(rows("HuggingFaceH4/MATH-500", split="test"))]
    if name in ("aime2024", "aime2025", "aime"):
        out: list[Prompt] = []
        if name in ("aime2024", "aime"):
            out += [parse_aime2024(r, f"hub:Maxwell-Jia/AIME_2024[{i}]")
                    for i, r in enumerate(rows("Maxwell-Jia/AIME_2024", split="train"))]
        if name in ("aime2025", "aime"):
            for i, r in enumerate(rows("MathArena/aime_2025", split="train")):
                idx = int(r["problem_idx"])
                r = {"id": f"2025-{'I' if idx <= 15 else 'II'}-{(idx - 1) % 15 + 1}", "problem": r["problem"],
                     "answer": str(r["answer"])}
                out.append(parse_aime2025(r, f"hub:MathArena/aime_2025[{i}]"))
        if name == "aime":
            out = [as_aime(p) for p in out]
        return out
    if name == "humaneval":
        return [parse_humaneval(r, f"hub:{spec.hf}[{i}]")
                for i, r in enumerate(rows("openai/openai_humaneval", split="test"))]
    if name == "mbpp":
        got = [parse_mbpp(r, f"hub:{spec.hf}[{i}]")
               for i, r in enumerate(rows("google-research-datasets/mbpp", "full", split="test"))]
        return [p for p in got if p.extra["task_id"] in MBPP_TEST_IDS]
    if name in ("lcb-v5", "lcb-v6"):
        got = rows("livecodebench/code_generation_lite", split="test", version_tag="release_" + name[-2:],
                   trust_remote_code=True)
        return [parse_lcb(r, f"hub:{spec.hf}[{i}]", i, name) for i, r in enumerate(got)]
    if name == "gpqa":
        return [parse_gpqa(r, f"hub:{spec.hf}[{i}]", gpqa_seed)
                for i, r in enumerate(rows("Idavidrein/gpqa", "gpqa_diamond", split="train"))]
    if name == "mmlu":
        return [parse_mmlu(r, f"hub:{spec.hf}[{i}]", i) for i, r in enumerate(rows("cais/mmlu", "all", split="test"))]
    raise DatasetError(f"no hub loader for {name!r}")  # pragma: no cover
