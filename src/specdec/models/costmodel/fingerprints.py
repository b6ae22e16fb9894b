"""What a measurement depends on besides the weights: the machine's fingerprint and the model's key.

A cost table is cached under both (:mod:`.cache`): a changed CPU, CPU flags, torch version,
thread count or device (or what the backend adds: for llama.cpp its name, version and threads) means another
fingerprint, and so a new measurement, never a table timed on another machine.
"""

from __future__ import annotations

import hashlib
import json
import platform

import torch

#: CPU flags that change which kernels are fast; recorded readably (all flags go into the hash).
KEY_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "avx_vnni", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "bf16")
#: sha256 hex digits kept for the CPU flags and a model's config (64 bits); changing it re-measures every table
HASH_CHARS = 16


def cpu_flags() -> list[str]:
    """This CPU's feature flags (``/proc/cpuinfo``), sorted; empty where not readable."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key = line.split(":", 1)[0].strip().lower()
                if key in ("flags", "features"):
                    return sorted(set(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return []


def cpu_model() -> str:
    """This CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def fingerprint(device: torch.device | str = "cpu", backend: dict | None = None) -> dict:
    """What a measurement depends on besides the model: the processor, torch, threads, device, and
    what the backend adds (:meth:`specdec.models.backends.Model.fingerprint_extra`: for llama.cpp its name,
    version and threads; nothing for transformers, whose fingerprints keep their old shape so cached
    tables stay valid)."""
    device = torch.device(device)
    flags = cpu_flags()
    out = {
        "device": device.type, "cpu": cpu_model(), "cpu_flags": [f for f in KEY_FLAGS if f in flags],
        "cpu_flags_sha": hashlib.sha256(" ".join(flags).encode()).hexdigest()[:HASH_CHARS],
        "torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
    }
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        out["gpu"] = torch.cuda.get_device_name(index)
        out["cuda"] = torch.version.cuda
    out.update(backend or {})
    return out


def model_fingerprint(lm) -> dict:
    """The fingerprint a model's measurement is cached under (its backend's, see :func:`fingerprint`)."""
    return fingerprint(lm.device, lm.fingerprint_extra())


def model_key(name: str, config) -> str:
    """A model's identity for the cache: where it came from and a hash of its transformers config
    (known before any weights load, so a cached table can decide the dtype to load in)."""
    text = config.to_json_string(use_diff=False) if hasattr(config, "to_json_string") else json.dumps(config, sort_keys=True)
    drop = ("torch_dtype", "dtype", "transformers_version", "_name_or_path")
    try:
        d = {k: v for k, v in json.loads(text).items() if k not in drop}
        text = json.dumps(d, sort_keys=True, default=str)
    except ValueError:
        pass
    return f"{name}|{hashlib.sha256(text.encode()).hexdigest()[:HASH_CHARS]}"
