"""``specdec bench``: which rule, drafter and K make a model faster, and what it costs in quality.

Every requested configuration runs on the same prompts in one process, through the one engine
(``Pair.generate``), against plain decoding (``ar``) measured in the same run and, optionally,
transformers' own assisted generation. Modules:

- :mod:`.configs`   policy/drafter/K/peer parsing, stable configuration ids, validation
- :mod:`.datasets`  HumanEval, Spec-Bench and the built-in fixture as :class:`~.datasets.Sample`
- :mod:`.jsontask`  json-extraction: Spec-Bench's extraction questions under JSON schemas, and JSON validity
- :mod:`.prompts`   the one prompt format every benchmark uses
- :mod:`.sandbox`   running untrusted programs on bubblewrap (namespaces, identities of their own, limits;
  the tests in a sandbox apart); :mod:`.sandbox_child` the code that runs inside
- :mod:`.quality`   pass@1, math final-answer accuracy, agreement with ``ar``
- :mod:`.peers`     transformers' assisted generation and prompt lookup, timed like ours
- :mod:`.results`   the append-only, resumable ``results.jsonl`` and the run settings file
- :mod:`.runner`    the interleaved loop (samples outer, configurations inner)
- :mod:`.loaded`    the models a run loads besides its pair (variants, peers' models), once, held by the run
- :mod:`.summary`   per-configuration aggregates (tokens/s, speedup, tau, recovery, ...)
- :mod:`.report`    ``summary.json`` and ``report.md``;  :mod:`.plots`  the PNG figures
- :mod:`.environment`  versions, hardware, git commit;  :mod:`.cli`  ``register(subparsers)``
"""
