"""The llama.cpp backend, all of it: GGUF models run by llama.cpp's kernels through
llama-cpp-python's low-level API (``pip install 'specdec-rules[llama]'``).

``backend.py`` (its registry entry: options, checks, load, measure), ``model.py``
(:class:`LlamaCppModel`, the :class:`specdec.backends.Model` over one ``llama_context``, and the GGUF
tokenizer), ``formats.py`` (``model@format``: copies of a GGUF file's weights in another format) and
``draft_formats.py`` (``draft="auto"``: the draft's weight format chosen by measurement). Importing
this package imports no llama.cpp."""
