"""Tiny random models and a byte-level tokenizer, built from a config: no downloads; and the
Monte Carlo harness of the seeded output-distribution (chi-square) tests.

The test suite's helpers (not part of the installed package: they import scipy and write test files).
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
        num_attention_heads=4, num_key_value_heads=kw.pop("num_key_value_heads", 2), max_position_embeddings=max_positions,
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


# --------------------------------------------------------------------------- GGUF (llama.cpp)


def _qwen2_gguf_tensors(model):
    """``(gguf name, float32 array)`` for each weight of a transformers Qwen2ForCausalLM, under the
    names llama.cpp's qwen2 architecture loads. No q/k permutation: llama.cpp runs qwen2 with NEOX
    rope (rotate-half), the layout transformers uses (convert_hf_to_gguf.py does not permute either)."""
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    per_layer = {
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
        "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
        "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
        "self_attn.o_proj.weight": "attn_output.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    for i in range(model.config.num_hidden_layers):
        names.update({f"model.layers.{i}.{k}": f"blk.{i}.{v}" for k, v in per_layer.items()})
    state = model.state_dict()
    if "lm_head.weight" not in state or model.config.tie_word_embeddings:
        names.pop("lm_head.weight")  # tied: llama.cpp reuses token_embd when output.weight is absent
    unknown = set(state) - set(names) - {"lm_head.weight"}
    if unknown:
        raise ValueError(f"no GGUF name for {sorted(unknown)}")
    # A Linear weight is [out, in] in torch; GGUF lists dims fastest first, so it lands as {in, out},
    # the shape llama.cpp asks for: no transpose.
    return [(gguf, state[hf].detach().to(torch.float32).contiguous().numpy()) for hf, gguf in names.items()]


def save_tiny_gguf(model, tokenizer, path) -> Path:
    """Write a transformers Qwen2ForCausalLM (all weights F32) and its byte-level BPE tokenizer (as
    made by :func:`byte_tokenizer`) as a GGUF file llama.cpp loads as architecture ``qwen2``.

    The tokenizer is written as llama.cpp's ``gpt2`` (byte-level BPE) model with the ``qwen2``
    pre-tokenizer, special tokens marked CONTROL, and an *empty* merge list: llama.cpp requires the
    ``tokenizer.ggml.merges`` key but accepts zero entries. gguf-py's writer refuses empty arrays
    (``add_array`` drops them, packing raises), so this writes that one array itself."""
    import gguf
    import numpy as np

    class _Writer(gguf.GGUFWriter):
        def _pack_val(self, val, vtype, add_vtype, sub_type=None):
            if vtype == gguf.GGUFValueType.ARRAY and len(val) == 0 and sub_type is not None:
                head = self._pack("I", vtype) if add_vtype else b""
                return head + self._pack("I", sub_type) + self._pack("Q", 0)
            return super()._pack_val(val, vtype, add_vtype, sub_type)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = _Writer(str(path), "qwen2")
    _write_qwen2_header(gguf, w, model.config)
    _write_byte_bpe_tokenizer(gguf, w, tokenizer, model.config.vocab_size)
    for name, array in _qwen2_gguf_tensors(model):
        w.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _write_qwen2_header(gguf, w, cfg) -> None:
    """The architecture's hyperparameters (plain rope only; head_dim * heads == hidden_size)."""
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if head_dim * cfg.num_attention_heads != cfg.hidden_size:
        raise ValueError("llama.cpp's qwen2 needs head_dim * heads == hidden_size")
    rope = getattr(cfg, "rope_parameters", None) or {}
    rope_theta = rope.get("rope_theta", getattr(cfg, "rope_theta", None))
    if rope.get("rope_type", "default") != "default" or rope_theta is None:
        raise ValueError(f"only plain rope is written, got {rope}")
    w.add_name("specdec tiny qwen2")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    w.add_rope_freq_base(float(rope_theta))


