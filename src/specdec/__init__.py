"""specdec: speculative decoding with lossless and training-free loose verification rules.

    import specdec
    pair = specdec.load("qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b", dtype="bfloat16")
    out = pair.generate("Write a quicksort in Python.", policy="lossless", drafter="model", k=5)
    out.text, out.token_ids, out.stats.mean_acceptance_length, out.stats.tokens_per_second

Heavy imports (transformers) happen only when models are loaded.
"""

from .frontends.api import Output, Pair, Stream, load, make_config
from .core.configfile import read_config, write_config
from .core.constrain import Constraint, constraint_from
from .core.engine import Engine, Generation
from .core.request import DecodeConfig
from .errors import SpecdecError
from .core.sampling import SamplingParams
from .core.stats import Stats

__version__ = "0.3.0.dev0"

__all__ = [
    "Constraint", "DecodeConfig", "Engine", "Generation", "Output", "Pair", "SamplingParams", "SpecdecError", "Stats",
    "Stream", "constraint_from", "load", "make_config", "read_config", "write_config", "__version__",
]
