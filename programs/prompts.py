"""Prompt ids: the one chat-template encoder of forerun (samplers, benchmarks and the CLI use it)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

Messages = Sequence[Mapping[str, str]]


def chat_prompt_ids(tokenizer: Any, messages: Messages | str, *, use_template: bool = True,
                    thinking: bool | None = None) -> list[int]:
    """Token ids of a prompt ready for the assistant's answer.

    `messages` is a chat (a list of {"role", "content"}) or the text of one user turn.  With a chat
    template (and `use_template`) the ids are the template's with the generation prompt; otherwise the
    messages' texts are encoded as they are, one after the other.  `thinking` (None: the template's default)
    is passed to templates that have a thinking switch (`enable_thinking`, e.g. Qwen3); a template without one
    raises ValueError.
    """
    chat = [{"role": "user", "content": messages}] if isinstance(messages, str) else [dict(m) for m in messages]
    if not chat:
        raise ValueError("messages must hold at least one message")
    template = getattr(tokenizer, "chat_template", None) if use_template else None
    if thinking is not None and "enable_thinking" not in (template or ""):
        raise ValueError("this model's chat template has no thinking switch (enable_thinking): drop --thinking")
    if template:
        extra = {} if thinking is None else {"enable_thinking": thinking}
        ids = tokenizer.apply_chat_template(chat, tokenize=True, add_generation_prompt=True, return_dict=False,
                                            **extra)
        return [int(t) for t in ids]
    texts = [m["content"] for m in chat] if not use_template else [chat[-1]["content"]]
    return [int(t) for t in tokenizer.encode("\n\n".join(texts))]
