"""Session text: the ChatML templates of a session's regions, and their injection-safe encoding.

A template's own framing (`<|im_start|>user\\n`, `<|im_end|>`) is encoded with special-token parsing on,
so it keeps its special tokens; the user content put into it (data batches, queries, tool calls, tool
results, the system text) is encoded with special-token parsing **off**, so a data batch containing the
text `<|im_end|>` stays plain text and can never close a turn or open a role.

Encoding never changes the caller's tokenizer.  A Hugging Face fast tokenizer keeps "parse special tokens"
as a flag on its one shared Rust backend, and `tokenizer(text, split_special_tokens=True)` *sets* that
flag for the call: two threads encoding framing and content at once then read each other's setting
(control tokens encoded as text, or user text parsed into control tokens).  `TextEncoder` therefore owns
two private copies of the backend, built once per tokenizer, one with parsing on (framing) and one with
parsing off (content); neither flag ever changes after construction, so any number of threads may encode
at once.  Framing ids are computed once per template string and then reused (`TextEncoder.framing`).
A tokenizer without a Rust backend (a slow or custom tokenizer) is called with the call argument
`split_special_tokens=True`, which such tokenizers read per call.

    notion                              code
    one tokenizer's encoder (shared)    text_encoder(tokenizer) -> TextEncoder
    framing (special tokens parsed)     encode_framing / TextEncoder.framing (cached per string)
    user content (parsing off)          encode_content / TextEncoder.content
    template with one {field}           render(tokenizer, template, field, value)
    a frozen history message            render_message(tokenizer, fmt, role, content)
"""

from __future__ import annotations

import re
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from ..runtime_ext.engine.models import special_token_ids


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


class TextEncoder:
    """Framing and content encoding for one tokenizer that never mutates it (module docstring).

    Thread-safe: after construction nothing in it changes except the framing cache, a dict written under
    a lock.  Build it through `text_encoder(tokenizer)` (one per tokenizer).
    """

    def __init__(self, tokenizer: Any) -> None:
        try:  # weakly: the registry below is keyed weakly by the tokenizer, so its value must not keep it alive
            ref = weakref.ref(tokenizer)
            self._tokenizer = ref
        except TypeError:
            self._tokenizer = lambda: tokenizer
        self._name = type(tokenizer).__name__
        self.special = frozenset(special_token_ids(tokenizer))
        """Ids user content may never produce."""
        self._framing_cache: dict[str, tuple[int, ...]] = {}
        self._lock = threading.Lock()
        backend = _rust_backend(tokenizer)
        self._parse: Any = None
        self._literal: Any = None
        if backend is not None:
            self._parse = _private_copy(backend, encode_special_tokens=False)
            self._literal = _private_copy(backend, encode_special_tokens=True)

    @property
    def tokenizer(self) -> Any:
        """The tokenizer this encoder was built for (None once it is gone)."""
        return self._tokenizer()

    @property
    def owns_copies(self) -> bool:
        """True when encoding runs on private backend copies (a Hugging Face fast tokenizer)."""
        return self._literal is not None

    def framing(self, text: str) -> list[int]:
        """A template's own text: special tokens written in it are parsed (`<|im_end|>` -> its id).

        Computed once per distinct string (templates are few) and reused: control-token ids are fixed.
        """
        if not text:
            return []
        ids = self._framing_cache.get(text)
        if ids is None:
            if self._parse is not None:
                ids = tuple(int(t) for t in self._parse.encode(text, add_special_tokens=False).ids)
            else:
                ids = tuple(int(t) for t in self.tokenizer.encode(text, add_special_tokens=False))
            with self._lock:
                if len(self._framing_cache) < _FRAMING_CACHE_SIZE:
                    self._framing_cache.setdefault(text, ids)
        return list(ids)

    def content(self, text: str) -> list[int]:
        """User content with special-token parsing off: `<|im_end|>` in it stays plain text.

        Raises ValueError when the tokenizer cannot do that (its output would still hold a special token).
        """
        if not isinstance(text, str):
            raise ValueError(f"session content must be text, got {type(text).__name__}")
        if not text:
            return []
        if self._literal is not None:
            ids = [int(t) for t in self._literal.encode(text, add_special_tokens=False).ids]
        else:
            try:  # a tokenizer without a shared backend flag reads the option per call
                ids = [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)]
            except TypeError as exc:  # a tokenizer without the option
                raise ValueError(f"{self._name} cannot encode content with special-token parsing "
                                 "off (split_special_tokens)") from exc
        leaked = [t for t in ids if t in self.special]
        if leaked:
            raise ValueError(f"{self._name} still parsed special token {leaked[0]} in user content "
                             "(split_special_tokens had no effect)")
        return ids


