"""A measured cost model: what one forward pass of each model costs on *this* machine.

Speculative decoding pays only when ``K`` draft steps plus one target pass over ``K+1`` tokens
cost less than the tokens it yields would cost one at a time. Every term is a property of the
machine: a CPU with native bf16 scores 8 tokens for ~1.07x one token, an AVX2-only CPU for ~6.6x
in bf16 and ~2.6x in float32, a GPU for ~1x. So nothing here assumes a cost; :func:`measure`
times each model's forward pass at widths 1, 2, 4, ... 32 over a short KV cache, in each
candidate dtype, with the threads torch really uses. Tables are cached as JSON under
``$SPECDEC_HOME/costs/`` keyed by a machine fingerprint (CPU model and flags or GPU name, torch
version, threads, device) + model + dtype; a changed fingerprint or an unreadable file means a
new measurement, never a failed load.

A busy machine must not fool it (the timings decide the dtype and every K afterwards): each width
is timed several times in interleaved rounds and the median kept; a width whose samples spread
widely, or that disagrees with its neighbours (a wider pass cheaper than a narrower one by more
than noise, or dearer than proportional to its width by half again), is timed afresh, twice at
most, after which the table is repaired to be monotone and recorded as ``noisy``. A 1-minute load
average above the cores left over for the measurement gets a warning and also makes the table
``noisy``; a noisy table is measured again at a later load that finds the machine quiet. A
generation compares its target passes with the table and reports the ratio (``stats.cost_drift``;
the CLI's note then suggests ``specdec calibrate``).

The package, by concern (every name below is importable from ``specdec.models.costmodel`` itself):

- :mod:`.fingerprints`  the machine's fingerprint and a model's key (what a table is cached under)
- :mod:`.table`         :class:`CostTable`: the measured seconds and the costs between them
- :mod:`.timing`        measuring: :func:`measure`, :func:`time_step`, :func:`machine_load`
- :mod:`.cache`         the JSON files: :func:`load_cached`, :func:`save`,
                        :func:`table_for` (measure now and cache)
- :mod:`.decide`        pure functions: :func:`expected_tokens`, :func:`best_k`, :func:`choose_dtypes`

A name is read where it is defined: a test that replaces one (``measure``, ``machine_load``,
``time``) patches that module (``costmodel.timing``), not the package's re-exported copy.
"""

from . import cache, decide, fingerprints, table, timing  # noqa: F401 (the modules a test patches)
from .cache import (CACHE_NAME_CHARS, cache_path, cached_tables, costs_dir, load_cached, read_table,
                    save, table_for)
from .decide import (FALLBACK_K, MIN_ROUND_SECONDS, PRIOR_ACCEPTANCE, REFERENCE_NEW, REFERENCE_PROMPT,
                     TIE_TOLERANCE, DtypeChoice, best_k, best_k_rate, choose_dtypes, expected_tokens,
                     seconds_per_token, tokens_per_second)
from .fingerprints import HASH_CHARS, KEY_FLAGS, cpu_flags, cpu_model, fingerprint, model_fingerprint, model_key
from .table import FORMAT, CostTable
from .timing import (MAX_REMEASURE, MIN_REPEATS, MIN_SECONDS, MIN_SPARE_CORES, MONOTONE_TOLERANCE, NOISE_FLOOR,
                     PROPORTIONAL_TOLERANCE, REPEATS, SLOW_PASS, SPREAD_LIMIT, STEP_CONTEXT, STEP_REPEATS,
                     WARMUP_TOKENS, WIDTHS, Measured, machine_load, measure, repair, suspect_widths, time_step)

__all__ = [
    # fingerprints
    "HASH_CHARS", "KEY_FLAGS", "cpu_flags", "cpu_model", "fingerprint", "model_fingerprint", "model_key",
    # table
    "FORMAT", "CostTable",
    # timing
    "MAX_REMEASURE", "MIN_REPEATS", "MIN_SECONDS", "MIN_SPARE_CORES", "MONOTONE_TOLERANCE", "NOISE_FLOOR",
    "PROPORTIONAL_TOLERANCE", "REPEATS", "SLOW_PASS", "SPREAD_LIMIT", "STEP_CONTEXT", "STEP_REPEATS",
    "WARMUP_TOKENS", "WIDTHS", "Measured", "machine_load", "measure", "repair", "suspect_widths", "time_step",
    # cache
    "CACHE_NAME_CHARS", "cache_path", "cached_tables", "costs_dir", "load_cached", "read_table",
    "save", "table_for",
    # decide
    "FALLBACK_K", "MIN_ROUND_SECONDS", "PRIOR_ACCEPTANCE", "REFERENCE_NEW", "REFERENCE_PROMPT",
    "TIE_TOLERANCE", "DtypeChoice", "best_k", "best_k_rate", "choose_dtypes", "expected_tokens", "seconds_per_token",
    "tokens_per_second",
]
