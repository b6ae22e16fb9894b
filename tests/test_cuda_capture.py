"""On a CUDA device (skipped elsewhere): real CUDA graphs captured and replayed on a tiny model, the
fused step compiled inside them, the draft loop captured, and every rule's checks
(scripts/cuda_rules_check.py) with the static cache and CUDA graphs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdec.core.drafters.model import ModelDrafter
from specdec.core.sampling import SamplingParams
from specdec.models.backends.transformers.graphs import WidthGraphs
from specdec.models.backends.transformers.static import StaticHFModel
from tinymodels import perturbed_copy, tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
ROOT = Path(__file__).resolve().parents[1]
IDS = torch.randint(0, 259, (64,), generator=torch.Generator().manual_seed(0)).tolist()


def on_cuda(model, graphs: bool = True, **kw):
    factory = (lambda step, device: WidthGraphs(step, device)) if graphs else None
    return StaticHFModel(model.to("cuda"), graphs=factory, **kw)


@pytest.mark.parametrize("compile_step", [False, True])
def test_captured_graphs_replay_the_eager_passes(compile_step):
    eager = on_cuda(tiny_model(0), graphs=False)
    graphs = on_cuda(tiny_model(0), compile_step=compile_step)
    for lm in (eager, graphs):
        lm.forward(IDS[:20])
    for round_ in range(4):  # eager, captured, replayed, replayed: at widths 1 and 4
        for width in (1, 4):
            a = eager.forward(IDS[20:20 + width], num_logits=width)
            b = graphs.forward(IDS[20:20 + width], num_logits=width)
            torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
            eager.truncate(20)
            graphs.truncate(20)
    assert sorted(graphs.graphs.graphs) == [1, 4] and not graphs.graphs.failed
    assert graphs.graphs.captures == 2 and graphs.graphs.replays == 6


def test_the_captured_draft_loop_equals_the_host_loop():
    draft = perturbed_copy(tiny_model(1), 0.1, 11)
    context = list(b"def fib(n): return fib(n - 1)")
    out = {}
    for name, lm in (("host", on_cuda(draft, draft_loop=False)), ("loop", on_cuda(draft))):
        drafter = ModelDrafter(lm)
        for _ in range(3):  # the loop captured by its first run, replayed after
            drafter.start(context)
            out[name] = drafter.propose(context, 5, SamplingParams(), None), lm.tokens[:]
    (host, host_tokens), (loop, loop_tokens) = out["host"], out["loop"]
    assert loop.tokens == host.tokens and loop_tokens == host_tokens
    torch.testing.assert_close(loop.logits, host.logits, atol=1e-4, rtol=1e-4)


def test_sampled_drafts_from_the_captured_loop_repeat_with_a_seed():
    lm = on_cuda(tiny_model(2))
    drafter = ModelDrafter(lm)
    params = SamplingParams(temperature=0.8, top_p=0.9)
    runs = []
    for _ in range(2):
        drafter.start([5, 6, 7])
        runs.append(drafter.propose([5, 6, 7], 4, params, torch.Generator("cuda").manual_seed(3)))
    assert runs[0].tokens == runs[1].tokens and torch.equal(runs[0].probs, runs[1].probs)
    assert torch.allclose(runs[0].probs.sum(-1), torch.ones(len(runs[0].tokens), device="cuda"))


def test_every_rule_checks_out_on_cuda_with_graphs():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "cuda_rules_check.py"), "--device", "cuda",
                           "--cache", "graphs"], capture_output=True, text=True, env=env, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