def _write_byte_bpe_tokenizer(gguf, w, tokenizer, vocab_size: int) -> None:
    """The tokenizer: ids in order, each spelled as the HF vocabulary spells it (GPT-2 byte chars)."""
    vocab = tokenizer.get_vocab()
    tokens = [None] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    if None in tokens or len(tokens) != vocab_size:
        raise ValueError("the tokenizer's ids must be 0..vocab_size-1 with no gaps")
    specials = set(tokenizer.all_special_tokens) | {
        t.content for t in tokenizer.added_tokens_decoder.values() if t.special
    }
    types = [gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL for t in tokens]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_key_value(gguf.Keys.Tokenizer.MERGES, [], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.STRING)
    # llama.cpp's gpt2 vocab defaults BOS/EOS to id 11 (here a byte): name them, as Qwen's GGUFs do
    # (BOS = <|endoftext|>, never added).
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    w.add_bos_token_id(pad if pad is not None else eos)
    w.add_eos_token_id(eos)
    if pad is not None:
        w.add_pad_token_id(pad)
    w.add_add_bos_token(False)
    if getattr(tokenizer, "chat_template", None):
        w.add_chat_template(tokenizer.chat_template)


def tiny_gguf_pair(root: Path, noise: float = 0.1, seed: int = 0) -> tuple[Path, Path]:
    """Like :func:`save_tiny_pair`, as two GGUF files: ``root/target.gguf`` and ``root/draft.gguf``."""
    target = tiny_model(seed)
    draft = perturbed_copy(target, noise, seed + 1)
    tok = byte_tokenizer()
    return (save_tiny_gguf(target, tok, Path(root) / "target.gguf"),
            save_tiny_gguf(draft, tok, Path(root) / "draft.gguf"))


# --------------------------------------------------------------------------- output-distribution checks
# The seeded chi-square tests (tests/test_distribution.py, tests/test_loose_sampling.py) share these:
# a verification rule is exact iff the first three output tokens follow the target's joint law.


def table(gen: torch.Generator, shape: tuple, vocab: int, sharpness: float = 2.0) -> torch.Tensor:
    """Random conditional distributions: ``table[prefix...] -> [vocab]``."""
    return torch.softmax(torch.randn(*shape, vocab, generator=gen) * sharpness, dim=-1)


def joint3(p1: torch.Tensor, p2: torch.Tensor, p3: torch.Tensor) -> torch.Tensor:
    """``[V, V, V]``: the joint ``p(x1) p(x2|x1) p(x3|x1,x2)`` from ``[V]``, ``[V, V]``, ``[V, V, V]`` tables."""
    return p1[:, None, None] * p2[:, :, None] * p3


