"""The llama.cpp backend: GGUF models run by llama.cpp's kernels, through llama-cpp-python's
low-level API (``pip install 'specdec-rules[llama]'``).

Not the high-level ``Llama`` class: with ``logits_all=True`` it keeps ``n_ctx x vocab`` floats
(~2.5 GB at a 4k context with Qwen's 152k-token vocabulary). Here each pass is one ``llama_batch``
with the logits flag on exactly the positions asked for, read with ``llama_get_logits_ith``.

- Rollback: ``llama_memory_seq_rm(mem, -1, p0, -1)`` (every sequence, from ``p0`` on).
- A copy of the cache aside and back (another caller's request ran in between):
  ``llama_state_seq_get_data``/``llama_state_seq_set_data`` of sequence 0, in a host buffer.
- Hidden states (DropMatch): the context is switched to embeddings with pooling ``none`` for that
  pass only (llama.cpp then outputs every token of the batch); ``llama_get_embeddings_ith`` gives the
  final hidden state after the output norm, the LM head's input. The LM head itself is read from the
  GGUF once, on first use, dequantized to float32 by the ``gguf`` package.
- Token trees: one batch, several sequence ids per token, on a unified KV cache (as llama.cpp's own
  ``examples/speculative`` does). Every root-to-leaf path of the tree is one sequence; a token carries
  the ids of all paths through it, so a node attends exactly to the context and its ancestors
  (llama.cpp masks by the token's first sequence id and position). A new branch copies its in-cache
  ancestors with ``llama_memory_seq_cp``; keeping one path is ``llama_memory_seq_keep`` of a
  sequence through it, moved back to sequence 0. At most 256 paths (``LLAMA_MAX_SEQ``).
- Threads: the machine's cores (``os.sched_getaffinity``), for one-token and batch passes alike.
- ``exact=True``: every pass width-invariant, bit for bit (:mod:`specdec.models.backends.llamacpp.exact`).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ....errors import SpecdecError
from ..base import Capabilities, Model
from . import exact as ex

BACKEND = "llama.cpp"
#: llama.cpp's limit on sequence ids (``LLAMA_MAX_SEQ``): the most root-to-leaf paths of a tree
MAX_SEQ = 256
#: tokens per ``llama_decode`` call (longer prompts are fed in chunks)
BATCH = 512
#: context size when the caller gives none: the model's trained context, capped (KV memory grows with it)
DEFAULT_CTX = 8192
#: read the weights into memory instead of mapping the file: llama.cpp repacks most quantized weights
#: for the CPU at load, and a mapping kept the file pages resident beside the repacked copy
MMAP = False

_init_lock = threading.Lock()
_initialized = False
_contexts_made = False  # a llama.cpp context exists (ggml may have read its environment since)
_log_callback = None  # keep a reference: llama.cpp calls it from C


def lib():
    """The ``llama_cpp`` module, initialized once (backend init, logging silenced)."""
    global _initialized, _log_callback
    try:
        import llama_cpp
    except ImportError as exc:  # pragma: no cover - checked before by the registry entry's require()
        raise SpecdecError("backend 'llama.cpp' needs llama-cpp-python: pip install 'specdec-rules[llama]'") from exc
    with _init_lock:
        if not _initialized:
            @llama_cpp.llama_log_callback
            def _quiet(level, text, user_data):  # llama.cpp logs to stderr otherwise
                return None

            _log_callback = _quiet
            llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _initialized = True
    return llama_cpp


def version() -> str:
    try:
        from importlib.metadata import version as v

        return v("llama_cpp_python")
    except Exception:  # noqa: BLE001
        return "unknown"


def extra_buffer_types() -> bool:
    """Whether llama.cpp may put weights in its extra buffer types (repacked layouts for its CPU
    kernels, and AMX tiles on CPUs that have them). Off on a CPU with AMX (``amx_tile``): there
    llama-cpp-python 0.3.36 built for the machine crashed (segmentation fault) in the first pass
    of the bundled Q4_K_M draft and of Q4_0 and Q8_0 copies, on a 2-core Xeon (Sapphire Rapids,
    ``amx_tile amx_bf16 amx_int8``); BF16, F16 and IQ4_NL files ran. ``SPECDEC_LLAMA_EXTRA_BUFTS=1``
    (or ``0``) overrides the choice."""
    forced = os.environ.get("SPECDEC_LLAMA_EXTRA_BUFTS")
    if forced in ("0", "1"):
        return forced == "1"
    from ...costmodel.fingerprints import cpu_flags

    return "amx_tile" not in cpu_flags()


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def busy_cores(seconds: float = 0.1) -> list[int]:
    """The cores this process may run on that other work kept more than half busy over ``seconds``
    (``/proc/stat``, sampled twice while this process sleeps); [] where it cannot be read. llama.cpp's
    threads wait for each other at every layer, so one busy core of its threads' slows every step:
    see :func:`busy_note`."""
    import time

    def sample() -> dict[int, tuple[int, int]]:
        out = {}
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                name, *fields = line.split()
                if name.startswith("cpu") and name[3:].isdigit():
                    ticks = [int(x) for x in fields[:8]]
                    out[int(name[3:])] = (sum(ticks), ticks[3] + ticks[4])   # total, idle + iowait
        return out

    try:
        mine = os.sched_getaffinity(0)
        before = sample()
        time.sleep(seconds)
        after = sample()
    except (OSError, ValueError, AttributeError):
        return []
    busy = []
    for cpu in sorted(mine & before.keys() & after.keys()):
        total = after[cpu][0] - before[cpu][0]
        idle = after[cpu][1] - before[cpu][1]
        if total > 0 and (total - idle) / total > 0.5:
            busy.append(cpu)
    return busy


def busy_note(threads: int, busy: list[int]) -> str | None:
    """What the startup says when other work holds some of the cores llama.cpp's ``threads`` run on."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return None
    if not busy or threads < len(cores):
        return None
    free = [c for c in cores if c not in busy]
    hint = (f"run it on the free ones (taskset -c {','.join(map(str, free))} ...) or free them" if free
            else "free some of them")
    return (f"specdec: note: other work keeps {len(busy)} of the {len(cores)} cores busy (cpu {','.join(map(str, busy))}); "
            f"llama.cpp's {threads} threads wait for each other, so every step slows while it lasts "
            f"(measured: {BUSY_SLOWDOWN}); {hint}")