_FRAMING_CACHE_SIZE = 4096
_ENCODERS: "weakref.WeakKeyDictionary[Any, TextEncoder]" = weakref.WeakKeyDictionary()
_ENCODERS_BY_ID: dict[int, TextEncoder] = {}
_ENCODERS_LOCK = threading.Lock()


def text_encoder(tokenizer: Any) -> TextEncoder:
    """The one `TextEncoder` of `tokenizer` (built on first use, then shared by every session and thread)."""
    try:
        enc = _ENCODERS.get(tokenizer)
    except TypeError:  # neither hashable nor weakly referenceable: keyed by identity, kept for the process
        enc = _ENCODERS_BY_ID.get(id(tokenizer))
        if enc is not None and enc.tokenizer is tokenizer:
            return enc
        with _ENCODERS_LOCK:
            enc = _ENCODERS_BY_ID.get(id(tokenizer))
            if enc is None or enc.tokenizer is not tokenizer:
                enc = _ENCODERS_BY_ID[id(tokenizer)] = TextEncoder(tokenizer)
        return enc
    if enc is not None:
        return enc
    with _ENCODERS_LOCK:
        enc = _ENCODERS.get(tokenizer)
        if enc is None:
            enc = TextEncoder(tokenizer)
            _ENCODERS[tokenizer] = enc
    return enc


def _rust_backend(tokenizer: Any) -> Any:
    """The `tokenizers.Tokenizer` behind a Hugging Face fast tokenizer (its public `backend_tokenizer`), else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str") or not hasattr(backend, "encode_special_tokens"):
        return None
    return backend


def _private_copy(backend: Any, *, encode_special_tokens: bool) -> Any:
    """A copy of a `tokenizers.Tokenizer` with special-token parsing fixed (and no truncation or padding, as
    `tokenizer.encode(text)` runs it); only this module holds it, and nothing changes it afterwards."""
    from tokenizers import Tokenizer

    copy = Tokenizer.from_str(backend.to_str())
    copy.no_truncation()
    copy.no_padding()
    copy.encode_special_tokens = encode_special_tokens
    return copy


def encode_framing(tokenizer: Any, text: str) -> list[int]:
    """A template's own text: special tokens written in it are parsed (`<|im_end|>` -> its id)."""
    return text_encoder(tokenizer).framing(text)


def encode_content(tokenizer: Any, text: str) -> list[int]:
    """User content with special-token parsing off: `<|im_end|>` in it stays plain text.

    Raises ValueError when the tokenizer cannot do that (its output would still hold a special token).
    """
    if not isinstance(text, str):
        raise ValueError(f"session content must be text, got {type(text).__name__}")
    return text_encoder(tokenizer).content(text)


_TRAILING_SPACE = re.compile(r"[ \t]+$")


def render(tokenizer: Any, template: str, key: str, value: str) -> list[int]:
    """Encode `template` with `{key}` replaced by `value`: framing parsed, `value` as plain content.

    Spaces right before the field travel with the content ("New data: " + "1.5" encodes as "New data:"
    + " 1.5"), so the value's first word keeps its usual leading-space token.
    """
    marker = "{" + key + "}"
    if template.count(marker) != 1:
        raise ValueError(f"template must contain {marker} exactly once: {template!r}")
    if not isinstance(value, str):
        raise ValueError(f"session content must be text, got {type(value).__name__}")
    pre, post = template.split(marker)
    m = _TRAILING_SPACE.search(pre)
    lead = ""
    if m is not None:
        pre, lead = pre[: m.start()], m.group(0)
    enc = text_encoder(tokenizer)
    return enc.framing(pre) + enc.content(lead + value) + enc.framing(post)
