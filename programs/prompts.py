"""Prompt ids: the one chat-template encoder of forerun (samplers, benchmarks and the CLI use it)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

Messages = Sequence[Mapping[str, str]]


def chat_prompt_ids(tokenizer: Any, messages: Messages | str) -> list[int]:
    """Token ids of a prompt ready for the assistant's answer.

    `messages` is a chat (a list of {"role", "content"}) or the text of one user turn.  With a chat
    template the ids are the template's with the generation prompt; a tokenizer without one encodes the
    last message's text as is.
    """
    chat = [{"role": "user", "content": messages}] if isinstance(messages, str) else [dict(m) for m in messages]
    if not chat:
        raise ValueError("messages must hold at least one message")
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(chat, tokenize=True, add_generation_prompt=True, return_dict=False)
        return [int(t) for t in ids]
    return [int(t) for t in tokenizer.encode(chat[-1]["content"])]
