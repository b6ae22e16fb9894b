"""Width-invariant passes on llama.cpp (``exact=True``): every position's logits the same, bit for bit,
whether a pass scores it alone or with other tokens, so lossless greedy speculation writes
plain decoding's answer token for token.

Why passes of different widths part (llama-cpp-python 0.3.36 on an AVX-512 Xeon, logits of the same
positions compared bit for bit, widths 1..100; measured by hand on tiny GGUF files and the bundled
Q4_K_M target):

- **the llamafile matrix path** (compiled in, ``GGML_LLAMAFILE``): a product with 2+ columns of F32,
  F16 or BF16 weights (and the F16 attention products without flash attention) runs tinyBLAS, one
  column runs ggml's ``vec_dot``; they sum in another order. Q8_0 weights gave the same bits both ways.
- **repacked weights** (``use_extra_bufts``: Q4_K as ``q4_K_8x8``, Q4_0, IQ4_NL): 4 columns at a
  time through a GEMM kernel, the rest through a GEMV kernel, so a position's logits depend on where
  it falls in the pass (width 5 gave other bits than widths 1-3 at the same positions).
- **the tiled K-quant path** (``GGML_CPU_TILED_MM``, on by default): Q4_K/Q6_K products of 8+
  columns (and Q4_K when not repacked) run tiles, fewer run ``vec_dot``.
- **flash attention**: one query row over 512+ KV cells (above 256 cells in use) is split across
  threads and merged (split-KV); 64+ query rows run a tiled kernel; 2-63 rows run one loop per row.

What ``exact=True`` does (:class:`~specdec.models.backends.llamacpp.model.LlamaCppModel`):

- weights in their plain layout (no extra buffer types), and the tiled K-quant path off for the
  process (``GGML_CPU_TILED_MM=0``, which ggml reads once: set before llama.cpp's first pass, else
  passes are cut at :data:`TILED_FREE_WIDTH` tokens, below the tiled path's threshold);
- the KV cache in 8 bits (``q8_0``) with flash attention on: llama.cpp's CPU flash attention splits
  and tiles only F16/F32 caches, so every query row runs the same loop at any width (an F16 cache
  needs every one-token pass padded to two tokens, and passes of at most
  :data:`F16_ATTENTION_WIDTH`: +49% CPU time per step of the 4-bit target, against +7% for the
  8-bit cache and plain weights; it is the fallback where the heads allow no 8-bit cache, head
  size not a multiple of 32);
- a model with weights that take the llamafile path at 2+ columns (F32, F16, BF16, Q8_0, Q4_0, Q5_0,
  IQ4_NL: :func:`needs_pad`) gets every ``llama_decode`` at least 2 tokens wide with at least 2
  output rows: a one-token pass gets a pad token (the same token and position, sequence
  :data:`PAD_SEQ`, removed after the pass), and a pass with one output row asks for a second (the
  last layer's products run over the output rows only);
- a token tree's discarded branches stay in the cache under sequence :data:`GRAVE_SEQ` (masked,
  never read) instead of leaving holes that later tokens would fill out of order: attention sums
  the cells in the cache's order, and plain decoding writes them in position order. When they take a
  quarter of the context the cache is rebuilt from its tokens (exact too: every row is width-invariant).
"""

from __future__ import annotations

from typing import Sequence

#: llama.cpp's limit on sequence ids (``LLAMA_MAX_SEQ``)
MAX_SEQ = 256
#: the sequence id of the pad token that makes a one-token pass two tokens wide
PAD_SEQ = MAX_SEQ - 1
#: the sequence id holding a token tree's discarded branches until the cache is rebuilt
GRAVE_SEQ = MAX_SEQ - 2
#: the most tokens of one exact pass with an F16 cache: CPU flash attention tiles 64+ query rows
F16_ATTENTION_WIDTH = 63
#: the most tokens of one exact pass when the tiled K-quant path could not be turned off (8+ columns run it)
TILED_FREE_WIDTH = 7
#: the environment variable ggml reads once for its tiled K-quant path
TILED_ENV = "GGML_CPU_TILED_MM"

Entry = tuple  # (token, position, sequence ids, wants output)

#: weight types whose products run ggml's ``vec_dot`` at every width once repacking and the tiled
#: path are off (llamafile's tinyBLAS has no case for them)
VEC_DOT_TYPES = frozenset({"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S",
                           "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"})


def needs_pad(weight_types: set[str]) -> bool:
    """Whether one-token passes must be padded to two (see :func:`widen`): some matrix (2+ dims) is
    of a type outside :data:`VEC_DOT_TYPES`, whose one-column product sums in another order."""
    return not weight_types <= VEC_DOT_TYPES


def matrix_types(path) -> set[str]:
    """The types of a GGUF file's tensors of 2+ dimensions (its header, read by the ``gguf`` package)."""
    from gguf import GGUFReader

    return {t.tensor_type.name for t in GGUFReader(str(path)).tensors if len(t.shape) >= 2}


def widen(chunk: Sequence[Entry]) -> tuple[list[Entry], list[bool]]:
    """``(entries, output flags)`` for one exact pass over ``chunk``: at least 2 entries (a pad token
    in :data:`PAD_SEQ` after a lone one) and at least 2 flagged outputs (the last entries that want
    none are flagged). The caller reads rows only for the entries that want them."""
    entries = list(chunk)
    if len(entries) == 1:
        tok, pos = entries[0][0], entries[0][1]
        entries.append((tok, pos, (PAD_SEQ,), False))
    flags = [bool(e[3]) for e in entries]
    missing = 2 - sum(flags)
    for i in range(len(entries) - 1, -1, -1):
        if missing <= 0:
            break
        if not flags[i]:
            flags[i] = True
            missing -= 1
    return entries, flags


def chunks(entries: Sequence[Entry], width: int) -> list[list[Entry]]:
    """``entries`` cut into passes of at most ``width`` tokens; a lone last token takes one from the
    pass before it (two tokens cost less than one and a pad)."""
    out = [list(entries[i:i + width]) for i in range(0, len(entries), width)]
    if len(out) > 1 and len(out[-1]) == 1 and width > 2:
        out[-1].insert(0, out[-2].pop())
    return out
