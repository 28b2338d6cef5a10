"""Session text: the ChatML templates of a session's regions, and their injection-safe encoding.

A template's own framing (`<|im_start|>user\\n`, `<|im_end|>`) is encoded with special-token parsing on,
so it keeps its special tokens; the user content put into it (data batches, queries, tool calls, tool
results, the system text) is encoded with special-token parsing **off** (Hugging Face tokenizers:
`split_special_tokens=True`), so a data batch containing the text `<|im_end|>` stays plain text and can
never close a turn or open a role.

    notion                              code
    framing (special tokens parsed)     encode_framing
    user content (parsing off)          encode_content
    template with one {field}           render(tokenizer, template, field, value)
    a frozen history message            render_message(tokenizer, fmt, role, content)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SessionFormat:
    """Text templates of a session's regions (ChatML, as SmolLM2-Instruct uses)."""

    system: str = "<|im_start|>system\n{system}<|im_end|>\n"
    """The frozen system region."""
    data: str = "<|im_start|>user\nNew data: {data}<|im_end|>\n"
    """One streamed data batch (a committed update)."""
    query: str = "<|im_start|>user\n{query}<|im_end|>\n"
    """A query prefix."""
    header: str = "<|im_start|>assistant\n"
    """The assistant header that opens an answer (an answer lead-in such as "Status:" may follow)."""
    turn_end: str = "<|im_end|>\n"
    """Closes a committed assistant turn."""
    tool_call: str = "<|im_start|>assistant\n<tool_call>\n{call}\n</tool_call><|im_end|>\n"
    """An emitted tool call, committed to the state."""
    tool_result_open: str = "<|im_start|>user\n<tool_response>\n"
    """The tool-result framing that precedes the payload (the start of the post-tool-call envelope)."""
    tool_result_close: str = "\n</tool_response><|im_end|>\n"
    """Framing after the payload; the envelope continues with `header`."""
    message: str = "<|im_start|>{role}\n{content}<|im_end|>\n"
    """One message of a frozen history (few-shot examples after the system region)."""

    def __post_init__(self) -> None:
        for name, key in (("system", "{system}"), ("data", "{data}"), ("query", "{query}"), ("tool_call", "{call}"),
                          ("message", "{content}")):
            template = getattr(self, name)
            if template.count(key) != 1:
                raise ValueError(f"{name} template must contain {key} exactly once")
        if not self.header:
            raise ValueError("header must not be empty (the decision point needs an entry token)")


_ROLE = re.compile(r"^[a-z_]+$")


def render_message(tokenizer: Any, fmt: SessionFormat, role: str, content: str) -> list[int]:
    """One history message: the role is framing (checked: lowercase letters), the content plain text."""
    if not isinstance(role, str) or not _ROLE.match(role):
        raise ValueError(f"message role must be lowercase letters (user, assistant, system), got {role!r}")
    return render(tokenizer, fmt.message.replace("{role}", role), "content", content)


def encode_framing(tokenizer: Any, text: str) -> list[int]:
    """A template's own text: special tokens written in it are parsed (`<|im_end|>` -> its id)."""
    return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)] if text else []


def encode_content(tokenizer: Any, text: str) -> list[int]:
    """User content with special-token parsing off: `<|im_end|>` in it stays plain text.

    Raises ValueError when the tokenizer cannot do that (its output would still hold a special token).
    """
    if not isinstance(text, str):
        raise ValueError(f"session content must be text, got {type(text).__name__}")
    if not text:
        return []
    try:
        ids = [int(t) for t in tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)]
    except TypeError as exc:  # a tokenizer without the option
        raise ValueError(f"{type(tokenizer).__name__} cannot encode content with special-token parsing off "
                         "(split_special_tokens)") from exc
    special = special_token_ids(tokenizer)
    leaked = [t for t in ids if t in special]
    if leaked:
        raise ValueError(f"{type(tokenizer).__name__} still parsed special token {leaked[0]} in user content "
                         "(split_special_tokens had no effect)")
    return ids


def special_token_ids(tokenizer: Any) -> set[int]:
    """Ids of every special token (the named ones and added specials such as `<|im_end|>`)."""
    ids = {int(t) for t in getattr(tokenizer, "all_special_ids", ()) or ()}
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids |= {int(k) for k, v in added.items() if getattr(v, "special", False)}
    return ids


_TRAILING_SPACE = re.compile(r"[ \t]+$")


def render(tokenizer: Any, template: str, key: str, value: str) -> list[int]:
    """Encode `template` with `{key}` replaced by `value`: framing parsed, `value` as plain content.

    Spaces right before the field travel with the content ("New data: " + "1.5" encodes as "New data:"
    + " 1.5"), so the value's first word keeps its usual leading-space token.
    """
    marker = "{" + key + "}"
    if template.count(marker) != 1:
        raise ValueError(f"template must contain {marker} exactly once: {template!r}")
    pre, post = template.split(marker)
    m = _TRAILING_SPACE.search(pre)
    lead = ""
    if m is not None:
        pre, lead = pre[: m.start()], m.group(0)
    return encode_framing(tokenizer, pre) + encode_content(tokenizer, lead + value) + encode_framing(tokenizer, post)
