"""A user's .gguf file on the transformers backend: converted once into $SPECDEC_HOME/gguf (bf16
safetensors and the GGUF's own tokenizer), then loaded like a folder. On a tiny GGUF the tests
write themselves; the bundled pair's real conversion runs in the end-to-end tests."""

import pytest
import torch

import specdec
from tinymodels import byte_tokenizer, save_tiny_gguf, tiny_model

pytest.importorskip("gguf")


def test_gguf_file_converts_once_and_loads_like_a_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    model = tiny_model(0)
    path = save_tiny_gguf(model, byte_tokenizer(), tmp_path / "user" / "model.gguf")
    pair = specdec.load(str(path), draft=None, backend="transformers", dtype="float32", progress=False)
    (folder,) = [p for p in (tmp_path / "home" / "gguf").iterdir() if p.is_dir()]
    assert pair.backend == "transformers" and pair.encode("abc", chat=False) == byte_tokenizer().encode("abc")
    ids = byte_tokenizer().encode("def f(x): return")
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0, -1].float()
    got = pair.target.logits_for(ids)[0]
    # the cached folder holds bf16 weights: logits agree to bf16 rounding
    assert torch.allclose(got[: want.shape[-1]], want, atol=2e-2 * max(1.0, want.abs().max().item()))
    stamp = folder.stat().st_mtime_ns
    again = specdec.load(str(path), draft=None, backend="transformers", dtype="float32", progress=False)
    assert folder.stat().st_mtime_ns == stamp  # the second load reads the cache, converts nothing
    assert again.generate("abc", chat=False, policy="ar", max_new_tokens=3).token_ids == \
        pair.generate("abc", chat=False, policy="ar", max_new_tokens=3).token_ids
