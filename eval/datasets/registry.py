"""The registry of the seven evaluation datasets (PreSTO Table 3): names, aliases, files, sources."""

from __future__ import annotations

from dataclasses import dataclass


class DatasetError(ValueError):
    """A dataset file or row is missing or malformed (the message names the file and line)."""


@dataclass(frozen=True)
class DatasetSpec:
    """One entry of `DATASETS`."""

    name: str
    category: str
    files: tuple[str, ...]
    """File names in the data directory."""
    packaged: tuple[str, ...]
    """File names of the packaged slices (empty: never packaged)."""
    size: int
    """Rows of the full offline copy (0: no offline copy ships; the user supplies the file)."""
    hf: str
    """Hugging Face source (Table 3), for `hub=True`."""
    aliases: tuple[str, ...] = ()
    note: str = ""


DATASETS: dict[str, DatasetSpec] = {
    s.name: s
    for s in (
        DatasetSpec("math500", "math", ("math500.jsonl",), ("math500.jsonl",), 500, "HuggingFaceH4/MATH-500"),
        DatasetSpec("aime", "math", ("aime2024.jsonl", "aime2025.jsonl"), ("aime2024.jsonl", "aime2025.jsonl"), 60,
                    "Maxwell-Jia/AIME_2024 + MathArena/aime_2025", aliases=("aime24+25", "aime2425", "aime24&25"),
                    note="Table 3 lists 45 instances; all 60 are used (2024 I+II, then 2025 I+II)"),
        DatasetSpec("aime2024", "math", ("aime2024.jsonl",), ("aime2024.jsonl",), 30, "Maxwell-Jia/AIME_2024"),
        DatasetSpec("aime2025", "math", ("aime2025.jsonl",), ("aime2025.jsonl",), 30, "MathArena/aime_2025"),
        DatasetSpec("humaneval", "code", ("humaneval.jsonl",), ("humaneval.jsonl",), 164, "openai/openai_humaneval"),
        DatasetSpec("mbpp", "code", ("mbpp.jsonl",), ("mbpp.jsonl",), 500, "google-research-datasets/mbpp",
                    note="standard test split of the full set (task_id 11-510); Table 3's 257 is the sanitized split"),
        DatasetSpec("lcb-v5", "code", ("lcb.jsonl",), (), 279, "livecodebench/code_generation_lite (release_v5)",
                    aliases=("lcb", "livecodebench"), note="release_v5, public tests only; not LCB v6"),
        DatasetSpec("lcb-v6", "code", ("lcb_v6.jsonl",), (), 0, "livecodebench/code_generation_lite (release_v6)",
                    aliases=("livecodebench-v6",),
                    note="not shipped: release_v6 rows in lcb.jsonl's schema, given as a file"),
        DatasetSpec("gpqa", "mc", ("gpqa_diamond.csv",), (), 198, "Idavidrein/gpqa (gpqa_diamond)",
                    aliases=("gpqa-diamond", "gpqa_diamond"), note="choices shuffled per question at load time"),
        DatasetSpec("mmlu", "mc", ("mmlu_test.jsonl",), ("mmlu.jsonl",), 14042, "cais/mmlu (all, test)"),
    )
}
ALIASES = {alias: spec.name for spec in DATASETS.values() for alias in (spec.name, *spec.aliases)}


def dataset_spec(name: str) -> DatasetSpec:
    """The registry entry for `name` or one of its aliases (case-insensitive)."""
    key = name.strip().lower()
    if key not in ALIASES:
        raise KeyError(f"unknown dataset {name!r}; known: {', '.join(sorted(DATASETS))} "
                       f"(aliases: {', '.join(sorted(a for a in ALIASES if a not in DATASETS))})")
    return DATASETS[ALIASES[key]]
