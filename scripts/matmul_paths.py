"""Which matmul path scores M tokens fastest on this CPU? One Qwen2.5-1.5B MLP projection
(1536 -> 8960), M = 1..32 rows, best of 5, with torch's threads. Prints ms per call.

    python scripts/matmul_paths.py

Paths: torch linear in float32 and bfloat16; the float32 weight pre-packed for oneDNN
(torch.utils.mkldnn); torch's weight-only int8 kernel (_weight_int8pack_mm) with bf16 and fp32
activations; bf16 weights upcast to float32 per call.
"""

import time

import torch

torch.manual_seed(0)
N, K = 8960, 1536
w32 = torch.randn(N, K) * 0.02
w16 = w32.to(torch.bfloat16)
scales = (w32.abs().amax(1) / 127).clamp_min(1e-12)
q = torch.round(w32 / scales[:, None]).clamp(-127, 127).to(torch.int8)
lin = torch.nn.Linear(K, N, bias=False)
lin.weight.data = w32.clone()
try:
    from torch.utils import mkldnn as mk

    packed = mk.to_mkldnn(torch.nn.Sequential(lin))[0]
except Exception as exc:  # noqa: BLE001
    packed = None
    print("mkldnn pack failed:", exc)


def best(fn, reps=5):
    fn()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out) * 1e3


flags = open("/proc/cpuinfo").read()
print("threads", torch.get_num_threads(), "avx512_bf16" in flags and "native bf16" or "no native bf16")
paths = {
    "fp32 linear": lambda x: torch.nn.functional.linear(x, w32),
    "bf16 linear": lambda x: torch.nn.functional.linear(x.bfloat16(), w16),
    "fp32 mkldnn packed": (lambda x: packed(x)) if packed is not None else None,
    "int8 kernel, bf16 act": lambda x: torch.ops.aten._weight_int8pack_mm(x.bfloat16(), q, scales.bfloat16()),
    "int8 kernel, fp32 act": lambda x: torch.ops.aten._weight_int8pack_mm(x, q, scales),
    "bf16 weight upcast": lambda x: torch.nn.functional.linear(x, w16.float()),
}
print(f"{'path':24s}" + "".join(f"{m:>8d}" for m in (1, 2, 4, 8, 16, 32)))
for name, fn in paths.items():
    if fn is None:
        continue
    cells = []
    for m in (1, 2, 4, 8, 16, 32):
        x = torch.randn(m, K)
        try:
            cells.append(f"{best(lambda: fn(x)):8.2f}")
        except Exception:  # noqa: BLE001
            cells.append(f"{'n/a':>8s}")
    print(f"{name:24s}" + "".join(cells))
