"""The final-answer rules of the samplers that draw several candidates and return one, and the bias of each:
best-of-N (`baselines`) and Power-SMC (`power_smc`).  Plain data, no imports: the CLI lists them in its help
and the eval run header and report print them without loading a model.

    paper                                          code
    best-of-N by Σ log q_τ (PreSTO App. E.8)       SELECT_RULES["logq"]
    best-of-N by Σ log p0                          SELECT_RULES["logp0"]
    Power-SMC: a particle drawn ∝ w (reference)    FINAL_RULES["sample"]
    Power-SMC: argmax w                            FINAL_RULES["max"]
    Power-SMC: argmax Σ log p0 (mode-seeking)      FINAL_RULES["max-logp0"]

Why each rule is biased the way its text says: the module docstrings of `baselines` and `power_smc`.
"""

from __future__ import annotations

SELECT_RULES: dict[str, str] = {
    "logq": "the largest Σ log q_τ (E.8, default): π_α's ranking plus a bonus on high-entropy paths",
    "logp0": "the largest Σ log p0: the most likely of the N under π_α ∝ p0^α",
}
"""Best-of-N's selection rules and what each returns (both favour short, early-EOS samples)."""

FINAL_RULES: dict[str, str] = {
    "sample": "a particle drawn ∝ its final weight: one draw from the SMC approximation of π_α (default)",
    "max": "the largest importance weight (not the most likely under π_α: weights restart at each resampling)",
    "max-logp0": "the largest Σ log p0, the most likely particle under π_α ∝ p0^α (mode-seeking; favours short "
                 "responses)",
}
"""The final-answer rules of Power-SMC and what each returns."""


def rule_line(method: str, rule: str) -> str:
    """'<method> selects by <rule>: <what it returns and its bias>' for best-of-n or power-smc."""
    rules = SELECT_RULES if method == "best-of-n" else FINAL_RULES
    return f"{method} selects by {rule}: {rules[rule]}"