def chisquare_joint(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """(p-value of a chi-square test of ``counts`` against ``probs``, count outside the support).

    Cells with zero probability are left out of the test; a correct sampler puts nothing there."""
    from scipy.stats import chisquare

    counts, probs = counts.flatten().double(), probs.flatten().double()
    inside = probs > 0
    n = counts[inside].sum()
    stat = chisquare(counts[inside].numpy(), (probs[inside] / probs[inside].sum() * n).numpy())
    return float(stat.pvalue), int(counts[~inside].sum())


class ToyChain:
    """A target and a draft over ``vocab`` tokens, three tokens deep: all that the first three output
    tokens of a K = 2 round depend on. The target is given by raw logits per prefix (``z1 [V]``,
    ``z2 [V, V]``, ``z3 [V, V, V]``), so sampling settings and logit-reading rules (MARS, FLy) apply
    to it; the draft by distributions ``q1 [V]``, ``q2 [V, V]``.

    The target's logits are the log of random distributions plus ``offset``: a positive offset
    gives positive top logits (MARS's margin is a ratio of them). For rules that read hidden states
    (DropMatch), the hidden state is the logits row itself and the LM head is the identity.
    """

    def __init__(self, seed: int, vocab: int = 4, offset: float = 0.0):
        gen = torch.Generator().manual_seed(seed)
        self.vocab = vocab
        self.z = tuple(table(gen, (vocab,) * i, vocab).log() + offset for i in range(3))
        self.q = (table(gen, (), vocab, 1.0), table(gen, (vocab,), vocab, 1.0))

    def target_probs(self, params) -> tuple[torch.Tensor, ...]:
        """The target's sampling distributions under ``params`` (temperature, top-k, top-p)."""
        from specdec.core.sampling import probabilities

        return tuple(probabilities(z.reshape(-1, self.vocab), params).reshape(z.shape) for z in self.z)

    def joint(self, params) -> torch.Tensor:
        """``[V, V, V]``: the joint law of the first three tokens plain sampling produces."""
        return joint3(*self.target_probs(params))

    def rounds(self, params, fixed: tuple[int, int] | None = None) -> dict:
        """``(d1, d2) -> (target logits [3, V], drafts [2], q [2, V] or None, target probs [3, V])``:
        each round's tensors, built once per pair of drafts (no rule writes into a round)."""
        p1, p2, p3 = self.target_probs(params)
        z1, z2, z3 = self.z
        q1, q2 = self.q
        pairs = [fixed] if fixed is not None else [(a, b) for a in range(self.vocab) for b in range(self.vocab)]
        return {(a, b): (torch.stack([z1, z2[a], z3[a, b]]), torch.tensor([a, b]),
                         None if fixed is not None else torch.stack([q1, q2[a]]),
                         torch.stack([p1, p2[a], p3[a, b]])) for a, b in pairs}

    def sample(self, policy, params, n: int, seed: int, fixed: tuple[int, int] | None = None):
        """Run ``n`` rounds of ``policy`` (K = 2) and complete each output to three tokens by plain
        sampling, as later rounds would. Drafts are drawn from ``q``, or are ``fixed`` (a drafter
        without probabilities); the drafts and the completions are drawn all at once, from a
        generator of their own, the rule draws from the round's. Returns (``[V, V, V]`` counts,
        rejections, total of ``relaxed``)."""
        from specdec.core.verify import Round

        gen, own = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)
        _, p2, p3 = self.target_probs(params)
        if fixed is None:
            d1 = torch.multinomial(self.q[0], n, replacement=True, generator=own)
            d2 = pick(self.q[1][d1], torch.rand(n, generator=own))
        else:
            d1, d2 = torch.full((n,), fixed[0]), torch.full((n,), fixed[1])
        rounds, kept = self.rounds(params, fixed), []
        rejected = relaxed = 0
        for a, b in zip(d1.tolist(), d2.tolist()):
            logits, drafts, q, probs = rounds[a, b]
            v = policy.verify(Round(logits, drafts, q, params, gen, target_probs=probs, target_hidden=logits,
                                    lm_head=_identity))
            rejected += v.accepted < 2
            relaxed += sum(v.relaxed.values())
            kept.append((v.accepted, v.token))
        accepted, token = torch.tensor(kept).unbind(1)
        # later rounds: the target's own next-token distribution
        x1 = torch.where(accepted == 0, token, d1)
        x2 = torch.where(accepted == 0, pick(p2[x1], torch.rand(n, generator=own)),
                         torch.where(accepted == 1, token, d2))
        x3 = torch.where(accepted == 2, token, pick(p3[x1, x2], torch.rand(n, generator=own)))
        V = self.vocab
        counts = torch.bincount((x1 * V + x2) * V + x3, minlength=V**3).reshape(V, V, V).float()
        return counts, rejected, relaxed


