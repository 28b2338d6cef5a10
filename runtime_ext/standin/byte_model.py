"""The stand-in SGLang server's model: a tiny deterministic numpy "model" over a byte vocabulary, its tokenizer
and its prefix cache.  Tests recompute every number the stand-in server reports from `ByteModel`:

    paper / SGLang                        stand-in
    vocabulary                            256 byte tokens + BOS (256) + EOS (257)
    logits z(· | x_<t)                    ByteModel.logits(prefix): a fixed random bigram table row
                                          of the last token plus a small position term (seed 0)
    log p0(· | x_<t)                      log_softmax(z)
    log q_τ(· | x_<t) (reported)          log_softmax(z / τ), before top-k / top-p, as SGLang's sampler
                                          reports it (τ = 0: greedy, reports log p0)
    sampled distribution                  log q_τ restricted to top-k / top-p and renormalised
    sampling noise                        Gumbel-max with numpy Generator keyed by (sampling_seed, position)
    min_new_tokens                        `banned` tokens (EOS, stop ids) get logit -inf before every number
                                          above, as SGLang's MinNewTokens penalizer does before its sampler
    frequency_penalty, presence_penalty   z − f·count(y in the output so far) − p·[y in it], before every number
                                          above (SGLang's penalizers: output tokens only, the first token free)
    cached_tokens                         PrefixTrie.match: longest prefix of the prompt already inserted
                                          (prompt + output inserted after each request)

When a generation stops is `stopping.StopRules`' business, what its text is `detokenizer`'s.
"""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Sequence

import numpy as np

from .stopping import StopRules

BOS_ID = 256
EOS_ID = 257
VOCAB_SIZE = 258


def byte_tokenizer() -> Any:
    """The byte model's tokenizer, a real Hugging Face fast tokenizer: token i < 256 is byte i; BOS 256
    (prepended when encoding with special tokens), EOS 257.  The server saves it to a folder and reports
    that folder as its `tokenizer_path`, so clients load it like any other (`AutoTokenizer`)."""
    from ..engine.models import build_byte_tokenizer

    tok = build_byte_tokenizer(("<s>", "</s>"), eos_token="</s>", pad_token=None, bos_token="<s>", chat_template=None)
    assert tok.bos_token_id == BOS_ID and tok.eos_token_id == EOS_ID
    return tok


def _log_softmax(z: np.ndarray) -> np.ndarray:
    m = np.max(z[np.isfinite(z)]) if np.any(np.isfinite(z)) else 0.0
    e = np.exp(z - m)
    return z - m - np.log(np.sum(e))


class ByteModel:
    """Deterministic next-token logits over the byte vocabulary (float64)."""

    def __init__(self, seed: int = 0, scale: float = 2.0) -> None:
        rng = np.random.default_rng(seed)
        self.table = rng.normal(0.0, scale, size=(VOCAB_SIZE, VOCAB_SIZE))
        self.position_term = rng.normal(0.0, 0.5, size=(64, VOCAB_SIZE))
        # EOS rarely wins: tests that want full lengths still pass ignore_eos
        self.table[:, EOS_ID] -= 4.0
        self.penalty: np.ndarray | None = None

    def penalized(self, penalty: np.ndarray) -> "ByteModel":
        """This model with `penalty` (one value per token) subtracted from its logits, as SGLang's frequency and
        presence penalizers subtract theirs before the sampler sees the logits."""
        view = copy.copy(self)
        view.penalty = np.asarray(penalty, dtype=np.float64)
        return view

    def logits(self, prefix: Sequence[int], banned: Collection[int] = ()) -> np.ndarray:
        """z(· | prefix): bigram row of the last token plus a position term (prefix must be non-empty); the
        `banned` tokens' logits are -inf (SGLang's min_new_tokens penalty)."""
        if len(prefix) == 0:
            raise ValueError("the byte model needs a non-empty prefix")
        z = self.table[int(prefix[-1])] + self.position_term[len(prefix) % 64]
        if self.penalty is not None:
            z = z - self.penalty
        if banned:
            z = z.copy()
            z[list(banned)] = -np.inf
        return z

    def logp0(self, prefix: Sequence[int], banned: Collection[int] = ()) -> np.ndarray:
        """log p0(· | prefix)."""
        return _log_softmax(self.logits(prefix, banned))

    def entropy(self, prefix: Sequence[int], banned: Collection[int] = ()) -> float:
        """H(p0(· | prefix)) in nats."""
        lp = self.logp0(prefix, banned)
        lp = lp[np.isfinite(lp)]  # a banned token has p = 0 and adds nothing
        return float(-np.sum(np.exp(lp) * lp))

    def logq(self, prefix: Sequence[int], temperature: float, banned: Collection[int] = ()) -> np.ndarray:
        """log q_τ(· | prefix) = log_softmax(z / τ), what SGLang reports (τ = 0: greedy, reports log p0).

        As in SGLang's sampler, the reported logprobs are taken before top-k / top-p truncation.
        """
        if temperature == 0:
            return self.logp0(prefix, banned)
        return _log_softmax(self.logits(prefix, banned) / temperature)

    def sampling_logprobs(self, prefix: Sequence[int], temperature: float, top_k: int = -1,
                          top_p: float = 1.0, banned: Collection[int] = (), min_p: float = 0.0) -> np.ndarray:
        """The distribution actually sampled: log q_τ restricted to top-k / top-p, then to the tokens of at least
        min_p × the largest probability (SGLang's order), and renormalised."""
        lq = self.logq(prefix, temperature, banned)
        if 0 < top_k < VOCAB_SIZE:
            kth = np.sort(lq)[-top_k]
            lq = np.where(lq >= kth, lq, -np.inf)
        if top_p < 1.0:
            order = np.argsort(-lq, kind="stable")
            cum = np.cumsum(np.exp(lq[order]))
            keep = order[: int(np.searchsorted(cum, top_p) + 1)]
            mask = np.full_like(lq, -np.inf)
            mask[keep] = lq[keep]
            lq = mask
        if min_p > 0.0:
            lq = _log_softmax(lq)
            lq = np.where(np.exp(lq) >= min_p * np.exp(lq).max(), lq, -np.inf)
        return _log_softmax(lq)

    def sample(self, prefix: Sequence[int], temperature: float, top_k: int, top_p: float, seed: int,
               banned: Collection[int] = (), min_p: float = 0.0) -> int:
        """One token: argmax for τ = 0, else Gumbel-max over the sampled distribution, noise keyed by
        (seed, position)."""
        if temperature == 0:
            return int(np.argmax(self.logits(prefix, banned)))
        lq = self.sampling_logprobs(prefix, temperature, top_k, top_p, banned, min_p)
        rng = np.random.default_rng([int(seed) & 0xFFFFFFFFFFFFFFFF, len(prefix)])
        g = rng.gumbel(size=VOCAB_SIZE)
        return int(np.argmax(lq + g))


