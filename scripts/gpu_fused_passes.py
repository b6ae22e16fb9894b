"""Time the transformers backend's static-cache passes on a GPU: transformers' modules against the
fused step (merged q/k/v and gate/up, grouped-query SDPA), eager in the width graphs or compiled
inside them, and the draft's K steps from the host against the captured draft loop.

No weights travel: the bundled pair's shapes (Qwen2.5-Coder 1.5B and 0.5B, their config numbers
below) are built with random bf16 weights on the device. For each model and step kind, a pass over
``w`` new tokens on a 256-token cache is timed two ways: ``wall`` (the engine's ``forward``, host
copies and the logits' float32 copy included, synchronized each time; median) and ``replay`` (the
captured graph alone, replayed back to back, CUDA events; mean). Then a draft round of K tokens
(``ModelDrafter.propose`` after its catch-up pass) with the host loop and with the device loop,
and plain decoding's seconds per token (the engine's overhead over one pass). Writes OUT/passes.json
as it goes and prints one line per figure::

    PYTHONPATH=src python scripts/gpu_fused_passes.py OUT [--kinds modules,fused,compiled] [--widths 1,5,8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specdec.checks import number_arg

#: the bundled pair's shapes (Qwen2.5-Coder-1.5B-Instruct and -0.5B-Instruct)
SHAPES = {
    "target": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                   num_key_value_heads=2, tie_word_embeddings=True),
    "draft": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, tie_word_embeddings=True),
}
COMMON = dict(vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
              hidden_act="silu", use_sliding_window=False, eos_token_id=151645)
CONTEXT = 256
#: ``--tiny``: small shapes of the same layout, to try the script on a CPU in seconds
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            tie_word_embeddings=True)
DEVICE = "cuda"
KINDS = {"modules": dict(fused=False), "fused": dict(fused=True), "compiled": dict(fused=True, compile_step=True)}


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def build(role: str, shapes: dict):
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0 if role == "target" else 1)
    with torch.device(DEVICE):
        model = AutoModelForCausalLM.from_config(Qwen2Config(**shapes[role], **COMMON), dtype=torch.bfloat16)
    return model.eval()


def wrap(model, kind: str):
    from specdec.models.backends.transformers.graphs import WidthGraphs, capture_cuda_graph, replay_eagerly
    from specdec.models.backends.transformers.static import StaticHFModel

    capture = capture_cuda_graph if DEVICE == "cuda" else replay_eagerly
    return StaticHFModel(model, graphs=lambda step, device: WidthGraphs(step, device, capture=capture),
                         vocab_limit=151665, **KINDS[kind])


def wall_ms(lm, ids: list[int], width: int, repeats: int) -> float:
    times = []
    for i in range(3 + repeats):
        sync()
        t0 = time.perf_counter()
        lm.forward(ids[CONTEXT:CONTEXT + width], num_logits=width)
        sync()
        if i >= 3:
            times.append(time.perf_counter() - t0)
        lm.truncate(CONTEXT)
    return statistics.median(times) * 1e3


@torch.inference_mode()
def replay_ms(lm, width: int, repeats: int = 200) -> float | None:
    graph = lm.graphs.graphs.get(width)
    if graph is None:
        return None
    graph.replay()
    if DEVICE != "cuda":
        t0 = time.perf_counter()
        for _ in range(repeats):
            graph.replay()
        return (time.perf_counter() - t0) / repeats * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def draft_rounds(lm, k: int, loop: bool, rounds: int = 30) -> float:
    """Median ms of a draft round of ``k`` tokens (greedy) after a one-token catch-up."""
    from specdec.core.drafters.model import ModelDrafter
    from specdec.core.sampling import SamplingParams

    saved = lm.loop
    lm.loop = saved if loop else None
    drafter = ModelDrafter(lm)
    ids = list(range(1000, 1000 + CONTEXT))
    drafter.start(ids)
    drafter.propose(ids, 1, SamplingParams(), None)  # the prefill
    times = []
    for i in range(3 + rounds):
        context = ids + [7]
        lm.truncate(CONTEXT)
        sync()
        t0 = time.perf_counter()
        draft = drafter.propose(context, k, SamplingParams(), None)
        sync()
        if i >= 3:
            times.append(time.perf_counter() - t0)
        assert len(draft.tokens) == k
    lm.loop = saved
    return statistics.median(times) * 1e3


def plain_ms_per_token(lm, tokens: int = 64) -> float:
    from specdec.core.engine import DecodeConfig, Engine

    engine = Engine(lm, eos_ids=[])
    prompt = list(range(1000, 1000 + CONTEXT))
    engine.generate(prompt, DecodeConfig(policy="ar", max_new_tokens=8))
    sync()
    t0 = time.perf_counter()
    engine.generate(prompt, DecodeConfig(policy="ar", max_new_tokens=tokens))
    sync()
    return (time.perf_counter() - t0) / tokens * 1e3


def measure(role: str, kind: str, widths: list[int], repeats: int, ks: list[int], shapes: dict) -> dict:
    model = build(role, shapes)
    lm = wrap(model, kind)
    ids = torch.randint(0, 151665, (CONTEXT + max(widths),), generator=torch.Generator().manual_seed(0)).tolist()
    t0 = time.perf_counter()
    lm.forward(ids[:CONTEXT])
    row = {"role": role, "kind": kind, "step": lm.step_kind, "wall_ms": {}, "replay_ms": {}, "first_pass_s": {}}
    for w in widths:
        t1 = time.perf_counter()
        for _ in range(2):  # eager (compiled here), captured
            lm.forward(ids[CONTEXT:CONTEXT + w], num_logits=w)
            lm.truncate(CONTEXT)
        sync()
        row["first_pass_s"][w] = round(time.perf_counter() - t1, 2)
        row["wall_ms"][w] = round(wall_ms(lm, ids, w, repeats), 3)
        rep = replay_ms(lm, w)
        row["replay_ms"][w] = None if rep is None else round(rep, 3)
        say(f"{role} {kind}: w={w} wall {row['wall_ms'][w]:.3f} ms, replay {row['replay_ms'][w]} ms "
            f"(first passes {row['first_pass_s'][w]} s)")
    if role == "draft":
        row["draft_round_ms"] = {}
        for k in ks:
            host, loop = draft_rounds(lm, k, loop=False), draft_rounds(lm, k, loop=True)
            row["draft_round_ms"][k] = {"host": round(host, 3), "loop": round(loop, 3)}
            say(f"draft {kind}: a round of K={k} greedy drafts: host loop {host:.3f} ms, device loop {loop:.3f} ms")
    row["plain_ms_per_token"] = round(plain_ms_per_token(lm), 3)
    say(f"{role} {kind}: plain decoding {row['plain_ms_per_token']:.3f} ms a token; {lm.graphs.describe()}")
    row["graphs"] = lm.graphs.describe()
    row["setup_s"] = round(time.perf_counter() - t0, 1)
    lm.close()
    del lm, model
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--kinds", default="modules,fused,compiled")
    ap.add_argument("--roles", default="target,draft")
    ap.add_argument("--widths", default="1,5,8")
    ap.add_argument("--ks", default="4,8")
    ap.add_argument("--repeats", type=number_arg(int, lo=1, hi=100000), default=50)
    ap.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU: a trial of the script")
    a = ap.parse_args()
    global DEVICE
    DEVICE = "cpu" if a.tiny else "cuda"
    shapes = {role: TINY for role in SHAPES} if a.tiny else SHAPES
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / "passes.json"
    data = json.loads(path.read_text()) if path.exists() else {"rows": []}
    gpu = torch.cuda.get_device_name(0) if DEVICE == "cuda" else None
    data.update(device=gpu or "cpu", gpu=gpu, torch=torch.__version__, context=CONTEXT)
    widths, ks = [int(w) for w in a.widths.split(",")], [int(k) for k in a.ks.split(",")]
    for kind in a.kinds.split(","):
        for role in a.roles.split(","):
            row = measure(role, kind, widths, a.repeats, ks, shapes)
            data["rows"] = [r for r in data["rows"] if (r["role"], r["kind"]) != (role, kind)] + [row]
            path.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
