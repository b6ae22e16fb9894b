"""Tiny random models and a byte-level tokenizer, built from a config: no downloads.

Used by the test suite and by anyone who wants to exercise the engine without real weights.
"""

from __future__ import annotations

from pathlib import Path

import torch

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_chars() -> list[str]:
    """The printable character GPT-2's byte-level tokenizers use for each byte 0..255."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def byte_tokenizer(shuffle_seed: int | None = None, chat: bool = True):
    """A byte-level BPE tokenizer with no merges: 256 byte tokens + 3 specials (259 ids).
    ``shuffle_seed`` permutes the byte ids, giving an incompatible vocabulary of the same size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = byte_chars()
    if shuffle_seed is not None:
        g = torch.Generator().manual_seed(shuffle_seed)
        chars = [chars[i] for i in torch.randperm(len(chars), generator=g).tolist()]
    vocab = {c: i for i, c in enumerate(chars)}
    for s in SPECIALS:
        vocab[s] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", additional_special_tokens=SPECIALS[1:2]
    )
    if chat:
        fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_config(vocab_size: int = 259, layers: int = 2, hidden: int = 64, max_positions: int = 512, **kw):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
        tie_word_embeddings=False, initializer_range=kw.pop("initializer_range", 0.02),
        eos_token_id=258 if vocab_size > 258 else None, bos_token_id=None,
        pad_token_id=256 if vocab_size > 256 else None, **kw,
    )


def tiny_model(seed: int = 0, **config_kw):
    """A random tiny Qwen2 causal LM in float32."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(tiny_config(**config_kw)).float().eval()
    return model


def perturbed_copy(model, noise: float, seed: int = 1):
    """A copy of ``model`` with Gaussian noise (relative scale ``noise``) on every weight: a draft
    that agrees with the target often but not always."""
    import copy

    g = torch.Generator().manual_seed(seed)
    draft = copy.deepcopy(model)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise * p.std().clamp_min(1e-3))
    return draft


def save_tiny_pair(root: Path, noise: float = 0.1, seed: int = 0) -> tuple[Path, Path]:
    """Write a tiny target and a perturbed draft, each with the byte tokenizer, as HF folders."""
    target = tiny_model(seed)
    draft = perturbed_copy(target, noise, seed + 1)
    tok = byte_tokenizer()
    paths = []
    for name, model in (("target", target), ("draft", draft)):
        path = Path(root) / name
        model.save_pretrained(path)
        tok.save_pretrained(path)
        paths.append(path)
    return paths[0], paths[1]
