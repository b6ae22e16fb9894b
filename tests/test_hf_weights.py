"""The lean safetensors loader gives the same model as ``from_pretrained``, and steps aside for
folders it does not handle."""

import json

import pytest
import torch

from specdec.models.backends.transformers.weights import load_lean, read_safetensors, safetensors_files
from tinymodels import tiny_config, tiny_model


def _save(model, path, **kw):
    model.save_pretrained(path, **kw)
    return path


def _same_model(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert sa[name].dtype == sb[name].dtype, name
        torch.testing.assert_close(sa[name], sb[name], rtol=0, atol=0, msg=name)
    ids = torch.tensor([[5, 17, 99, 3, 42]])
    with torch.inference_mode():
        torch.testing.assert_close(a(ids).logits, b(ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize("saved, wanted", [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)])
def test_lean_load_equals_from_pretrained(tmp_path, saved, wanted):
    from transformers import AutoModelForCausalLM

    path = _save(tiny_model(3).to(saved), tmp_path / "m")
    lean = load_lean(path, wanted)
    assert lean is not None and not lean.training
    _same_model(lean, AutoModelForCausalLM.from_pretrained(path, dtype=wanted).eval())
    assert all(p.dtype == wanted for p in lean.parameters())
    assert lean.generation_config.eos_token_id == 258


def test_tied_embeddings_and_shards(tmp_path):
    from transformers import AutoModelForCausalLM

    from transformers import Qwen2ForCausalLM

    config = tiny_config()
    config.tie_word_embeddings = True
    torch.manual_seed(4)
    model = Qwen2ForCausalLM(config).eval()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    path = _save(model, tmp_path / "tied", max_shard_size="20KB")
    assert len(safetensors_files(path)) > 1  # an index of shards
    lean = load_lean(path, torch.bfloat16)
    assert lean.lm_head.weight.data_ptr() == lean.model.embed_tokens.weight.data_ptr()
    _same_model(lean, AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval())


def test_plain_reads_match_the_file(tmp_path):
    from safetensors.torch import load_file

    path = _save(tiny_model(5).to(torch.bfloat16), tmp_path / "m")
    (file,) = safetensors_files(path)
    ours = dict(read_safetensors(file))
    theirs = load_file(str(file))
    assert ours.keys() == theirs.keys()
    for name, t in theirs.items():
        assert torch.equal(ours[name], t), name


def test_cast_on_the_way_in_chunk_by_chunk(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    import specdec.models.backends.transformers.weights as hw

    path = _save(tiny_model(8).to(torch.bfloat16), tmp_path / "m")
    (file,) = safetensors_files(path)
    monkeypatch.setattr(hw, "CHUNK_BYTES", 1000)  # many chunks per tensor, and a short last one
    ours = dict(read_safetensors(file, torch.float32))
    for name, t in load_file(str(file)).items():
        assert ours[name].dtype == torch.float32 and torch.equal(ours[name], t.float()), name


def test_other_folders_step_aside(tmp_path):
    same = _save(tiny_model(9).to(torch.bfloat16), tmp_path / "same")
    assert load_lean(same, torch.bfloat16) is None  # no cast needed: the memory map is the better load
    path = _save(tiny_model(6), tmp_path / "bin", safe_serialization=False) if _bin_ok() else None
    if path is not None:
        assert load_lean(path, torch.float32) is None  # .bin weights: transformers' loader
    q = _save(tiny_model(7), tmp_path / "q")
    config = json.loads((q / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes"}
    (q / "config.json").write_text(json.dumps(config))
    assert load_lean(q, torch.float32) is None


def _bin_ok() -> bool:
    import inspect

    from transformers import PreTrainedModel

    return "safe_serialization" in inspect.signature(PreTrainedModel.save_pretrained).parameters


PEAK_SCRIPT = r"""
import json, sys
import torch
from pathlib import Path
from transformers import AutoModelForCausalLM
from specdec.models.backends.transformers.weights import load_lean

folder, how = Path(sys.argv[1]), sys.argv[2]
def status_mb(key):
    return int(open("/proc/self/status").read().split(key + ":")[1].split()[0]) / 1024
def load():
    if how == "lean":
        return load_lean(folder, torch.float32)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
first = load()  # once first, so that the modules it imports are not counted
del first
import gc; gc.collect()
open("/proc/self/clear_refs", "w").write("5")  # the peak (VmHWM) starts again from today's RSS
before = status_mb("VmRSS")
model = load()
kept = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
print(json.dumps({"kept": kept, "peak": status_mb("VmHWM") - before}))
"""


@pytest.mark.slow
def test_the_lean_load_peaks_at_the_weights_kept(tmp_path):
    """A bf16 folder loaded as float32: the lean loader's peak is the float32 weights plus a chunk
    (transformers' loader, which casts from the memory-mapped file, is shown for scale)."""
    import subprocess
    import sys

    from transformers import Qwen2ForCausalLM

    config = tiny_config(vocab_size=32768, hidden=512)
    torch.manual_seed(0)
    path = _save(Qwen2ForCausalLM(config).to(torch.bfloat16), tmp_path / "m")

    def peak(how):
        out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(path), how], capture_output=True, text=True,
                             check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    lean, hf = peak("lean"), peak("transformers")
    assert lean["kept"] > 100  # MiB of float32 weights
    assert lean["peak"] <= lean["kept"] * 1.05 + 24, (lean, hf)
    assert hf["peak"] > lean["peak"] + lean["kept"] / 4, (lean, hf)  # the measurement sees the difference
    print(f"lean {lean}, transformers {hf}")
