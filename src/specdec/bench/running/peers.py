"""transformers' own speculative decoding as peers, on the same prompts, timed the same way.

``hf-assisted``: ``target.generate(input_ids, assistant_model=<our draft model object>, ...)``
(so the peer uses the same draft weights and quantization as ours; transformers' defaults for the
draft length unless ``num_assistant_tokens``/``num_assistant_tokens_schedule``/
``assistant_confidence_threshold`` are given). ``hf-pld``: ``generate(..., prompt_lookup_num_tokens=10)``.
Greedy at temperature 0, sampling otherwise; EOS ids and stop strings as ours (transformers'
``StopStringCriteria``, what ``stop_strings`` + ``tokenizer`` build), and the output is cut the way ours is (through the first EOS, before the first
stop string). transformers reports no acceptance counts, so tau here is measured: new tokens per
target forward pass, counted by a forward pre-hook on the target model.

The llama.cpp peers (``llama-cpp``, ``llama-cpp-pld``, ``llama-cpp-spec``), llama.cpp's own server
(``llama-server`` and its speculative modes, :mod:`specdec.bench.running.llama_server`) and the OpenVINO
GenAI peers (``ov``, ``ov-pld``) run the target's GGUF file in those runtimes, on the same prompt ids.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch

from ...models.backends import REGISTRY
from ...errors import SpecdecError
from ...core.text import StopStrings
from .configs import PEERS, Config
from .llama_server import MODES, run_llama_server
from .loaded import BenchModels


def peer_draft(pair, quant: str, models: BenchModels):
    """The draft model a peer runs: the pair's own object, or (once per run: kept in ``models``) a
    separately loaded copy with another quantization, e.g. transformers' standard unquantized draft."""
    if quant == pair.draft_quant:
        return pair.draft.model
    copies = models.peer_drafts
    if quant not in copies:
        copies[quant] = REGISTRY.get("transformers").peer_model(pair.draft_name, pair.draft.dtype, pair.draft.device,
                                                                quant)
    return copies[quant]


def gguf_of(source: str) -> str:
    """The GGUF file of a target, as the llama.cpp backend reads it (a bundled model's, assembled once;
    a ``.gguf`` path; either with ``@format``: the copy in that weight format, made once)."""
    try:
        return REGISTRY.get("llama.cpp").prepare(source, progress=False)
    except SpecdecError as e:
        raise SpecdecError(f"peer llama-cpp needs a GGUF target: {e}") from None


def llama_model(pair, params: dict, models: BenchModels):
    """The llama.cpp model for the pair's target, loaded once per run (kept in ``models``)."""
    key = tuple(sorted(params.items()))
    cache = models.llama
    if key not in cache:
        from llama_cpp import Llama

        threads = int(params.get("n_threads") or peer_threads())
        draft = None
        if "num_pred_tokens" in params:  # llama-cpp-pld: its own prompt lookup as the draft model
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            draft = LlamaPromptLookupDecoding(max_ngram_size=int(params["max_ngram_size"]),
                                              num_pred_tokens=int(params["num_pred_tokens"]))
        cache[key] = Llama(model_path=gguf_of(pair.target_name), n_ctx=4096, n_threads=threads,
                           n_threads_batch=threads, n_batch=int(params.get("n_batch") or 512), verbose=False,
                           draft_model=draft)
    return cache[key]


def run_llama(pair, peer: Config, prompt_ids: Sequence[int], stops: Sequence[str], *, max_new_tokens: int,
              temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
              models: BenchModels) -> dict[str, Any]:
    """Plain decoding by llama.cpp on the same prompt token ids (same tokenizer: the GGUF's),
    greedy at T=0; wall time of prompt evaluation + generation, as ours."""
    params = {**PEERS[peer.policy]["defaults"], **peer.params}
    llm = llama_model(pair, params, models)
    if seed is not None:
        llm.set_seed(seed)
    eos = set(pair.eos_ids)
    checker = StopStrings(pair.tokenizer, list(stops))
    new: list[int] = []
    finish = "length"
    start = time.perf_counter()
    sampling = dict(temp=temperature, top_p=top_p if temperature > 0 else 1.0, top_k=top_k if temperature > 0 else 1,
                    repeat_penalty=1.0)
    # generate(reset=True) still reuses the longest prefix the last call left in the KV cache (a
    # warm-up of the same prompt would skip its whole prefill): reset first, so the peer pays the
    # prefill our engine pays (it starts every request from an empty cache)
    llm.reset()
    for tok in llm.generate(list(prompt_ids), reset=True, **sampling):
        new.append(int(tok))
        if tok in eos:
            finish = "stop"
            break
        if checker.stops and checker(new, 1) is not None:
            break
        if len(new) >= max_new_tokens:
            break
    seconds = time.perf_counter() - start
    produced = len(new)
    if checker.stops:
        keep = checker(new, len(new))
        if keep is not None:
            new, finish = new[:keep], "stop"
    return {
        "text": checker.final_text(new), "token_ids": new, "finish_reason": finish, "prompt_tokens": len(prompt_ids),
        "new_tokens": len(new), "produced_tokens": produced, "seconds": seconds, "target_forwards": produced,
        "tau": 1.0, "peer_settings": {**params, "gguf": gguf_of(pair.target_name).rsplit("/", 1)[-1]},
    }


