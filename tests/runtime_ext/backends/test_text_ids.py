"""Program text after earlier ids is tokenized as it would be inside the whole text: a SentencePiece tokenizer
with a dummy prefix (Llama 2, Mistral) puts no space before it that the text does not have; byte-level BPE is
unchanged.  Oracle: the tokenizer's own encoding of the whole program text (what an SGLang server tokenizes)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, decoders
from transformers import LlamaTokenizer, PreTrainedTokenizerFast

from forerun.runtime_ext.backends.sglang_frontend import function, gen, select
from forerun.runtime_ext.backends.text_ids import continuation_ids, starts_at_word_boundary
from forerun.runtime_ext.backends.token_markers import token_ids
from forerun.runtime_ext.protocol import GenerateOutput
from forerun.runtime_ext.backends.token_exact import TokenExactBackend


def llama_style_tokenizer() -> LlamaTokenizer:
    """A small Llama-2-style tokenizer (Metaspace with a dummy prefix, byte fallback), built offline."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    merges = [("▁", "A"), ("▁", "B"), ("▁", "Q"), ("h", "i"), ("▁", "hi"), ("e", "s"), ("y", "es"), ("▁", "yes"),
              ("n", "o"), ("▁", "no")]
    for t in ["▁", "A", ":", "B", "Q", "h", "i", "y", "e", "s", "n", "o", *("".join(m) for m in merges)]:
        vocab.setdefault(t, len(vocab))
    return LlamaTokenizer(vocab=vocab, merges=merges)


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """A GPT-2-style byte-level BPE (no merges): SmolLM2's, Llama 3's and Qwen 2's kind of tokenizer."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_the_dummy_prefix_is_found_and_no_space_is_put_before_a_continuation():
    tok = llama_style_tokenizer()
    assert starts_at_word_boundary(tok)
    alone = tok.encode("\nA:", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(alone)[0] == "▁"  # the space no text has: what forerun sent before
    whole = tok.encode("Q: hi\nA:", add_special_tokens=False)
    head = tok.encode("Q: hi", add_special_tokens=False)
    assert whole[: len(head)] == head
    assert continuation_ids(tok, "\nA:") == whole[len(head):]
    # a continuation that starts with a space keeps it as the whole text does
    assert continuation_ids(tok, " yes") == tok.encode("A: yes", add_special_tokens=False)[2:]
    assert continuation_ids(tok, "") == []


@pytest.mark.parametrize("text", ["A:", "\nA:", " yes", "\n\nB", "  x", "\t", "é!", "Q: hi\n"])
def test_byte_level_bpe_is_tokenized_as_before(text):
    tok = byte_level_tokenizer()
    assert not starts_at_word_boundary(tok)
    assert continuation_ids(tok, text) == tok.encode(text, add_special_tokens=False)


class EchoBackend(TokenExactBackend):
    """Generates nothing; records the ids of every request (selects included)."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer, add_special_tokens=False)
        self.sent: list[list[int]] = []

    def run(self, input_ids, params):
        self.sent.append(list(input_ids))
        return GenerateOutput(tuple(input_ids), (), "", {"prompt_tokens": len(input_ids),
                                                         "input_token_logprobs": [(-1.0, i, None) for i in input_ids]})


@function
def answer(s, head, last):
    """Ids of "Q: hi" (as a generation leaves them), then the text "\nA:", then `last` (a gen or a select)."""
    s += token_ids(head)
    s += "\nA:"
    s += last


def sent_by(last) -> list[list[int]]:
    tok = llama_style_tokenizer()
    backend = EchoBackend(tok)
    answer.run(head=tok.encode("Q: hi", add_special_tokens=False), last=last, backend=backend).sync()
    return backend.sent


def test_a_program_sends_the_ids_an_sglang_server_would_tokenize_from_its_whole_text():
    whole = llama_style_tokenizer().encode("Q: hi\nA:", add_special_tokens=False)
    assert sent_by(gen("a", max_tokens=1)) == [whole]


def test_select_scores_each_choice_as_the_whole_text_tokenizes_it():
    tok = llama_style_tokenizer()
    want = [tok.encode(t, add_special_tokens=False) for t in ("Q: hi\nA: yes", "Q: hi\nA:no")]
    assert sorted(sent_by(select("x", choices=[" yes", "no"]))) == sorted(want)