def pick(rows: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of ``rows [n, V]`` by the inverse of its CDF at ``uniforms [n]`` in [0, 1):
    the first token whose CDF exceeds ``u * total`` (in float64, where that stays below the total),
    so a token of probability zero is never picked."""
    cdf = rows.double().cumsum(-1)
    return torch.searchsorted(cdf, (uniforms.double() * cdf[:, -1])[:, None], right=True).squeeze(-1)


def _identity(h: torch.Tensor) -> torch.Tensor:
    """The toy chain's LM head: its hidden state is the logits row itself."""
    return h


def per_rule(policy: str, params: dict[str, dict]) -> dict:
    """Parameters for each rule of ``policy`` (``fly+mars``) taken from ``params[rule]``, prefixed by
    the rule (``mars_theta``) so they apply to single rules and compositions alike."""
    return {f"{rule}_{k}": v for rule in policy.split("+") for k, v in params.get(rule, {}).items()}


def memo_lm(model):
    """A backend model whose logits (and hidden states) are computed once per distinct context and
    then read from a table: the statistical tests run the engine thousands of times over a few
    short contexts of a tiny vocabulary, where transformers' per-pass overhead, not the rule, took
    the time. Each context is run from an empty cache through ``model`` (an ``HFModel``), so the
    KV cache here is bookkeeping only: these tests check the engine's law; the greedy tests check
    the backends' caches."""
    from specdec.models.backends.base import Model

    class MemoLM(Model):
        backend = "memo"
        capabilities = model.capabilities

        def __init__(self):
            super().__init__(model.name, model.vocab_size, model.vocab_limit, model.max_length, model.device,
                             model.variant)
            self.inner, self.rows = model, {}

        def _row(self, context: tuple):
            row = self.rows.get(context)
            if row is None:
                self.inner.reset()
                out = self.inner.score(list(context), 1, hidden=self.capabilities.hidden)
                row = self.rows[context] = (out.logits[0], None if out.hidden is None else out.hidden[0])
            return row

        def _stack(self, contexts, hidden: bool):
            rows = [self._row(tuple(c)) for c in contexts]
            return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows]) if hidden else None

        def _append(self, ids, num_logits, hidden):
            text = [*self.tokens, *ids]
            return self._stack([text[: len(text) - num_logits + 1 + i] for i in range(num_logits)], hidden)

        def _append_tree(self, linear, ids, parents, first, hidden):
            tree = self.tree
            context = [*self.tokens[: tree.base], *linear]
            nodes = [*self.tokens[tree.base:], *ids]  # every node's token, in order

            def path(n: int) -> list[int]:
                out = []
                while n >= 0:
                    out.append(nodes[n])
                    n = tree.parents[n]
                return out[::-1]

            contexts = ([context] if linear else []) + [context + path(first + i) for i in range(len(ids))]
            return self._stack(contexts, hidden)

        def _keep(self, path) -> None:
            pass

        def _crop(self, length: int) -> None:
            pass

        def _clear(self) -> None:
            pass

        def head_logits(self, hidden):
            return self.inner.head_logits(hidden)

        def eos_ids(self) -> list[int]:
            return self.inner.eos_ids()

        def parameter_bytes(self) -> int:
            return self.inner.parameter_bytes()

        def cache_bytes(self) -> int:
            return 0

    return MemoLM()


def tiny_engine(vocab: int = 4, seeds: tuple[int, int] = (21, 22)):
    """An :class:`~specdec.core.engine.Engine` over two random one-layer models with ``vocab`` tokens:
    a target and a draft far enough apart that rounds reject often (no EOS), their logits memoized
    per context (:func:`memo_lm`)."""
    from specdec.core.engine import Engine
    from specdec.models.backends.transformers.model import HFModel as CausalLM

    target, draft = (memo_lm(CausalLM(tiny_model(s, vocab_size=vocab, layers=1, hidden=16, initializer_range=0.2)))
                     for s in seeds)
    return Engine(target, draft, eos_ids=[])


def target_joint(target, prompt: list[int], params, vocab: int) -> torch.Tensor:
    """``[V, V, V]``: the joint law of a :class:`~specdec.models.backends.transformers.model.HFModel`'s first three sampled tokens."""
    from specdec.core.sampling import probabilities

    def dist(context):
        target.reset()
        return probabilities(target.forward(context), params)[0]

    p2 = torch.stack([dist(prompt + [a]) for a in range(vocab)])
    p3 = torch.stack([torch.stack([dist(prompt + [a, b]) for b in range(vocab)]) for a in range(vocab)])
    return joint3(dist(prompt), p2, p3)


def engine_sample(engine, n: int, params, prompt: tuple[int, ...] = (1, 3, 0, 2), **config):
    """Generate three tokens ``n`` times (seeds ``0 .. n-1``, K = 2, sampling ``params``; ``config``:
    further :class:`~specdec.core.engine.DecodeConfig` fields such as ``policy``). Returns (``[V, V, V]``
    counts, the target's ``[V, V, V]`` joint, the fraction of drafts accepted, drafts relaxed)."""
    from dataclasses import replace

    from specdec.core.engine import DecodeConfig

    vocab, prompt = engine.target.vocab_limit, list(prompt)
    counts = torch.zeros(vocab, vocab, vocab)
    accepted = relaxed = 0
    for seed in range(n):
        cfg = DecodeConfig(k=2, max_new_tokens=3, sampling=replace(params, seed=seed), **config)
        out = engine.generate(prompt, cfg)
        counts[tuple(out.token_ids)] += 1
        accepted += out.stats.accepted
        relaxed += sum(out.stats.relaxed.values())
    return counts, target_joint(engine.target, prompt, params, vocab), accepted / (2 * n), relaxed