def run_llama_spec(pair, peer: Config, prompt_ids: Sequence[int], stops: Sequence[str], *, max_new_tokens: int,
                   temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = None) -> dict[str, Any]:
    """llama.cpp's own draft-model speculation (``llama-speculative-simple``) on the pair's GGUF
    files, with the same prompt ids (checked). The tool has no stop strings and overshoots ``-n``
    by up to ``draft_max`` tokens, so its text is cut as ours is, and its time is its prompt
    evaluation plus its decode time per produced token times the tokens kept (model loading, which
    it does on every call, is not counted)."""
    from .llama_tools import run_speculative_simple

    if pair.draft_name is None:
        raise SpecdecError("peer llama-cpp-spec needs a draft model; load one or drop it from --peers")
    params = {**PEERS[peer.policy]["defaults"], **peer.params}
    threads = int(params.get("n_threads") or peer_threads())
    text = pair.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
    res = run_speculative_simple(
        gguf_of(pair.target_name), gguf_of(pair.draft_name), text, n_predict=max_new_tokens,
        draft_max=int(params["draft_max"]), draft_min=int(params["draft_min"]),
        draft_p_min=float(params["draft_p_min"]), threads=threads, seed=seed or 0, temperature=temperature,
        top_k=top_k, top_p=top_p, stops=list(stops), prompt_ids=list(prompt_ids))
    # token ids as ours count them: the generated text re-tokenized, through the stop-completing token
    ids = pair.tokenizer.encode(res.get("raw_text", res["text"]), add_special_tokens=False)[:max_new_tokens]
    checker = StopStrings(pair.tokenizer, list(stops))
    finish = "stop" if res.get("stopped_at_eos") else "length"
    keep = checker(ids, len(ids)) if checker.stops else None
    if keep is not None:
        ids, finish = ids[:keep], "stop"
    produced = max(int(res.get("n_predict") or len(ids)), 1)
    decode = float(res.get("decode_seconds") or 0.0)
    seconds = float(res.get("encode_seconds") or 0.0) + decode * min(1.0, len(ids) / produced)
    forwards = produced - int(res.get("n_accept") or 0)
    return {
        "text": res["text"], "token_ids": ids,
        "finish_reason": finish, "prompt_tokens": len(prompt_ids), "new_tokens": len(ids), "produced_tokens": produced,
        "seconds": seconds, "target_forwards": forwards, "tau": produced / forwards if forwards > 0 else None,
        "peer_settings": {**params, "n_threads": threads, "n_drafted": res.get("n_drafted"),
                          "n_accept": res.get("n_accept"), "tool_decode_seconds": decode,
                          "tool_encode_seconds": res.get("encode_seconds"), "tool_wall_seconds": res.get("seconds"),
                          "tool_tokens_per_second": res.get("tokens_per_second")},
    }

#: what OpenVINO GenAI runs the GGUF file as (its legacy GGUF reader, read from the model it saves with
#: ``enable_save_ov_model``; the plugin's settings from compiling that model on the CPU plugin), openvino 2026.4.1
OV_FORMAT = ("GGUF read by OpenVINO GenAI's (legacy) GGUF reader into an OpenVINO model: Q4_K tensors as u4 "
             "weights with an f16 scale and a u4 zero point per 32 weights (Q4_K's 6-bit min rounded to an integer "
             "zero point), Q6_K tensors as u8 weights with an f16 scale and a u8 zero point per 16, decompressed "
             "inside the matmuls; CPU plugin defaults: f32 inference precision, int8 dynamic quantization of the "
             "activations in groups of 32, u8 KV cache")


