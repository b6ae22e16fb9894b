"""The transformers backend, all of it: Hugging Face causal LMs in eager PyTorch, on any device.

``backend.py`` (its registry entry: options, checks, load, measure), ``model.py`` (:class:`HFModel`,
the :class:`specdec.models.backends.Model` over a module and its ``DynamicCache``), ``static.py`` (the same on
a static cache, rollback by an index move), ``fused.py`` (its passes with merged q/k/v and gate/up and
grouped-query attention), ``graphs.py`` (short passes replayed as CUDA graphs), ``draftloop.py`` (the
draft's K steps as one captured loop), ``execution.py`` (which of these a model runs on:
``static_cache``, ``cuda_graphs``, ``compile_step``), ``load.py`` (a source
-> the module and its tokenizer), ``convert.py`` (a GGUF file or a bundled model -> a cached bf16
folder), ``weights.py`` (safetensors read with a low load peak), ``dtypes.py`` (``dtype="auto"``:
the measured variants), ``quant.py`` (int8 weights for the draft) and ``kernels.py`` (packed and
row-padded CPU linears). Only this package (and the GGUF tokenizer of the llama.cpp backend) imports
transformers."""
