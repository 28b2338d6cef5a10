"""Model loading: tiny model determinism, byte tokenizer, HF folders, GGUF errors, the default model."""

from __future__ import annotations

import pytest
import torch

from forerun.runtime_ext.engine.models import LoadedModel, ModelLoadError, build_byte_tokenizer, load_model


def test_tiny_is_deterministic_and_float64_by_default():
    a, b = load_model("tiny"), load_model("tiny")
    assert isinstance(a, LoadedModel) and a.dtype == torch.float64 and a.name == "tiny"
    for (na, pa), (nb, pb) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert na == nb and torch.equal(pa, pb)
    assert a.eos_token_ids == (a.tokenizer.eos_token_id,)
    assert load_model("tiny", dtype="float32").model.dtype == torch.float32


@pytest.mark.parametrize("text", ["hello", "héllo wörld ☃ 𝔘 漢字", "\x00\n\t ", ""])
def test_byte_tokenizer_roundtrips_utf8(text):
    tok = build_byte_tokenizer()
    ids = tok.encode(text, add_special_tokens=True)
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text


def test_byte_tokenizer_decodes_cuts_inside_a_character():
    tok = build_byte_tokenizer()
    ids = tok.encode("a☃b")
    assert len(ids) == 5
    for cut in range(len(ids) + 1):
        assert isinstance(tok.decode(ids[:cut]), str)
    assert tok.decode(ids[:2]) == "a\ufffd"
    assert tok.decode([tok.eos_token_id], skip_special_tokens=True) == ""


def test_hf_folder_roundtrip(tmp_path):
    tiny = load_model("tiny")
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), dtype="float64")
    assert loaded.dtype == torch.float64 and loaded.max_context == tiny.max_context
    assert tiny.tokenizer.eos_token_id in loaded.eos_token_ids
    x = torch.tensor([[1, 2, 3, 200]])
    with torch.inference_mode():
        assert torch.allclose(tiny.model(input_ids=x).logits, loaded.model(input_ids=x).logits, atol=1e-12)


def test_bad_specs_raise_clear_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("FORERUN_MODEL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(str(tmp_path / "nope"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_model(str(bad))
    truncated = tmp_path / "trunc.gguf"
    truncated.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 7)
    with pytest.raises(ModelLoadError, match="could not read GGUF"):
        load_model(str(truncated))
    txt = tmp_path / "weights.bin"
    txt.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="not a .gguf"):
        load_model(str(txt))
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path))
    with pytest.raises(ValueError, match="dtype"):
        load_model("tiny", dtype="int8")


@pytest.mark.slow
def test_default_model_loads_from_the_wheel():
    m = load_model("default")
    assert m.name == "SmolLM2-135M-Instruct" and m.dtype == torch.float32
    assert m.max_context == 8192 and m.eos_token_ids
    assert m.tokenizer.decode(m.tokenizer.encode("Hello world")) == "Hello world"