def openvino_pipeline(pair, prompt_lookup: bool, threads: int, models: BenchModels):
    """OpenVINO GenAI's ``LLMPipeline`` on the target's GGUF file, loaded once per run (kept in
    ``models``): ``INFERENCE_NUM_THREADS`` as given, and its default paged-attention (continuous
    batching) pipeline with prefix caching off, so that each request starts from an empty cache as
    ours does (its default turns it on, and a request would reuse the warm-up's or the previous
    prompt's shared prefix)."""
    key = (("prompt_lookup", bool(prompt_lookup)), ("threads", int(threads)))
    cache = models.openvino
    if key not in cache:
        import openvino_genai as og

        scheduler = og.SchedulerConfig()
        scheduler.enable_prefix_caching = False
        scheduler.max_num_batched_tokens = 2**63 - 1  # as its latency-oriented default: the prompt in one pass
        kwargs: dict[str, Any] = {"scheduler_config": scheduler, "INFERENCE_NUM_THREADS": int(threads)}
        if prompt_lookup:
            kwargs["prompt_lookup"] = True
        cache[key] = og.LLMPipeline(gguf_of(pair.target_name), "CPU", **kwargs)
    return cache[key]


def run_openvino(pair, peer: Config, prompt_ids: Sequence[int], stops: Sequence[str], *, max_new_tokens: int,
                 temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
                 models: BenchModels) -> dict[str, Any]:
    """OpenVINO GenAI on the target's GGUF file: ``ov`` plain decoding, ``ov-pld`` its own prompt
    lookup (``num_assistant_tokens``, ``max_ngram_size``). The prompt goes in as our token ids
    (``TokenizedInputs``: no tokenization, no chat template), greedy at T=0; EOS ids as ours
    (``stop_token_ids``), the stop strings given to the pipeline (kept in its output) and the output
    cut as ours is (through the first EOS, before the first stop string). ``seconds``: wall time of
    ``generate`` (prefill included). tau: 1.0 for ``ov``; for ``ov-pld`` produced tokens per target
    step, the steps counted by the pipeline's own metrics (``raw_metrics.m_batch_sizes``: one entry
    per step that produced tokens, the prefill's included), None where it reports none."""
    import numpy as np
    import openvino as ov
    import openvino_genai as og

    params = {**PEERS[peer.policy]["defaults"], **peer.params}
    threads = int(params.get("n_threads") or peer_threads())
    pld = peer.policy == "ov-pld"
    pipe = openvino_pipeline(pair, pld, threads, models)
    eos = list(pair.eos_ids)
    cfg = _ov_config(og, params if pld else None, eos, stops, max_new_tokens=max_new_tokens,
                     temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    ids = np.array([list(prompt_ids)], dtype=np.int64)
    inputs = og.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
    start = time.perf_counter()
    res = pipe.generate(inputs, cfg)
    seconds = time.perf_counter() - start
    new = [int(t) for t in res.tokens[0]]
    produced = len(new)
    if pld:
        steps = list(res.perf_metrics.raw_metrics.m_batch_sizes)
        forwards = len(steps) if steps else None
    else:
        forwards = produced
    new, finish, text = _cut_tokens(pair, new, eos, stops)
    if finish == "length" and stops and produced < max_new_tokens:
        finish = "stop"  # the pipeline stopped early on a stop string (it matches them on its own text)
    return {
        "text": text, "token_ids": new, "finish_reason": finish, "prompt_tokens": len(prompt_ids),
        "new_tokens": len(new), "produced_tokens": produced, "seconds": seconds, "target_forwards": forwards,
        "tau": (produced / forwards if forwards else None) if pld else 1.0,
        "peer_settings": {**params, "n_threads": threads, "gguf": gguf_of(pair.target_name).rsplit("/", 1)[-1],
                          "openvino_genai": getattr(og, "__version__", None), "device": "CPU",
                          "pipeline": "continuous batching (paged attention, its CPU default), prefix caching off",
                          "prompt": "token ids (TokenizedInputs)", "format": OV_FORMAT},
    }


def _ov_config(og, pld: dict | None, eos: list[int], stops: Sequence[str], *, max_new_tokens: int,
               temperature: float, top_p: float, top_k: int, seed: int | None):
    """OpenVINO GenAI's ``GenerationConfig`` for a peer: length, no chat template, our EOS ids, the
    stop strings (kept in its output, to be cut as ours are), greedy or sampling, and ``pld``'s
    prompt-lookup settings where given."""
    cfg = og.GenerationConfig()
    cfg.max_new_tokens = int(max_new_tokens)
    cfg.apply_chat_template = False
    if eos:
        cfg.eos_token_id = int(eos[0])
        cfg.stop_token_ids = {int(t) for t in eos}
    if stops:
        cfg.stop_strings = set(stops)
        cfg.include_stop_str_in_output = True
    cfg.do_sample = temperature > 0
    if temperature > 0:
        cfg.temperature, cfg.top_p = float(temperature), float(top_p)
        if top_k > 0:
            cfg.top_k = int(top_k)
        if seed is not None:
            cfg.rng_seed = int(seed)
    if pld is not None:
        cfg.num_assistant_tokens = int(pld["num_assistant_tokens"])
        cfg.max_ngram_size = int(pld["max_ngram_size"])
    return cfg


def peer_threads() -> int:
    """The threads specdec's llama.cpp backend runs with by default."""
    threads = REGISTRY.get("llama.cpp").threads()
    assert threads is not None  # llama.cpp's backend chooses them
    return threads


def run_peer(
    pair, peer: Config, prompt_ids: Sequence[int], stops: Sequence[str], *, max_new_tokens: int,
    temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
    models: BenchModels | None = None,
) -> dict[str, Any]:
    """One generation by a peer: text, token_ids, finish_reason, new_tokens, seconds (wall time
    of ``generate``), target_forwards, tau, and the settings it used. ``models``: the run's
    (:class:`specdec.bench.running.loaded.BenchModels`), where a peer's own models are kept between
    generations; without it they are loaded for this generation only (a server stopped after it)."""
    if models is None:
        models = BenchModels()
        try:
            return run_peer(pair, peer, prompt_ids, stops, max_new_tokens=max_new_tokens, temperature=temperature,
                            top_p=top_p, top_k=top_k, seed=seed, models=models)
        finally:
            models.close()
    if peer.policy in MODES:
        return run_llama_server(pair, peer, prompt_ids, stops, max_new_tokens=max_new_tokens, temperature=temperature,
                                top_p=top_p, top_k=top_k, seed=seed, models=models, threads=peer_threads(),
                                defaults=PEERS[peer.policy]["defaults"], gguf_of=gguf_of, cut=_cut_tokens)
    if peer.policy == "llama-cpp-spec":
        return run_llama_spec(pair, peer, prompt_ids, stops, max_new_tokens=max_new_tokens, temperature=temperature,
                              top_p=top_p, top_k=top_k, seed=seed)
    if peer.policy in ("ov", "ov-pld"):
        return run_openvino(pair, peer, prompt_ids, stops, max_new_tokens=max_new_tokens, temperature=temperature,
                            top_p=top_p, top_k=top_k, seed=seed, models=models)
    if peer.policy in ("llama-cpp", "llama-cpp-pld"):
        return run_llama(pair, peer, prompt_ids, stops, max_new_tokens=max_new_tokens, temperature=temperature,
                         top_p=top_p, top_k=top_k, seed=seed, models=models)
    # imported here first, as before: without transformers, this is where it fails
    from transformers.utils import logging as hf_logging  # noqa: F401

    model = pair.target.model
    params = {**PEERS[peer.policy]["defaults"], **peer.params}
    input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=pair.target.device)
    eos = list(pair.eos_ids)
    kwargs = _hf_kwargs(pair, input_ids, eos, stops, max_new_tokens=max_new_tokens, temperature=temperature,
                        top_p=top_p, top_k=top_k)
    restore: dict[str, Any] = {}
    gen_cfg = None
    draft_quant = None
    if peer.policy == "hf-assisted":
        draft_quant, gen_cfg = _attach_assistant(pair, params, models, kwargs, restore)
    else:
        kwargs.update(params)
    out, seconds, forwards = _timed_generate(model, input_ids, kwargs, seed, gen_cfg, restore)
    new, produced, finish, text = _cut_output(pair, out, prompt_ids, eos, stops)
    used = dict(params)
    if peer.policy == "hf-assisted":
        used.setdefault("num_assistant_tokens", "transformers default")
        used["draft_quant"] = draft_quant
    return {
        "text": text, "token_ids": new, "finish_reason": finish, "prompt_tokens": len(prompt_ids),
        "new_tokens": len(new), "produced_tokens": produced, "seconds": seconds, "target_forwards": forwards,
        "tau": produced / forwards if forwards else None, "peer_settings": used,
    }


