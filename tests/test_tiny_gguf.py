"""The tiny random Qwen2 pair written as GGUF: llama.cpp loads it and computes transformers' logits,
and transformers rebuilds the byte tokenizer from it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tinymodels import byte_tokenizer, perturbed_copy, save_tiny_gguf, tiny_gguf_pair, tiny_model

llama_cpp = pytest.importorskip("llama_cpp")

# Max |llama.cpp - transformers| over 20 positions x 259 logits, measured on the 2-core AVX2 CPU
# machine (F32 KV cache, no flash attention): 1.8e-7 for the pair (logits up to 0.6), 8.2e-6 for the
# stressed model (logits up to 6.9). Writing q/k permuted as for llama-style rope gives 4.7e-3 and
# 6.9. The bound, relative to the largest logit, leaves room for other CPUs' summation orders.
RTOL = 2e-5
SEQ = list(b"def f(x):\n    return")[:20]  # 20 byte tokens
assert len(SEQ) == 20
# ascii, multi-byte utf-8 (2, 3 and 4 bytes), specials inside text, runs of blanks
TEXTS = ["hello world", "h\u00e9llo \u2192 \u65e5\u672c \U0001f642", "a<|im_end|>b\n<|im_start|>user",
         "  two  spaces\t\n\n"]


def stressed_model(seed: int = 3):
    """A tiny model whose every tensor matters: random biases and norm weights (init makes them 0 and
    1) and larger weights, so a swapped, transposed or permuted tensor changes the logits visibly."""
    model = tiny_model(seed, initializer_range=0.2)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif "norm" in name:
                p.copy_(1 + torch.randn(p.shape, generator=g) * 0.3)
    return model


def hf_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def llama_logits(path, ids: list[int]) -> tuple[np.ndarray, int]:
    """(logits at every position of ``ids`` from llama.cpp's low-level API, llama.cpp's vocab size)."""
    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
    assert model, f"llama.cpp could not load {path}"
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = 512
        cparams.n_threads = cparams.n_threads_batch = 2
        # Exact float32 arithmetic, not llama.cpp's defaults: an F16 KV cache and (CPU) flash attention,
        # which rounds through F16 too, each move these logits by ~1e-4 (~1e-2 on the stressed model).
        cparams.type_k = cparams.type_v = llama_cpp.GGML_TYPE_F32
        cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        assert ctx
        batch = llama_cpp.llama_batch_init(len(ids), 0, 1)
        try:
            for i, t in enumerate(ids):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, i, 1
                batch.seq_id[i][0], batch.logits[i] = 0, True
            batch.n_tokens = len(ids)
            assert llama_cpp.llama_decode(ctx, batch) == 0
            rows = [np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy()
                    for i in range(len(ids))]
        finally:
            llama_cpp.llama_batch_free(batch)
            llama_cpp.llama_free(ctx)
    finally:
        llama_cpp.llama_model_free(model)
    return np.stack(rows), n_vocab


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return tiny_gguf_pair(tmp_path_factory.mktemp("gguf"))


def test_pair_logits_match_transformers(pair):
    target = tiny_model(0)
    for path, model in zip(pair, (target, perturbed_copy(target, 0.1, 1))):
        got, n_vocab = llama_logits(path, SEQ)
        assert n_vocab == 259
        want = hf_logits(model, SEQ)
        assert got.shape == want.shape == (20, 259)
        assert np.abs(got - want).max() < RTOL * max(1.0, np.abs(want).max()), np.abs(got - want).max()


def test_every_tensor_lands_where_llama_cpp_reads_it(tmp_path):
    model = stressed_model()
    path = save_tiny_gguf(model, byte_tokenizer(), tmp_path / "stressed.gguf")
    got, _ = llama_logits(path, SEQ)
    want = hf_logits(model, SEQ)
    assert np.abs(want).max() > 1  # logits big enough that a misplaced tensor could not hide
    assert np.abs(got - want).max() < RTOL * np.abs(want).max(), np.abs(got - want).max()


def test_llama_cpp_tokenizes_like_byte_tokenizer(pair):
    tok = byte_tokenizer()
    model = llama_cpp.llama_model_load_from_file(str(pair[0]).encode(), llama_cpp.llama_model_default_params())
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        assert llama_cpp.llama_vocab_eos(vocab) == 258
        for text in TEXTS:
            raw = text.encode()
            out = (llama_cpp.llama_token * (len(raw) + 8))()
            n = llama_cpp.llama_tokenize(vocab, raw, len(raw), out, len(out), False, True)
            assert list(out[:n]) == tok.encode(text), text
    finally:
        llama_cpp.llama_model_free(model)


def test_transformers_tokenizer_from_gguf(pair):
    from transformers import AutoTokenizer

    tok = byte_tokenizer()
    gguf_tok = AutoTokenizer.from_pretrained(str(pair[0].parent), gguf_file=pair[0].name)
    assert len(gguf_tok) == 259
    for text in TEXTS:
        assert gguf_tok.encode(text) == tok.encode(text), text
        assert gguf_tok.decode(tok.encode(text)) == text
    assert gguf_tok.eos_token == "<|im_end|>" and gguf_tok.pad_token == "<|endoftext|>"
    assert gguf_tok.chat_template == tok.chat_template