#: what one busy core of two cost llama.cpp at two threads (benchmarks/busy-core-llamacpp-avx2)
BUSY_SLOWDOWN = ("beside one busy core of 2, steps of the 4-bit target took 2.0-2.4x as long on an AVX2 EPYC "
                 "and 16x on a Xeon, one thread on the free core 1.6x")


# ------------------------------------------------------------------------------ sources
def file_key(path: Path) -> str:
    """A GGUF file's identity for caches: its size and a hash of its first 4 MiB (header, metadata
    and the first tensors), so a changed file gets a new key without hashing gigabytes."""
    st = path.stat()
    h = hashlib.sha256(f"{st.st_size}".encode())
    with open(path, "rb") as f:
        h.update(f.read(4 << 20))
    return h.hexdigest()[:16]


def gguf_tokenizer(path: Path, progress: bool = True):
    """The Hugging Face tokenizer of a GGUF file, built by transformers from the file's own
    tokenizer metadata (the same conversion the transformers backend's cache uses, so the same
    text gives the same ids), cached under ``$SPECDEC_HOME/tokenizers/``."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from ...cache import build_atomically, specdec_home

    folder = specdec_home() / "tokenizers" / f"{path.stem}-{file_key(path)}"
    if (folder / "tokenizer_config.json").exists():
        try:
            return AutoTokenizer.from_pretrained(str(folder))
        except (OSError, ValueError):
            pass  # a broken cache: rebuild below

    def build(tmp: Path) -> None:
        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        finally:
            hf_logging.set_verbosity(level)
        tok.save_pretrained(str(tmp))

    try:
        build_atomically(folder, build)
    except Exception as exc:  # noqa: BLE001 - any failure of the conversion is the file's problem
        raise SpecdecError(f"{path}: could not read the tokenizer from this GGUF file ({type(exc).__name__}: {exc})") from exc
    return AutoTokenizer.from_pretrained(str(folder))


def tiled_path_off() -> bool:
    """Turn llama.cpp's tiled K-quant matrix path off for this process, for exact passes
    (:mod:`~specdec.models.backends.llamacpp.exact`); whether it is off. ggml reads ``GGML_CPU_TILED_MM``
    once, at its first matrix product: after a context exists here it may be too late."""
    if os.environ.get(ex.TILED_ENV) == "0":
        return True
    if _contexts_made:
        return False
    os.environ[ex.TILED_ENV] = "0"
    return True


# ------------------------------------------------------------------------------- the model
class LlamaCppModel(Model):
    """A GGUF model run by llama.cpp (see the module docstring), behind :class:`~specdec.models.backends.base.Model`."""

    backend = BACKEND
    capabilities = Capabilities(trees=True, hidden=True, max_tree_leaves=MAX_SEQ)

    def __init__(self, path: str | os.PathLike, name: str | None = None, vocab_limit: int | None = None,
                 n_ctx: int | None = None, threads: int | None = None, exact: bool = False):
        L = lib()
        self.path = Path(path)
        if not self.path.is_file():
            raise SpecdecError(f"{self.path}: no such GGUF file")
        self._L = L
        mp = L.llama_model_default_params()
        mp.load_mode = 1 if MMAP else 0  # LLAMA_LOAD_MODE_MMAP or _NONE (read into memory)
        mp.use_extra_bufts = extra_buffer_types() and not exact
        self.exact = bool(exact)
        self._tiled_off = bool(exact) and tiled_path_off()  # before this context: ggml reads it once
        if exact:  # the pad token and the discarded branches take two sequence ids
            self.capabilities = Capabilities(trees=True, hidden=True, max_tree_leaves=ex.GRAVE_SEQ)
        self._grave = 0  # cells of discarded tree branches held under GRAVE_SEQ
        self._model = L.llama_model_load_from_file(str(self.path).encode(), mp)
        if not self._model:
            raise SpecdecError(f"{self.path}: llama.cpp could not load this GGUF file (not a model it supports, or corrupt)")
        self.threads = int(threads or default_threads())
        self.backend_version = version()
        self._ctx = self._make_context(n_ctx)
        self.n_ctx = int(L.llama_n_ctx(self._ctx))
        self._mem = L.llama_get_memory(self._ctx)
        self._vocab = L.llama_model_get_vocab(self._model)
        self.n_embd = int(L.llama_model_n_embd(self._model))
        n_vocab = int(L.llama_vocab_n_tokens(self._vocab))
        self._batch = L.llama_batch_init(BATCH, 0, MAX_SEQ)
        self._batch_cap = BATCH
        self._embeddings = False
        self._head: torch.Tensor | None = None
        buf = ctypes.create_string_buffer(256)
        L.llama_model_desc(self._model, buf, len(buf))
        self.description = buf.value.decode(errors="replace")
        quant = self.description.rsplit(" ", 1)[-1] if " " in self.description else "gguf"
        self._exact_widths()
        self._reset_tree_state()
        super().__init__(name or self.path.name, n_vocab, min(vocab_limit or n_vocab, n_vocab), self.n_ctx,
                         torch.device("cpu"), f"gguf:{self.file_type() or quant}")
        self.reset()

    def _make_context(self, n_ctx: int | None):
        """The ``llama_context``; exact: an 8-bit KV cache with flash attention (one loop per query row at
        every width), or where the heads do not allow one (head size not a multiple of 32) an F16 cache
        (:mod:`~specdec.models.backends.llamacpp.exact`)."""
        global _contexts_made
        L = self._L
        trained = int(L.llama_model_n_ctx_train(self._model)) or DEFAULT_CTX
        for kv8 in ((True, False) if self.exact else (False,)):
            cp = L.llama_context_default_params()
            # at least MAX_SEQ: llama.cpp reserves an output row per sequence id and aborts below that
            cp.n_ctx = max(int(n_ctx or min(trained, DEFAULT_CTX)), MAX_SEQ)
            cp.n_batch = cp.n_ubatch = BATCH
            cp.n_seq_max = MAX_SEQ  # sequence ids a batch may use (token trees: one per path)
            cp.kv_unified = True  # one KV buffer for every sequence: token trees share the context's cells
            cp.n_threads = cp.n_threads_batch = self.threads
            cp.embeddings = False
            cp.pooling_type = L.LLAMA_POOLING_TYPE_NONE
            cp.no_perf = True
            if self.exact:
                cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if kv8:
                cp.type_k = cp.type_v = L.GGML_TYPE_Q8_0
            ctx = L.llama_init_from_model(self._model, cp)
            _contexts_made = True
            if ctx:
                self.kv8 = kv8
                return ctx
        L.llama_model_free(self._model)
        raise SpecdecError(f"{self.path}: llama.cpp could not create a context (n_ctx={cp.n_ctx}); out of memory?")

    def _exact_widths(self) -> None:
        """How exact passes are cut and padded (:mod:`~specdec.models.backends.llamacpp.exact`)."""
        #: tokens per ``llama_decode``
        self.batch_width = BATCH
        #: one-token passes padded to two, one-row passes given a second row
        self._pad = False
        if not self.exact:
            return
        if not self.kv8:  # an F16 cache: one query row splits, 64+ rows tile
            self.batch_width, self._pad = ex.F16_ATTENTION_WIDTH, True
        if not self._tiled_off:
            self.batch_width = min(self.batch_width, ex.TILED_FREE_WIDTH)
        self._pad = self._pad or ex.needs_pad(ex.matrix_types(self.path))

    # ------------------------------------------------------------------ metadata
    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(512)
        n = self._L.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode(errors="replace") if n >= 0 else None

    def file_type(self) -> str | None:
        """The GGUF's weight format, e.g. ``Q4_K_M`` (from ``general.file_type``)."""
        value = self.meta("general.file_type")
        if value is None or not value.strip().isdigit():
            return None
        try:
            from gguf import LlamaFileType

            return LlamaFileType(int(value)).name.replace("MOSTLY_", "")
        except (ImportError, ValueError):
            return f"ftype{value}"

    def eos_ids(self) -> list[int]:
        """The end-of-generation tokens llama.cpp itself recognises (EOS, EOT and the like)."""
        L, ids = self._L, set()
        for fn in ("llama_vocab_eos", "llama_vocab_eot"):
            t = int(getattr(L, fn)(self._vocab))
            if 0 <= t < self.vocab_limit:
                ids.add(t)
        return sorted(ids)

    # ------------------------------------------------------------------ the cache
    def _clear(self) -> None:
        self._L.llama_memory_clear(self._mem, True)
        self._grave = 0
        self._reset_tree_state()

    def _crop(self, length: int) -> None:
        # exact: sequence 0 only, so a tree's discarded branches keep their cells (no holes)
        self._L.llama_memory_seq_rm(self._mem, 0 if self.exact else -1, int(length), -1)

    def _crop_tree(self, length: int) -> None:
        if self.exact:  # sequence 0 and every path's, from ``length`` on
            for seq in range(self._next_seq):
                self._L.llama_memory_seq_rm(self._mem, seq, int(length), -1)
        else:
            self._crop(length)  # every sequence, from ``length`` on: the tree's branches go with it
        del self.tokens[length:]
        self._reset_tree_state()

    def _state_bytes(self) -> int:
        self._crop(len(self.tokens))  # nothing past what the tokens say (a pass that failed midway)
        return int(self._L.llama_state_seq_get_size(self._ctx, 0))

    def _save(self):
        """Sequence 0's cells (``llama_state_seq_get_data``), in a host buffer."""
        size = int(self._L.llama_state_seq_get_size(self._ctx, 0))
        buf = (ctypes.c_uint8 * size)()
        if int(self._L.llama_state_seq_get_data(self._ctx, buf, size, 0)) != size:
            raise RuntimeError(f"{self.name}: llama.cpp could not copy its cache")
        return buf

    def _load(self, state) -> None:
        if int(self._L.llama_state_seq_set_data(self._ctx, state, len(state), 0)) == 0:
            raise RuntimeError(f"{self.name}: llama.cpp could not restore a copy of its cache")

    def _compact(self, extra: int) -> None:
        """Exact: rebuild the cache from its tokens when a tree's discarded branches (kept under
        ``GRAVE_SEQ``) hold a quarter of the context or leave no room for ``extra`` more tokens.
        Exact passes are width-invariant, so the rebuilt cache holds the same bits."""
        grave, past = self._grave, len(self.tokens)
        if not grave or (grave < self.n_ctx // 4 and past + extra + grave <= self.n_ctx):
            return
        self._L.llama_memory_clear(self._mem, True)
        self._grave = 0
        self._run([(int(t), i, (0,), False) for i, t in enumerate(self.tokens)], hidden=False)

    def _reset_tree_state(self) -> None:
        self._seq_of: list[int] = []  # per tree node: the sequence it was placed in (a path through it)
        self._has_child: list[bool] = []
        self._root_has_child = False
        self._next_seq = 1

    # ---------------------------------------------------------------- forward passes
    def _set_embeddings(self, on: bool) -> None:
        if on != self._embeddings:
            self._L.llama_set_embeddings(self._ctx, on)
            self._embeddings = on

    def _run(self, entries: list[tuple[int, int, Sequence[int], bool]], hidden: bool):
        """Decode ``(token, position, seq ids, wants output)`` entries (in passes of ``batch_width``;
        exact: each widened, :func:`~specdec.models.backends.llamacpp.exact.widen`) and return float32
        logits ``[n_out, vocab_limit]`` (and hidden states ``[n_out, H]``) of the entries that want
        output, in order."""
        outs = sum(1 for e in entries if e[3])
        logits = np.empty((outs, self.vocab_limit), dtype=np.float32)
        states = np.empty((outs, self.n_embd), dtype=np.float32) if hidden else None
        row = 0
        self._set_embeddings(hidden)
        try:
            for chunk in self._passes(entries):
                batch, flags = ex.widen(chunk) if self._pad else (chunk, [bool(e[3]) for e in chunk])
                try:
                    self._decode(batch, flags, hidden)
                finally:
                    if len(batch) > len(chunk):  # the pad token goes at once
                        self._L.llama_memory_seq_rm(self._mem, ex.PAD_SEQ, -1, -1)
                row = self._read(batch, row, logits, states)
        finally:
            if hidden:
                self._set_embeddings(False)
        return torch.from_numpy(logits), (torch.from_numpy(states) if hidden else None)

    def _passes(self, entries: list) -> list[list]:
        if self.exact:
            return ex.chunks(entries, self.batch_width)
        return [entries[i:i + BATCH] for i in range(0, len(entries), BATCH)]

    def _decode(self, batch: list, flags: list[bool], hidden: bool) -> None:
        b = self._batch
        b.n_tokens = len(batch)
        for i, (tok, pos, seqs, _want) in enumerate(batch):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = len(seqs)
            for j, s in enumerate(seqs):
                b.seq_id[i][j] = s
            b.logits[i] = flags[i] or hidden
        rc = self._L.llama_decode(self._ctx, b)
        if rc != 0:
            raise self._decode_error(rc)

    def _read(self, batch: list, row: int, logits: np.ndarray, states: np.ndarray | None) -> int:
        """Copy the rows of the entries that want output into ``logits`` (and ``states``) from ``row`` on."""
        L = self._L
        for i, e in enumerate(batch):
            if not e[3]:
                continue
            ptr = L.llama_get_logits_ith(self._ctx, i)
            logits[row] = np.ctypeslib.as_array(ptr, shape=(self.vocab_size,))[: self.vocab_limit]
            if states is not None:
                hp = L.llama_get_embeddings_ith(self._ctx, i)
                if not hp:
                    raise RuntimeError("llama.cpp returned no hidden state for an output row")
                states[row] = np.ctypeslib.as_array(hp, shape=(self.n_embd,))
            row += 1
        return row

    def _decode_error(self, rc: int) -> Exception:
        if rc == 1:
            return SpecdecError(f"{self.name}: llama.cpp's context ({self.n_ctx} tokens) is full; shorten the prompt "
                                "or lower max_new_tokens")
        return RuntimeError(f"{self.name}: llama_decode failed with status {rc}")

    def _append(self, ids: Sequence[int], num_logits: int, hidden: bool):
        past = len(self.tokens)
        if past + len(ids) > self.n_ctx:
            raise SpecdecError(f"{self.name}: {past + len(ids)} tokens do not fit llama.cpp's context of {self.n_ctx}")
        if self.exact:
            self._compact(len(ids))
        first_out = len(ids) - num_logits
        entries: list[tuple[int, int, Sequence[int], bool]] = [(int(t), past + i, (0,), i >= first_out) for i, t in enumerate(ids)]
        return self._run(entries, hidden)

    # ------------------------------------------------------------------ trees
    def _new_seq(self) -> int:
        limit = ex.GRAVE_SEQ if self.exact else MAX_SEQ  # exact: the last two ids are the graveyard's and the pad's
        if self._next_seq >= limit:
            raise SpecdecError(f"{self.name}: a token tree with more than {limit} paths does not fit llama.cpp's "
                               "sequence limit; lower tree_nodes or tree_width")
        s = self._next_seq
        self._next_seq += 1
        return s

    def _append_tree(self, linear: list[int], ids: Sequence[int], parents: Sequence[int], first: int, hidden: bool):
        tree = self.tree
        assert tree is not None
        past = len(self.tokens)
        if past + len(linear) + len(ids) > self.n_ctx:
            raise SpecdecError(f"{self.name}: the token tree does not fit llama.cpp's context of {self.n_ctx}")
        if self.exact and first == 0:
            self._compact(len(linear) + len(ids))
        L = self._L
        lin_seqs: list[int] = [0]
        node_seqs: list[list[int]] = []
        copies: list[tuple[int, int, int]] = []  # (from seq, to seq, up to position) before the decode
        for j, parent in enumerate(parents):
            if parent < 0:
                taken, rep, p_pos = self._root_has_child, 0, tree.base - 1
                self._root_has_child = True
            else:
                taken, rep, p_pos = self._has_child[parent], self._seq_of[parent], tree.base - 1 + tree.depths[parent]
                self._has_child[parent] = True
            if not taken:  # the first child continues its parent's path
                seq = rep
            else:  # a new path: the ancestors (cached and in this batch) join it
                seq = self._new_seq()
                copies.append((rep, seq, p_pos + 1))
                a = parent
                while a >= first:
                    node_seqs[a - first].append(seq)
                    a = tree.parents[a]
                if a < 0 and linear:
                    lin_seqs.append(seq)
            self._seq_of.append(seq)
            self._has_child.append(False)
            node_seqs.append([seq])
        for src, dst, upto in copies:
            L.llama_memory_seq_cp(self._mem, src, dst, -1, upto)
        entries: list[tuple[int, int, Sequence[int], bool]] = [(int(t), past + i, lin_seqs, i == len(linear) - 1) for i, t in enumerate(linear)]
        entries += [(int(t), tree.base - 1 + tree.depths[first + j], node_seqs[j], True) for j, t in enumerate(ids)]
        return self._run(entries, hidden)

    def _keep(self, path: Sequence[int]) -> None:
        if self.exact:
            return self._keep_exact(path)
        tree = self.tree
        assert tree is not None
        L = self._L
        end = tree.base + len(path)
        seq = self._seq_of[path[-1]] if path else 0
        L.llama_memory_seq_keep(self._mem, seq)  # only the cells on that path (and deeper along it)
        if seq != 0:
            L.llama_memory_seq_cp(self._mem, seq, 0, -1, -1)
            L.llama_memory_seq_rm(self._mem, seq, -1, -1)
        L.llama_memory_seq_rm(self._mem, -1, end, -1)
        self._reset_tree_state()

    def _keep_exact(self, path: Sequence[int]) -> None:
        """:meth:`_keep` without holes: every tree cell joins ``GRAVE_SEQ`` first, so the cells of the
        discarded branches stay taken (masked) and later tokens land after them, in position order."""
        tree = self.tree
        assert tree is not None
        L, mem, base = self._L, self._mem, tree.base
        end = base + len(path)
        seq = self._seq_of[path[-1]] if path else 0
        for s in range(self._next_seq):
            L.llama_memory_seq_cp(mem, s, ex.GRAVE_SEQ, base, -1)
        for s in range(self._next_seq):
            if s != seq:
                L.llama_memory_seq_rm(mem, s, base, -1)
        if seq != 0:
            L.llama_memory_seq_cp(mem, seq, 0, base, end)
            L.llama_memory_seq_rm(mem, seq, -1, -1)
        L.llama_memory_seq_rm(mem, 0, end, -1)
        self._grave += len(tree.parents) - len(path)
        self._reset_tree_state()

    # ------------------------------------------------------------------ the rest
    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head (``output.weight``, or the tied ``token_embd.weight``) applied to hidden
        states ``[..., H]``: float32 logits ``[..., V]``. The head is read and dequantized from the
        GGUF on first use (``vocab x H`` float32; DropMatch is the only rule that needs it)."""
        if self._head is None:
            self._head = read_head(self.path, self.vocab_limit)
        return hidden.float() @ self._head.T

    def parameter_bytes(self) -> int:
        return int(self._L.llama_model_size(self._model)) + (self._head.numel() * 4 if self._head is not None else 0)

    def kv_bytes_per_token(self) -> int:
        L = self._L
        layers = int(L.llama_model_n_layer(self._model))
        heads, kv_heads = int(L.llama_model_n_head(self._model)), int(L.llama_model_n_head_kv(self._model))
        head_dim = self.n_embd // max(heads, 1)
        per_value = 34 / 32 if self.kv8 else 2  # exact: q8_0 (32 values in 34 bytes), else f16
        return int(2 * layers * kv_heads * head_dim * per_value)  # keys and values

    def cache_bytes(self) -> int:
        """Bytes of the KV cache llama.cpp allocated (the whole context, allocated up front)."""
        return self.n_ctx * self.kv_bytes_per_token()

    def fingerprint_extra(self) -> dict:
        out = {"backend": BACKEND, "backend_version": self.backend_version, "threads": self.threads}
        return {**out, "exact": True} if self.exact else out

    def close(self) -> None:
        """Free the context and the model (the object is unusable afterwards)."""
        L = getattr(self, "_L", None)
        if L is None:
            return
        if getattr(self, "_batch", None) is not None:
            L.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            L.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            L.llama_model_free(self._model)
            self._model = None

    def __del__(self):  # noqa: D105
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def read_head(path: Path, rows: int) -> torch.Tensor:
    """The output projection ``[rows, H]`` of a GGUF file as float32 (``output.weight``, else the
    tied ``token_embd.weight``), dequantized with the ``gguf`` package."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    t = tensors.get("output.weight") or tensors.get("token_embd.weight")
    if t is None:
        raise SpecdecError(f"{path}: no output.weight or token_embd.weight tensor in this GGUF file")
    w = dequantize(t.data, t.tensor_type)
    w = np.asarray(w, dtype=np.float32).reshape(-1, w.shape[-1])[:rows]
    return torch.from_numpy(np.array(w, dtype=np.float32, copy=True))
