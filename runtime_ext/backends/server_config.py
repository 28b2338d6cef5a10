"""How forerun talks to a launched SGLang server: transport settings (`ServerConfig`), the statuses it retries,
and the gateway's routing header."""

from __future__ import annotations

import threading
import unicodedata
from dataclasses import dataclass
from urllib.parse import urlsplit

SERVER_URL_SCHEMES = ("http", "https")
"""What a server URL may start with (SGLang's HTTP API)."""

ROUTING_KEY_HEADER = "X-SMG-Routing-Key"
"""The SGLang Model Gateway's sticky-routing header (`smg`, policy `manual`: one key, one worker); a plain SGLang
server ignores it.  Every request of one chain carries the chain's key (`with_routing_key`), so behind a gateway
the chain's calls land on one worker and its radix prefix stays warm."""

TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})
NONDETERMINISTIC_NOTE = ("the server runs without --enable-deterministic-inference: seeds are ignored, so chains "
                         "are equal in law only (not token for token)")


@dataclass(frozen=True)
class ServerConfig:
    """How `SGLangServerClient` talks to the server (transport only; no paper symbols)."""

    timeout_s: float = 600.0
    """Read timeout of one HTTP request in seconds (a long generation must fit); default 600.  The CLI's
    `--request-timeout SECONDS` (every server-backed command) sets it."""
    connect_timeout_s: float = 10.0
    """TCP connect timeout in seconds; default 10."""
    retries: int = 3
    """Extra attempts after a transient failure (connection error, 5xx, 429); 0 disables; default 3."""
    backoff_s: float = 0.5
    """Sleep before the first retry; doubled (`backoff_factor`) each retry; default 0.5 s."""
    backoff_factor: float = 2.0
    """Growth of the backoff per retry; default 2."""
    max_backoff_s: float = 10.0
    """Cap on one backoff sleep; default 10 s."""
    batch_mode: str = "batched"
    """`run_batch`: "batched" (one /generate with input_ids as a list of lists) or "concurrent"
    (one request per item from a thread pool); default "batched"."""
    max_concurrency: int = 64
    """Threads used by batch_mode="concurrent"; default 64."""
    two_pass_logp0: bool = True
    """Run the scoring pass that yields log p0 of generated tokens when return_logprob is set; default True."""
    reuse_logq_at_unit_temperature: bool = True
    """At τ = 0 (greedy) and τ = 1 SGLang's reported output logprobs already are log p0: its sampler takes
    log_softmax(z / τ) before top-k/top-p (`srt/layers/sampler.py`; greedy requests run with τ = 1), so
    pass 2 is skipped and output_token_logp0 = the reported logprobs (not under min_new_tokens or a frequency /
    presence penalty: SGLang's penalizers change the logits first).  False: always run pass 2.  Default True."""
    use_plugin: bool | None = None
    """Ask the forerun sampler plugin (`launch_runtime --plugin`) for log p0, the entropy of p0 and log q at
    extra temperatures in the same pass: None (default) when /server_info reports the plugin, False never
    (always the exact two-pass recipe), True always (an error on a server without it)."""
    allow_nondeterministic: bool = False
    """Send seeded requests to a server without --enable-deterministic-inference (which ignores the seed):
    runs then reproduce only in law.  Default False: such requests are refused with an error naming the flag."""
    flush_wait_s: float = 60.0
    """`flush_cache` waits up to this long for the server to be idle (it answers 400 while requests run or
    wait), retrying; then it gives up and reports False.  Default 60 s."""

    def __post_init__(self) -> None:
        for name in ("timeout_s", "connect_timeout_s"):  # a socket timeout past TIMEOUT_MAX overflowed (exit 1)
            if not 0 < getattr(self, name) <= threading.TIMEOUT_MAX:
                raise ValueError(f"{name} must be > 0 and at most {threading.TIMEOUT_MAX:.0f} s, got "
                                 f"{getattr(self, name)}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if self.backoff_s < 0:
            raise ValueError(f"backoff_s must be >= 0, got {self.backoff_s}")
        if self.backoff_factor < 1:
            raise ValueError(f"backoff_factor must be >= 1, got {self.backoff_factor}")
        if self.max_backoff_s < 0:
            raise ValueError(f"max_backoff_s must be >= 0, got {self.max_backoff_s}")
        if self.batch_mode not in ("batched", "concurrent"):
            raise ValueError(f"batch_mode must be 'batched' or 'concurrent', got {self.batch_mode!r}")
        if self.flush_wait_s < 0:
            raise ValueError(f"flush_wait_s must be >= 0, got {self.flush_wait_s}")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")

    def backoff(self, attempt: int) -> float:
        """Sleep before retry number `attempt` (0-based)."""
        return min(self.max_backoff_s, self.backoff_s * self.backoff_factor**attempt)


def check_server_url(url: str) -> str:
    """`url` as a server URL (http[s]://host[:port][/path], trailing "/" removed), or ValueError saying what is
    wrong with it: empty, no scheme, a scheme other than http/https, no host, a port that is not a number,
    credentials (refused without echoing them), a query or a fragment."""
    text = url.strip()
    if not text:
        raise ValueError("a server URL must not be empty (expected http://host:port)")
    if "://" not in text:
        raise ValueError(f"{url!r} is not a server URL: expected http://host:port")
    try:
        parts = urlsplit(text)
    except ValueError as exc:  # "Invalid IPv6 URL": a bracket left open
        raise ValueError(f"{url!r}: {exc} (expected http://host:port)") from None
    if parts.scheme.lower() not in SERVER_URL_SCHEMES:
        raise ValueError(f"{url!r}: unsupported scheme {parts.scheme + '://'!r} (expected http:// or https://)")
    try:
        port = parts.port  # urlsplit checks the port when it is read
    except ValueError:
        port = 0
    if port == 0:  # port 0 is no server's: the HTTP client took it for "no port" and connected to 80
        raise ValueError(f"{url!r}: the port is not a number from 1 to 65535 (expected http://host:port)") from None
    if any(c.isspace() for c in text):
        raise ValueError(f"{url!r} contains white space (expected http://host:port)")
    if not parts.hostname:
        raise ValueError(f"{url!r} names no host (expected http://host:port)")
    if any(unicodedata.category(c) == "Cc" for c in text):  # was sent to the HTTP client, exit 1 as a server failure
        raise ValueError(f"{url!r} contains a control character (expected http://host:port)")
    try:
        parts.hostname.encode("idna")  # what the socket layer does with the name: it failed there, naming no option
    except UnicodeError:
        raise ValueError(f"{url!r}: {parts.hostname!r} is not a host name (an empty label, a label over 63 "
                         "characters or a character no host name has; expected http://host:port)") from None
    if parts.username is not None or parts.password is not None:  # never echoed: not even in this message
        raise ValueError(f"a server URL with credentials ({parts.scheme}://...@{parts.hostname}) is not supported: "
                         "forerun names its server URLs in messages and SGLang's server reads none")
    if parts.query or parts.fragment:
        raise ValueError(f"{url!r}: a server URL has no query or fragment (expected http://host:port[/path]); "
                         "the routes (/generate, ...) are added to it")
    return parts._replace(scheme=parts.scheme.lower()).geturl().rstrip("/")
