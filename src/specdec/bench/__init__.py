"""``specdec bench``: which rule, drafter and K make a model faster, and what it costs in quality.

Every requested configuration runs on the same prompts in one process, through the one engine
(``Pair.generate``), against plain decoding (``ar``) measured in the same run and, optionally,
transformers' own assisted generation. Sub-folders (folder rules: README.md):

- :mod:`.tasks`    the benchmarks (HumanEval, Spec-Bench, json-extraction, edits, the fixture) and the one prompt format
- :mod:`.scoring`  pass@1 (model-written code in a sandbox), math accuracy, JSON validity, agreement with ``ar``
- :mod:`.outputs`  ``results.jsonl`` and ``run.json``, the per-configuration summary, ``report.md``, the figures, exports
- :mod:`.running`  ``specdec bench``'s command and the interleaved, resumable loop with what it runs (ours, the peers)
- :mod:`.tune`     ``specdec tune``: the certified search for each policy's parameters and K
- :mod:`.replay`   ``specdec trace`` and ``specdec replay`` over a bench folder
"""