class PrefixTrie:
    """Token-prefix set (the stand-in's radix cache): longest cached prefix of a sequence."""

    def __init__(self) -> None:
        self.root: dict[int, dict] = {}
        self.lock = threading.Lock()

    def match(self, ids: Sequence[int]) -> int:
        with self.lock:
            node, n = self.root, 0
            for t in ids:
                if t not in node:
                    break
                node, n = node[t], n + 1
            return n

    def insert(self, ids: Sequence[int]) -> None:
        with self.lock:
            node = self.root
            for t in ids:
                node = node.setdefault(int(t), {})

    def clear(self) -> None:
        with self.lock:
            self.root = {}


GREEDY_BELOW = 1e-6
"""SamplingParams.__post_init__ (_SAMPLING_EPS): a temperature in [0, 1e-6) is greedy (top_k 1 at temperature 1)."""


@dataclass(frozen=True)
class Sampling:
    """How one request's tokens are drawn (SGLang's `sampling_params`, resolved); when it stops is its
    `StopRules`."""

    temperature: float
    top_k: int
    top_p: float
    min_new_tokens: int
    seed: int
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0


@dataclass
class Generation:
    """What one generation produced, per token: id, reported log q_τ, top-k of log q_τ as
    [logprob, id, text] (when asked), log p0, entropy of p0, log q_τ' at the asked temperatures τ' (one
    list per token); and SGLang's finish_reason."""

    ids: list[int] = field(default_factory=list)
    logq: list[float] = field(default_factory=list)
    top: list[list] = field(default_factory=list)
    logp0: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    logq_by_temp: list[list[float]] = field(default_factory=list)
    finish: dict[str, Any] = field(default_factory=dict)


def generate(model: ByteModel, prompt: Sequence[int], sampling: Sampling, rules: StopRules, top_logprobs_num: int,
             text_of: Callable[[int], str | None], temperatures: Sequence[float] = (),
             step_s: float = 0.0, grammar: Any = None) -> Generation:
    """Decode after `prompt` until `rules` finish it (every token is kept, the one that ends it too, as SGLang
    does); during the first min_new_tokens tokens EOS and the stop ids are masked, and the tokens a `grammar`
    (`constraints.ByteGrammar`) does not allow at every step.  max_new_tokens = 0 is SGLang's prefill-only
    request: no token, finish_reason length 0.  `step_s` sleeps per decode step (a GPU's step time, for
    scale-out benchmarks)."""
    s = sampling
    out = Generation(finish={"type": "length", "length": 0})
    if rules.max_new_tokens == 0:
        return out
    seq = list(prompt)
    counts = np.zeros(VOCAB_SIZE)
    while True:
        penalty = s.frequency_penalty * counts + s.presence_penalty * (counts > 0)
        step = model.penalized(penalty) if s.frequency_penalty or s.presence_penalty else model
        banned = rules.banned_before_min() if len(out.ids) < s.min_new_tokens else frozenset()
        if grammar is not None:
            banned = banned | grammar.disallowed()
            if len(banned) == VOCAB_SIZE:
                grammar.dead_end(len(out.ids))
        lq = step.logq(seq, s.temperature, banned)
        t = step.sample(seq, s.temperature, s.top_k, s.top_p, s.seed, banned, s.min_p)
        out.ids.append(t)
        out.logq.append(float(lq[t]))
        if top_logprobs_num > 0:
            top = np.argsort(-lq, kind="stable")[:top_logprobs_num]
            out.top.append([[float(lq[j]), int(j), text_of(int(j))] for j in top])
        lp0 = step.logp0(seq, banned)
        out.logp0.append(float(lp0[t]))
        out.entropy.append(step.entropy(seq, banned))
        out.logq_by_temp.append([float(step.logq(seq, tau, banned)[t]) for tau in temperatures])
        if step_s > 0:
            time.sleep(step_s)
        seq.append(t)
        counts[t] += 1
        if grammar is not None:
            grammar.accept(t)
        finish = rules.finish_after(out.ids, grammar is not None and grammar.terminated)
        if finish is not None:
            out.finish = finish
            return out
