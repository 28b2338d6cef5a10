"""The certainty classifier that ships with forerun: what the predictive traversal uses without --classifier.

`data/power-mh-smollm2.json` is a `CertaintyClassifier` JSON (cut fraction c_j/T only, App. E.7) fitted on
scored-node records of PowerMH chains of the default model (SmolLM2-135M-Instruct) at the CPU defaults, on
MATH500 prompts that the benchmark never uses (indices 5-44; `forerun bench presto` reads the first ones).
Its "training" block records the model, sampler, settings, the exact commands, the number of records and
the date; `scripts/train_shipped_classifier` regenerates it.

The classifier stays usable on any model and sampler: ĥ only orders the prefetched subtree, so a poor ĥ can
cost transitions per call, never exactness (the MH chain is the same under any traversal).  When the model or
the sampler differs from the ones it was trained on, `mismatch_note` says so in one line (the commands print
it as a warning on stderr).
"""

from __future__ import annotations

import importlib.resources
import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from .certainty import CertaintyClassifier

__all__ = ["SHIPPED_FILE", "ShippedClassifier", "shipped_text", "load_shipped", "mismatch_note"]

SHIPPED_FILE = "power-mh-smollm2.json"
"""The shipped classifier's file name inside `forerun.classifiers.data`."""


@dataclass(frozen=True)
class ShippedClassifier:
    """The shipped classifier and what it was trained on."""

    classifier: CertaintyClassifier
    model: str
    """The model name the training chains ran on (the runtime's name, e.g. "SmolLM2-135M-Instruct")."""
    samplers: tuple[str, ...]
    """Sampler kinds it was trained for (e.g. ("power-mh",))."""
    training: Mapping[str, Any]
    """The whole "training" block: settings, commands, record count, date."""


def shipped_text() -> str:
    """The shipped JSON's text (read from the installed package)."""
    return (importlib.resources.files(__package__) / "data" / SHIPPED_FILE).read_text(encoding="utf-8")


def load_shipped() -> ShippedClassifier:
    """Load and validate the shipped classifier (a ValueError names the file when it is malformed)."""
    source = f"forerun.classifiers/data/{SHIPPED_FILE}"
    data = json.loads(shipped_text())
    training = data.get("training")
    if not isinstance(training, Mapping) or not training.get("model") or not training.get("samplers"):
        raise ValueError(f"{source}: missing 'training' block with 'model' and 'samplers'")
    model = CertaintyClassifier.from_dict(data, source=source)
    if model.kind != "logistic_regression" or model.training_size < 1:
        raise ValueError(f"{source}: expected a fitted logistic regression, got {model.kind!r}")
    return ShippedClassifier(model, str(training["model"]), tuple(str(s) for s in training["samplers"]),
                             dict(training))


def _model_id(name: str) -> str:
    """A model name without its hub organisation or folder: SGLang serves the model under its --model-path
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "/models/SmolLM2-135M-Instruct/"), forerun's own runtime under its
    folder's name ("SmolLM2-135M-Instruct")."""
    return name.rstrip("/").rsplit("/", 1)[-1]


def mismatch_note(shipped: ShippedClassifier, model: str | None, samplers: Iterable[str]) -> str | None:
    """One line when `model` (a runtime's name; None: unknown) or any of `samplers` differs from what the
    shipped classifier was trained on, else None."""
    parts = []
    if model is not None and _model_id(model) != _model_id(shipped.model):
        parts.append(f"model {model}")
    other = sorted(set(samplers) - set(shipped.samplers))
    if other:
        parts.append(f"sampler {', '.join(other)}")
    if not parts:
        return None
    return (f"the shipped certainty classifier was trained on {shipped.model} with {', '.join(shipped.samplers)}, "
            f"not {' / '.join(parts)}: its ĥ may order the subtree worse (chains stay identical); "
            "train one with `forerun classifier train` and pass --classifier")