def _hf_kwargs(pair, input_ids, eos: list[int], stops: Sequence[str], *, max_new_tokens: int, temperature: float,
               top_p: float, top_k: int) -> dict[str, Any]:
    """The keyword arguments of transformers' ``generate`` for a peer: length, EOS and padding ids,
    greedy or sampling settings, and the stop-string criterion."""
    pad = pair.tokenizer.pad_token_id if pair.tokenizer.pad_token_id is not None else (eos[0] if eos else None)
    kwargs: dict[str, Any] = dict(
        max_new_tokens=max_new_tokens, attention_mask=torch.ones_like(input_ids), eos_token_id=eos or None,
        pad_token_id=pad, do_sample=temperature > 0, num_beams=1, repetition_penalty=1.0,
    )
    if temperature > 0:
        kwargs.update(temperature=temperature, top_p=top_p, top_k=top_k)
    else:
        kwargs.update(temperature=None, top_p=None, top_k=None)
    if stops:
        # what ``stop_strings=..., tokenizer=...`` builds; passed as a criterion because transformers
        # forwards ``stop_strings`` but not the tokenizer to the assistant's own generate() call
        from transformers import StoppingCriteriaList, StopStringCriteria

        kwargs["stopping_criteria"] = StoppingCriteriaList([StopStringCriteria(pair.tokenizer, list(stops))])
    return kwargs


