"""One evaluation prompt and the user message it becomes (the instruction formats per category)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Callable

from .registry import DATASETS, DatasetError

LETTERS = "ABCDEFGHIJ"
"""Option letters of multiple-choice prompts, in presentation order."""


@dataclass(frozen=True)
class Prompt:
    """One evaluation prompt."""

    dataset: str
    """Registry name of the dataset (e.g. "math500", "lcb-v5")."""
    id: str
    """Upstream identifier (unique_id, ID, task_id, Record ID, ...)."""
    question: str
    """The problem text as upstream wrote it (for code: the function stub / task description)."""
    answer: str | None
    """Gold answer for graders: math answer string, MC letter, or reference code; None when there is none."""
    choices: tuple[str, ...] | None = None
    """Answer options in presentation order (multiple-choice only)."""
    extra: dict[str, Any] = field(default_factory=dict, hash=False, compare=True)
    """Dataset-specific fields graders need (tests, entry_point, subject, answer_index, ...)."""

    def fingerprint(self) -> str:
        """`_sha16` of the question, answer, choices and extra: what a run file's results were graded against, so
        that `eval --resume` with another dataset file under the same ids is refused."""
        return _sha16([self.question, self.answer, self.choices, self.extra])

    def messages_fingerprint(self, system: str | None = None) -> str:
        """`_sha16` of `messages(system)`: the chat the model is shown, instruction wording included, so that
        `eval --resume` under a forerun that words its instructions otherwise is refused.  What turns the chat into
        token ids is in the run header (--no-chat-template, --thinking) and in each record's `input_sha` (the ids
        the model's tokenizer and chat template made: `ids_fingerprint`)."""
        return _sha16(self.messages(system))

    @property
    def category(self) -> str:
        """"math", "code" or "mc"."""
        return DATASETS[self.dataset].category

    @property
    def text(self) -> str:
        """The problem text (alias of `question`)."""
        return self.question

    def user_message(self) -> str:
        """The instruction text sent as the user turn (see the module docstring for the formats)."""
        return _USER_MESSAGE[self.category](self)

    def messages(self, system: str | None = None) -> list[dict[str, str]]:
        """Chat messages: a system turn holding `system` when given (`--system`), then one user turn holding
        `user_message()`."""
        turns = [{"role": "system", "content": system}] if system else []
        return [*turns, {"role": "user", "content": self.user_message()}]

    def chat_prompt(self, tokenizer: Any) -> str:
        """The user turn rendered with the tokenizer's chat template, ready for the assistant's answer."""
        return tokenizer.apply_chat_template(self.messages(), tokenize=False, add_generation_prompt=True)


def ids_fingerprint(ids: Any) -> str:
    """`_sha16` of token ids: the prompt a model was given (what a run file's `input_sha` keeps), so that `eval
    --resume` under another tokenizer or chat template with the same model name is refused."""
    return _sha16([int(t) for t in ids])


def _sha16(value: Any) -> str:
    """16 hex digits of sha256 over `value` as sorted-key JSON: the prompt fingerprints a run file's records keep."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=repr).encode()).hexdigest()[:16]


def _math_message(p: Prompt) -> str:
    return f"{p.question.strip()}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."


def _mc_message(p: Prompt) -> str:
    if not p.choices:
        raise DatasetError(f"{p.dataset} prompt {p.id} has no choices")
    options = "\n".join(f"{LETTERS[i]}) {c.strip()}" for i, c in enumerate(p.choices))
    return (f"Answer the following multiple-choice question.\n\n{p.question.strip()}\n\n{options}\n\n"
            f"Think step by step, then give the letter of the correct option within \\boxed{{}}, "
            f"for example \\boxed{{A}}.")


def _code_message(p: Prompt) -> str:
    if p.dataset == "humaneval":
        return ("Complete the following Python function. Give the whole function, including its signature, "
                f"in one ```python code block.\n\n```python\n{p.question}```")
    if p.dataset == "mbpp":
        tests = "\n".join(p.extra.get("test_list", ()))
        return (f"{p.question.strip()}\nYour code should pass these tests:\n\n{tests}\n\n"
                "Write the Python solution in one ```python code block.")
    starter = p.extra.get("starter_code") or ""
    if starter.strip():
        how = ("Complete the following starter code; your solution must define it exactly as given:\n\n"
               f"```python\n{starter.rstrip()}\n```")
    else:
        how = "Your program must read the input from standard input and write the answer to standard output."
    return (f"Solve the following programming problem in Python.\n\n{p.question.strip()}\n\n{how}\n\n"
            "Give the complete solution in one ```python code block.")


_USER_MESSAGE: dict[str, Callable[[Prompt], str]] = {"math": _math_message, "mc": _mc_message, "code": _code_message}
