"""The llama.cpp backend, all of it: GGUF models run by llama.cpp's kernels through
llama-cpp-python's low-level API (``pip install 'specdec-rules[llama]'``).

``backend.py`` (its registry entry: options, checks, load, measure), ``model.py``
(:class:`LlamaCppModel`, the :class:`specdec.models.backends.Model` over one ``llama_context``, and the GGUF
tokenizer) and ``formats.py`` (the GGUF file of a model source, and ``model@format``: copies of a
GGUF file's weights in another format). ``draft="auto"``'s choice among those formats is made above
the backends (:mod:`specdec.frontends.draft_formats`, which asks this backend's ``draft_variants`` and
``load_draft``). Importing this package imports no llama.cpp."""
