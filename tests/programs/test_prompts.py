"""The one chat-template encoder."""

from __future__ import annotations

import pytest

from forerun.programs.prompts import chat_prompt_ids


class Tok:
    def __init__(self, template):
        self.chat_template = template
        self.calls = []

    def encode(self, text):
        return [ord(c) for c in text]

    def apply_chat_template(self, messages, tokenize, add_generation_prompt, return_dict):
        self.calls.append((messages, tokenize, add_generation_prompt, return_dict))
        return [1] + [t for m in messages for t in self.encode(m["content"])] + [2]


def test_text_and_messages_through_the_template():
    tok = Tok("{{ messages }}")
    assert chat_prompt_ids(tok, "hi") == [1, 104, 105, 2]
    assert tok.calls[-1] == ([{"role": "user", "content": "hi"}], True, True, False)
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert chat_prompt_ids(tok, chat) == [1, 115, 117, 2]


def test_without_a_template_the_last_message_is_encoded():
    tok = Tok(None)
    assert chat_prompt_ids(tok, "hi") == [104, 105]
    assert chat_prompt_ids(tok, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == [98]
    with pytest.raises(ValueError, match="at least one"):
        chat_prompt_ids(tok, [])
