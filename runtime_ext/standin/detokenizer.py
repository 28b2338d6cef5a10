"""The text of a stand-in response, as SGLang 0.5.23's detokenizer makes it from the output ids the scheduler
sends (`stopping.StopRules.send_points`): a response's `text` is the concatenation of what each send added.

    SGLang 0.5.23 (site-packages/sglang/srt/...)                         stand-in
    managers/schedule_batch.py Req.init_incremental_detokenize (L1788):  IncrementalText(prompt_ids)
      the ids decoded are the last 5 prompt tokens (context, never part
      of the text) + the output ids
    managers/detokenizer_manager.py _decode_batch_token_id_output        IncrementalText.send
      (L300-427): new text = decode(context + ids)[len(decode(context)):]
      with skip_special_tokens (the sampling default: EOS spells
      nothing); an unfinished send whose new text ends in U+FFFD (an
      incomplete UTF-8 character) sends only find_printable_text of it
      (sglang/utils.py L345: up to the last space) and keeps its offsets
    trim_matched_stop (L194-226), on the finished send: a matched token   trim_matched_stop
      id drops the last output token from the decoded ids; a matched
      string (a stop string, or a stop_regex pattern taken literally)
      cuts the text at its first occurrence, before it - or after it
      with no_stop_trim; the finished send adds the trimmed text past
      what earlier sends already added
    managers/tokenizer_manager.py: a response's text is the sends'        text_after_each_send
      concatenation (ReqState.append_text); a streamed chunk carries the
      text so far (L2006-2014 fill in the deferred text)
"""

from __future__ import annotations

from typing import Any, Sequence

CONTEXT_TOKENS = 5
"""INIT_INCREMENTAL_DETOKENIZATION_OFFSET (schedule_batch.py L163): prompt tokens decoded as context."""
REPLACEMENT_CHAR = "\ufffd"


def _is_cjk(cp: int) -> bool:
    """sglang.utils._is_chinese_char: a code point of the CJK Unified Ideographs blocks."""
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def find_printable_text(text: str) -> str:
    """sglang.utils.find_printable_text: the longest prefix of whole words (through a final newline, a CJK
    character, or the last space)."""
    if text.endswith("\n"):
        return text
    if text and _is_cjk(ord(text[-1])):
        return text
    if len(text) > 1 and _is_cjk(ord(text[-2])):
        return text[:-1]
    return text[: text.rfind(" ") + 1]


def trim_matched_stop(output: str | list[int], finish: dict[str, Any] | None, no_stop_trim: bool) -> Any:
    """DetokenizerManager.trim_matched_stop: ids lose their last token when a token id matched; text is cut
    at the first occurrence of a matched string (before it, or after it with no_stop_trim)."""
    matched = (finish or {}).get("matched")
    if isinstance(matched, str) and isinstance(output, str):
        pos = output.find(matched)
        if pos == -1:
            return output
        return output[: pos + len(matched)] if no_stop_trim else output[:pos]
    if isinstance(matched, int) and isinstance(output, list) and not no_stop_trim:
        return output[:-1]
    return output


class IncrementalText:
    """One request's detokenizer state (DecodeStatus): what each send of its output adds to the text."""

    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int], no_stop_trim: bool) -> None:
        self.tokenizer = tokenizer
        self.no_stop_trim = no_stop_trim
        context = list(prompt_ids[-CONTEXT_TOKENS:])
        self.decode_ids = context
        self.surr_offset = 0
        self.read_offset = len(context)
        self.decoded_text = ""
        """Text committed so far (clean sends)."""
        self.sent_offset = 0
        """Characters sent so far (committed + printable parts of unclean sends)."""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if ids else ""

    def send(self, new_ids: Sequence[int], finish: dict[str, Any] | None) -> str:
        """The text one send adds: `new_ids` are the output ids since the last send, `finish` the finish_reason
        on the finished send (None before)."""
        self.decode_ids.extend(int(t) for t in new_ids)
        read_ids = trim_matched_stop(self.decode_ids[self.surr_offset:], finish, self.no_stop_trim)
        surr_text = self._decode(self.decode_ids[self.surr_offset:self.read_offset])
        new_text = self._decode(read_ids)[len(surr_text):]
        if finish is None:
            pending = self.sent_offset - len(self.decoded_text)
            if new_text and not new_text.endswith(REPLACEMENT_CHAR):
                self.decoded_text += new_text
                self.surr_offset, self.read_offset = self.read_offset, len(self.decode_ids)
                self.sent_offset = len(self.decoded_text)
                return new_text[pending:]
            printable = find_printable_text(new_text)
            self.sent_offset = len(self.decoded_text) + len(printable)
            return printable[pending:]
        output = trim_matched_stop(self.decoded_text + new_text, finish, self.no_stop_trim)
        added = output[self.sent_offset:]
        self.sent_offset = len(output)
        return added


def text_after_each_send(tokenizer: Any, prompt_ids: Sequence[int], output_ids: Sequence[int],
                         send_points: Sequence[int], finish: dict[str, Any], no_stop_trim: bool) -> list[str]:
    """The response text after each send (the last one is the response's `text`); `send_points` are the
    numbers of output tokens sent so far at each send, the last one all of them (the finished send)."""
    state = IncrementalText(tokenizer, prompt_ids, no_stop_trim)
    texts, text, sent = [], "", 0
    for k, point in enumerate(send_points):
        last = k == len(send_points) - 1
        text += state.send(output_ids[sent:point], finish if last else None)
        sent = point
        texts.append(text)
    return texts
