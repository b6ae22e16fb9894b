"""Benchmark configurations: parsing ``--policies``/``--drafter``/``--k``/``--k-sweep``/``--peers``
into validated :class:`Config` objects with stable, readable ids.

Item syntax: ``name`` or ``name:key=value:key=value``. Inside a policy item, ``k`` and
``drafter`` override the global ones for that item (``fly+mars:k=15``); every other key is a
policy parameter passed straight to ``Pair.generate`` (``mars:theta=0.8``). Ids:
``ar``, ``lossless/model/k5``, ``mars[theta=0.8]/model/k5``, ``hf-assisted``,
``hf-pld[prompt_lookup_num_tokens=5]``.

:func:`validate` builds each configuration's :class:`~specdec.core.request.DecodeConfig` once, before any
model loads, and keeps it on the configuration (``Config.request``); every generation of the run
uses it (:meth:`Config.request_for`: the run's budget and a seed per repeat), with no validation
in between.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Iterable

from ...checks import check_number, shown
from ...models.backends import REGISTRY
from ...draftlength import MAX_K, K
from ...errors import SpecdecError
from ...core.caller import Caller
from ...core.request import DEFAULTS, GENERATION_FIELDS, DecodeConfig
from ...core.sampling import SamplingParams
from ...core.verify import AR

if TYPE_CHECKING:
    from ...core.constrain import Constraint

#: ``ar:dtype=...``: plain decoding with the target loaded in another dtype (the best plain
#: decoding on a machine may use another dtype than speculation does)
AR_DTYPES = ("float32", "bfloat16", "float16")
PEERS: dict[str, dict[str, Any]] = {
    # peer name -> the generate()/generation-config keys it accepts, and their defaults here
    # draft_quant: run the peer with its own copy of the draft model, loaded with this quantization
    # ("none" = transformers' standard bf16 draft), instead of the run's draft object
    "hf-assisted": {"keys": ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
                             "draft_quant"),
                    "defaults": {}},
    # plain transformers generate() on the same target: Spec-Bench's vanilla baseline
    "hf-ar": {"keys": (), "defaults": {}},
    "hf-pld": {"keys": ("prompt_lookup_num_tokens", "max_matching_ngram_size"),
               "defaults": {"prompt_lookup_num_tokens": 10}},
    # llama.cpp (llama-cpp-python) plain decoding on the target's GGUF file: what a CPU user would
    # run instead; needs `pip install llama-cpp-python` and a bundled or .gguf target
    "llama-cpp": {"keys": ("n_threads", "n_batch"), "defaults": {}},
    # llama-cpp-python's own prompt lookup (LlamaPromptLookupDecoding, its draft_model) on the same
    # file, at its defaults but for the draft length (its README's example: 10)
    "llama-cpp-pld": {"keys": ("num_pred_tokens", "max_ngram_size", "n_threads", "n_batch"),
                      "defaults": {"num_pred_tokens": 10, "max_ngram_size": 2}},
    # llama.cpp's own draft-model speculation (llama-speculative-simple, built by
    # scripts/build_llama_tools.sh from the same llama.cpp source) on the pair's GGUF files; draft_max
    # etc. at llama.cpp's own defaults (common.h: n_max 3, n_min 0, p_min 0)
    "llama-cpp-spec": {"keys": ("draft_max", "draft_min", "draft_p_min", "n_threads"),
                       "defaults": {"draft_max": 3, "draft_min": 0, "draft_p_min": 0.0}},
    # OpenVINO GenAI (`pip install openvino-genai`) on the target's GGUF file, read by its own GGUF
    # reader: plain greedy decoding (LLMPipeline), and its own prompt lookup (prompt_lookup=True) at
    # its sample's settings (samples/python/text_generation/prompt_lookup_decoding_lm.py: 5 and 3)
    "ov": {"keys": ("n_threads",), "defaults": {}},
    "ov-pld": {"keys": ("num_assistant_tokens", "max_ngram_size", "n_threads"),
               "defaults": {"num_assistant_tokens": 5, "max_ngram_size": 3}},
    # llama.cpp's own server (`pip install xllamacpp`, a prebuilt wheel) on the target's GGUF file:
    # plain decoding and its speculative modes at llama.cpp's own defaults (ngram-mod: drafts of 48 to
    # 64 tokens; the draft model: the pair's draft GGUF), n_max/n_min its draft length limits
    "llama-server": {"keys": ("n_threads",), "defaults": {}},
    **{f"llama-server-{mode}": {"keys": ("n_max", "n_min", "n_threads"), "defaults": {}}
       for mode in ("ngram-mod", "ngram-simple", "ngram-map-k", "draft")},
}
#: the peers' integer parameters and their least values (0 for the thread and batch counts: the default)
PEER_INTS = {"n_threads": 0, "n_batch": 0, "n_max": 1, "n_min": 0, "num_pred_tokens": 1, "max_ngram_size": 1, "num_assistant_tokens": 1,
             "draft_max": 1, "draft_min": 0, "prompt_lookup_num_tokens": 1, "max_matching_ngram_size": 1}
#: the library each peer runs on: (module, install hint), checked before any model loads
PEER_LIBRARIES = {
    **dict.fromkeys(("llama-cpp", "llama-cpp-pld"),
                    ("llama_cpp", "llama-cpp-python: pip install llama-cpp-python (it compiles llama.cpp; "
                                  "a few minutes)")),
    **dict.fromkeys(("llama-server", "llama-server-ngram-mod", "llama-server-ngram-simple", "llama-server-ngram-map-k",
                     "llama-server-draft"),
                    ("xllamacpp", "xllamacpp: pip install xllamacpp (a prebuilt wheel of llama.cpp's server; no "
                                  "compiler)")),
    **dict.fromkeys(("ov", "ov-pld"),
                    ("openvino_genai", "OpenVINO GenAI: pip install openvino-genai (a wheel; it brings openvino and "
                                       "openvino-tokenizers)")),
}
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_\-+.]*$")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Config:
    """One benchmarked configuration: ours (``kind="specdec"``) or a transformers peer (``"peer"``)."""

    policy: str
    drafter: str | None = None
    k: int | str = 0  # an integer, or "auto"
    params: dict[str, Any] = field(default_factory=dict)
    kind: str = "specdec"
    #: ``backend=...`` in an item: run on this backend's pair (loaded once per run) instead of the run's own
    backend: str | None = None
    #: the request, built once by :func:`validate` (None for a peer, or before validation)
    request: DecodeConfig | None = field(default=None, compare=False, repr=False)

    @property
    def id(self) -> str:
        name = self.policy
        if self.params:
            name += "[" + ",".join(f"{k}={format_value(v)}" for k, v in sorted(self.params.items())) + "]"
        suffix = f"@{self.backend}" if self.backend else ""
        if self.kind == "peer" or self.policy == AR:
            return name + suffix
        return f"{name}/{self.drafter}/k{self.k}{suffix}"

    @property
    def is_ar(self) -> bool:
        return self.kind == "specdec" and self.policy == AR

    @property
    def ar_dtype(self) -> str | None:
        """The dtype of an ``ar:dtype=...`` configuration (None: the run's own target)."""
        return self.params.get("dtype") if self.is_ar else None

    def generate_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``Pair.generate`` / ``DecodeConfig.from_options`` (besides sampling settings)."""
        if self.is_ar:
            return {"policy": AR}
        return {"policy": self.policy, "drafter": self.drafter, "k": self.k, **self.params}

    def request_for(self, max_new_tokens: int, constraint: Constraint | None = None, **sampling: Any) -> DecodeConfig:
        """This configuration's request for one generation: the one :func:`validate` built, with
        this generation's budget and sampling settings (e.g. a repeat's seed), not validated again
        (built here when the configuration was not validated); with ``constraint`` (a sample's
        structured-output constraint, :mod:`..tasks.jsontask`) the request decodes under it. Each
        configuration is a caller of its own (its id): what one learns across requests (the suffix
        cache, k=auto's state) never drafts for another, which would copy its answer to the same prompt."""
        request = self.request if self.request is not None else DecodeConfig.from_options(**self.generate_kwargs())
        request = request.with_settings(max_new_tokens=max_new_tokens, sampling=SamplingParams(**sampling),
                                        caller=Caller.named(self.id))
        return request if constraint is None else replace(request, constraint=constraint)

    def to_dict(self) -> dict:
        return {"id": self.id, "kind": self.kind, "policy": self.policy, "drafter": self.drafter,
                "k": self.k if not self.is_ar else None, "params": dict(self.params), "backend": self.backend}


def format_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def parse_value(text: str) -> Any:
    """``"3"`` -> 3, ``"0.80"`` -> 0.8, ``"true"`` -> True, anything else stays a string."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        f = float(text)
    except ValueError:
        return text
    if not math.isfinite(f):
        raise SpecdecError(f"parameter value {shown(text)} is not a finite number")
    return f


def parse_item(item: str, what: str = "policy") -> tuple[str, dict[str, Any]]:
    """``"mars:theta=0.8"`` -> ``("mars", {"theta": 0.8})``."""
    parts = item.strip().split(":")
    name = parts[0].strip()
    if not name or not _NAME.match(name):
        raise SpecdecError(f"bad {what} item {shown(item)}: expected NAME or NAME:key=value[:key=value...]")
    params: dict[str, Any] = {}
    for part in parts[1:]:
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not _KEY.match(key) or not value:
            raise SpecdecError(f"bad {what} item {shown(item)}: {shown(part)} is not key=value")
        if key in params:
            raise SpecdecError(f"bad {what} item {shown(item)}: {key!r} given twice")
        params[key] = parse_value(value)
    return name, params


def split_list(text: str | None, what: str) -> list[str]:
    items = [p.strip() for p in (text or "").split(",")]
    if any(not p for p in items):
        raise SpecdecError(f"bad {what} list {shown(text)}: empty item (stray comma?)")
    return items


def parse_int(text: Any, what: str, minimum: int = 1, maximum: int | None = None) -> int:
    """An integer in [``minimum``, ``maximum``] from a flag or item value, or a one-line SpecdecError
    (the value cut to a readable length)."""
    try:
        value = int(str(text).strip())
    except ValueError:  # Python's int() also refuses a text of more than 4300 digits
        raise SpecdecError(f"{what} must be an integer >= {minimum}, got {shown(text)}") from None
    if value < minimum:
        raise SpecdecError(f"{what} must be an integer >= {minimum}, got {shown(text)}")
    if maximum is not None and value > maximum:
        raise SpecdecError(f"{what} must be an integer <= {maximum}, got {shown(value)}")
    return value


def parse_k(text: Any, what: str = "--k") -> int | str:
    """``auto`` or an integer in [1, MAX_K] (:meth:`specdec.draftlength.K.parse`'s loose value), the error
    naming ``what``."""
    try:
        return K.parse(str(text)).value
    except SpecdecError as exc:
        raise SpecdecError(f"{what}: {exc}") from None


def parse_k_sweep(text: str) -> list[int]:
    """``"2..10"`` (inclusive), ``"2..10..2"`` (with a step) or ``"2,4,8"`` -> sorted distinct Ks."""
    s = text.strip()
    m = re.fullmatch(r"(\d+)\.\.(\d+)(?:\.\.(\d+))?", s)
    if m:
        lo, hi, step = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)
        if lo < 1 or hi < lo or hi > MAX_K or step < 1:
            raise SpecdecError(f"bad --k-sweep {shown(text)}: need 1 <= A <= B <= {MAX_K} (and STEP >= 1) in "
                               "A..B[..STEP]")
        return list(range(lo, hi + 1, step))
    if re.fullmatch(r"\d+(,\d+)*", s):
        ks = sorted({int(x) for x in s.split(",")})
        if ks[0] < 1 or ks[-1] > MAX_K:
            raise SpecdecError(f"bad --k-sweep {shown(text)}: every K must be in [1, {MAX_K}]")
        return ks
    raise SpecdecError(f"bad --k-sweep {shown(text)}: use A..B (e.g. 2..10), A..B..STEP or a list like 2,4,8")


def parse_positions(text: str, what: str = "--samples") -> tuple[int, int]:
    """``"100..163"`` -> ``(100, 163)``: 0-based sample positions, both ends included."""
    m = re.fullmatch(r"\s*(\d+)\.\.(\d+)\s*", str(text))
    if not m or int(m.group(2)) < int(m.group(1)):
        raise SpecdecError(f"bad {what} {shown(text)}: use A..B with 0 <= A <= B (0-based positions, both included)")
    return int(m.group(1)), int(m.group(2))


def config_from_file(path: str) -> Config:
    """The configuration a config file (``specdec tune``'s output) describes, as a bench item.
    Sampling settings in the file are not taken: a bench run has one set for every configuration."""
    from ...core.configfile import read_config

    decode = read_config(path)
    ignored = sorted(set(GENERATION_FIELDS) & set(decode))
    if ignored:
        import sys

        print(f"specdec: note: {path}: bench uses its own {', '.join(ignored)} for every configuration",
              file=sys.stderr)
    policy = decode.pop("policy", DEFAULTS["policy"])
    drafter = str(decode.pop("drafter", DEFAULTS["drafter"]))
    k = parse_k(decode.pop("k", DEFAULTS["k"]), f"k in {path}")
    for key in ignored:
        decode.pop(key)
    if policy == AR:
        return Config(AR)
    return Config(policy, drafter, k, decode)


def build_configs(policies: str, drafters: str, k: int | str, k_sweep: Iterable[int] | None = None) -> list[Config]:
    """``ar`` once (always, first: it is the baseline) + every non-ar policy x drafter x K."""
    ks = list(k_sweep) if k_sweep else [k]
    out: list[Config] = [Config(AR)]
    drafter_list = split_list(drafters, "drafter")
    for item in split_list(policies, "policy"):
        name, params = parse_item(item, "policy")
        backend = None
        if "backend" in params:
            backend = REGISTRY.canonical(str(params.pop("backend")))
            if backend == "auto":
                raise SpecdecError(f"{shown(item)}: backend=... names a backend ({' or '.join(REGISTRY.names())}), "
                                   "not auto")
        if name == AR:
            extra = sorted(set(params) - {"dtype"})
            if extra:
                raise SpecdecError(f"policy 'ar' (plain decoding) takes only dtype=... and backend=..., got {extra}")
            if params and params["dtype"] not in AR_DTYPES:
                raise SpecdecError(f"ar dtype must be one of {', '.join(AR_DTYPES)}, got {params['dtype']!r}")
            if params and backend is not None and "dtype" not in REGISTRY.get(backend).options:
                raise SpecdecError(f"{shown(item)}: dtype=... applies to the {REGISTRY.owner('dtype')} backend")
            if params or backend:
                out.append(Config(AR, None, 0, dict(params), backend=backend))
            continue
        item_ks = ks
        if "k" in params:
            item_ks = [parse_k(params.pop("k"), f"k in {shown(item)}")]
        item_drafters = drafter_list
        if "drafter" in params:
            item_drafters = [str(params.pop("drafter"))]
        for d in item_drafters:
            for kk in item_ks:
                out.append(Config(name, d, kk, dict(params), backend=backend))
    return dedupe(out)


#: the most each integer parameter takes (else :data:`PEER_INT_MOST_DEFAULT`): a draft length or n-gram
#: size past a few hundred, a thread count past 1024 or a batch past the peers' 4096-token context only
#: loads the models to fail or crawl
PEER_INT_MOST = {"n_threads": 1024, "n_batch": 4096}
PEER_INT_MOST_DEFAULT = 256
#: the peers' other parameters: numbers in a range, words from a list
PEER_NUMBERS = {"draft_p_min": (0.0, 1.0), "assistant_confidence_threshold": (0.0, 1.0)}
PEER_CHOICES = {"draft_quant": ("none", "int8"),
                "num_assistant_tokens_schedule": ("constant", "heuristic", "heuristic_transient")}


def build_peers(peers: str | None) -> list[Config]:
    """``--peers hf-assisted,hf-pld[:key=value...]`` -> peer configurations, the list checked whole
    before any model loads: names, keys, every value's type and range, no peer twice, not empty."""
    if peers is None:
        return []
    if not peers.strip():
        raise SpecdecError(f"--peers is empty; name at least one of {', '.join(PEERS)}, or leave the flag out")
    out: list[Config] = []
    for item in split_list(peers, "peer"):
        name, params = parse_item(item, "peer")
        if name not in PEERS:
            raise SpecdecError(f"unknown peer {shown(name)}; choose from: {', '.join(PEERS)}")
        unknown = set(params) - set(PEERS[name]["keys"])
        if unknown:
            raise SpecdecError(f"peer {name!r} takes {', '.join(PEERS[name]['keys']) or 'no parameters'}; "
                               f"got {shown(sorted(unknown))}")
        config = Config(name, None, 0, _peer_params(name, params), kind="peer")
        if any(c.id == config.id for c in out):
            raise SpecdecError(f"peer {config.id} is given twice in --peers; name each peer once")
        out.append(config)
    return out


def _peer_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """A peer's parameters checked by the tables above (:data:`PEER_INTS`, :data:`PEER_INT_MOST`,
    :data:`PEER_NUMBERS`, :data:`PEER_CHOICES`)."""
    for key in params:
        where = f"peer {name!r}: {key}"
        if key in PEER_INTS:
            params[key] = parse_int(params[key], where, PEER_INTS[key],
                                    PEER_INT_MOST.get(key, PEER_INT_MOST_DEFAULT))
        elif key in PEER_NUMBERS:
            lo, hi = PEER_NUMBERS[key]
            params[key] = check_number(where, params[key], lo, hi)
        elif key in PEER_CHOICES and params[key] not in PEER_CHOICES[key]:
            *first, last = PEER_CHOICES[key]
            raise SpecdecError(f"{where} must be {', '.join(first)} or {last}, got {shown(params[key])}")
    return params


def dedupe(configs: list[Config]) -> list[Config]:
    seen, out = set(), []
    for c in configs:
        if c.id not in seen:
            seen.add(c.id)
            out.append(c)
    return out


def validate(configs: list[Config], **sampling: Any) -> list[Config]:
    """Build every configuration's request (:meth:`DecodeConfig.from_options`, no model needed;
    ``sampling``: the run's ``max_new_tokens`` and sampling settings): bad names/parameters fail
    here, before any model loads, with the configuration named. Returns the configurations with
    their request kept (``Config.request``), for every generation of the run."""
    out = []
    for c in configs:
        if c.kind == "specdec":
            try:
                c = replace(c, request=DecodeConfig.from_options(**c.generate_kwargs(), **sampling))
            except SpecdecError as exc:
                raise SpecdecError(f"configuration {c.id}: {exc}") from None
        out.append(c)
    return out


def check_constrained(configs: list[Config], constraint: Constraint) -> None:
    """Fail before any model loads when the dataset decodes under a constraint (``json-extraction``)
    and a configuration cannot: a peer (transformers' or llama.cpp's own generation take no
    constraint here), or a request the library refuses with a constraint (named in one line)."""
    for c in configs:
        if c.kind == "peer":
            raise SpecdecError(f"peer {c.id} cannot decode under the dataset's JSON schema; drop --peers for a "
                               "structured-output dataset")
        try:
            c.request_for(1, constraint=constraint)
        except SpecdecError as exc:
            raise SpecdecError(f"configuration {c.id}: {exc}") from None


def check_peer_available(c: Config) -> None:
    """Fail before any model loads when a peer's library (:data:`PEER_LIBRARIES`) is missing."""
    if c.kind == "peer" and c.policy in PEER_LIBRARIES:
        import importlib.util

        module, hint = PEER_LIBRARIES[c.policy]
        if importlib.util.find_spec(module) is None:
            raise SpecdecError(f"peer {c.policy} needs {hint}")


def needs_draft_model(c: Config) -> bool:
    """Whether the configuration needs the draft model loaded: the peers that draft with it, and
    every specdec configuration whose drafter class says so (:attr:`Drafter.requires_model`)."""
    from ...core.drafters import drafter_class

    if c.kind == "peer":
        return c.policy in ("hf-assisted", "llama-cpp-spec", "llama-server-draft")
    return not c.is_ar and drafter_class(str(c.drafter)).requires_model