def _attach_assistant(pair, params: dict, models: BenchModels, kwargs: dict, restore: dict) -> tuple[str, Any]:
    """``hf-assisted``: the draft model as ``kwargs["assistant_model"]``, and ``params`` set on its
    generation config (where transformers reads them), their old values saved in ``restore``.
    Pops ``draft_quant`` from ``params``; returns it and the assistant's generation config."""
    if pair.draft is None:
        raise SpecdecError("peer hf-assisted needs a draft model; load one or drop it from --peers")
    draft_quant = params.pop("draft_quant", pair.draft_quant)
    assistant = peer_draft(pair, draft_quant, models)
    kwargs["assistant_model"] = assistant
    gen_cfg = assistant.generation_config
    for key, value in params.items():  # transformers reads these from the assistant's config
        restore[key] = getattr(gen_cfg, key, None)
        setattr(gen_cfg, key, value)
    return draft_quant, gen_cfg


def _timed_generate(model, input_ids, kwargs: dict, seed: int | None, gen_cfg, restore: dict) -> tuple[Any, float, int]:
    """``model.generate`` timed (synchronized on CUDA), its target forward passes counted by a
    pre-hook, transformers' logging quiet; afterwards the hook is removed, the logging level and the
    assistant's ``restore``-d settings put back. Returns ``(output, seconds, forwards)``."""
    from transformers.utils import logging as hf_logging

    forwards = [0]

    def count(module, args, kw=None):
        forwards[0] += 1

    hook = model.register_forward_pre_hook(count)
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        if seed is not None:
            torch.manual_seed(seed)
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids, **kwargs)
        if input_ids.device.type == "cuda":
            torch.cuda.synchronize(input_ids.device)
        seconds = time.perf_counter() - start
    finally:
        hook.remove()
        hf_logging.set_verbosity(level)
        for key, value in restore.items():
            setattr(gen_cfg, key, value)
    return out, seconds, forwards[0]


def _cut_output(pair, out, prompt_ids: Sequence[int], eos: list[int],
                stops: Sequence[str]) -> tuple[list[int], int, str, str]:
    """The new tokens of ``generate``'s output cut as ours are (through the first EOS, before the
    first stop string): ``(token_ids, produced before the cuts, finish_reason, text)``."""
    seq = out.sequences if hasattr(out, "sequences") else out
    new = [int(t) for t in seq[0, len(prompt_ids):].tolist()]
    produced = len(new)  # before our cuts: what the target's forward passes paid for
    new, finish, text = _cut_tokens(pair, new, eos, stops)
    return new, produced, finish, text


def _cut_tokens(pair, new: list[int], eos: Sequence[int], stops: Sequence[str]) -> tuple[list[int], str, str]:
    """New tokens cut as ours are (through the first EOS, before the first stop string):
    ``(token_ids, finish_reason, text)``."""
    finish = "length"
    eos_set = set(eos)
    for i, t in enumerate(new):
        if t in eos_set:
            new, finish = new[: i + 1], "stop"
            break
    checker = StopStrings(pair.tokenizer, list(stops))
    if checker.stops:
        keep = checker(new, len(new))
        if keep is not None:
            new, finish = new[:keep], "stop"
    return new, finish, checker.final_text(new)
