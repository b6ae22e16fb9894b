"""16 one-token steps of the shipped target on llama.cpp at the given thread count (README.md)."""
import os, sys, time, json
from specdec.models.backends.llamacpp.model import LlamaCppModel
from specdec.models.backends.llamacpp.formats import model_file
path = model_file("qwen2.5-coder-1.5b", progress=False)
threads = int(sys.argv[1])
lm = LlamaCppModel(path, "t", threads=threads)
ids = list(range(1000, 1032))
lm.forward(ids)
t0 = time.perf_counter()
for i in range(16):
    lm.forward([2000 + i])
print(json.dumps({"threads": threads, "affinity": sorted(os.sched_getaffinity(0)), "seconds_16_steps": round(time.perf_counter() - t0, 3)}))
