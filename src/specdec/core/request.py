"""The one request type: :class:`DecodeConfig`, everything that shapes a generation besides the
prompt, and the defaults of its fields (:data:`DEFAULTS`), declared once.

Every entry point builds it the same way, once, where the request enters: the Python API
(``Pair.generate``/``Pair.stream`` keywords, :func:`make_config`), the CLI flags
(:mod:`specdec.frontends.cliargs`), a server request (:mod:`specdec.frontends.server.params`), a bench configuration
(:mod:`specdec.bench.running.configs`) and a config file (:mod:`specdec.core.configfile`) all go through
:meth:`DecodeConfig.from_options`, which takes loose user options and raises a one-line
:class:`~specdec.errors.SpecdecError` for a bad one. The engine takes the result as is.

A request's settings are layered in one step, :func:`specdec.core.settings.layer` (built-in defaults,
the model's sampling settings, a config file or the server's defaults, the caller's values), called
by the API, the CLI and the server alike; :func:`overlay` is its rule where two layers meet (and
vLLM's plugin's, its engine default under a request's keys): naming another policy drops the lower
layer's policy parameters, naming another drafter drops its drafter options. ``k`` is parsed once,
here, into a :class:`~specdec.draftlength.K` (a fixed K or auto).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from ..checks import check_int
from .caller import Caller, as_caller
from .constrain import Constraint
from ..draftlength import AUTO, MAX_K, K
from .drafters import ALL_DRAFTER_OPTIONS, Drafter, check_drafter_options, drafter_class
from ..errors import SpecdecError
from .logprobs import check_logprobs
from .sampling import SamplingParams
from .verify import Policy, make_policy

#: :meth:`DecodeConfig.with_settings`' "leave it as it is"
KEEP: Any = object()

#: the sampling fields' defaults, as :class:`~specdec.core.sampling.SamplingParams` declares them:
#: temperature 0.0 (greedy), top_p 1.0 (off), top_k 0 (off), seed None (a random seed)
_SAMPLING_DEFAULTS = {f.name: f.default for f in fields(SamplingParams)}

#: Every request field's default, declared here once; :class:`DecodeConfig`, :func:`make_config`,
#: ``Pair.generate``, the CLI's help and flags, the server's defaults and ``specdec bench``/``tune``
#: read them from here. ``drafter``: the portfolio (:mod:`specdec.core.drafters.auto`), whose sources are
#: the draft model when one is loaded and the copy sources (prompt lookup, suffix) always.
DEFAULTS: Mapping[str, Any] = MappingProxyType({
    "policy": "lossless",
    "drafter": "auto",
    "k": AUTO.value,  # draft tokens per round, or "auto": chosen each round from the cost model
    "max_new_tokens": 128,
    **_SAMPLING_DEFAULTS,
})

#: The one default of ``specdec bench``/``tune`` that differs from the library's: every generation
#: is seeded (repeat r uses BENCH_SEED + r), so that a sampled run can be repeated and resumed
#: with the same draws; the library draws a random seed when none is given.
BENCH_SEED = 0

#: request fields that shape the output's length and sampling, not speculation: a bench run sets
#: them once for every configuration, a server request at its top level
GENERATION_FIELDS = ("max_new_tokens", *_SAMPLING_DEFAULTS)

def lookahead_of(policy: Policy | None) -> int:
    """How many drafts after a position the policy reads to judge it (0: token-wise, or ``ar``)."""
    return 0 if policy is None else policy.lookahead


def check_constraint_fits(cfg: "DecodeConfig") -> None:
    """A constraint must be a :class:`~specdec.core.constrain.Constraint` (every policy and drafter,
    token trees included, respects it: :mod:`specdec.core.constrain`)."""
    if cfg.constraint is None:
        return
    if not isinstance(cfg.constraint, Constraint):
        raise SpecdecError(f"constraint must be a specdec.core.constrain.Constraint or None, got {type(cfg.constraint).__name__}")


def check_drafter_fits_policy(policy: Policy, cls, k: K, drafter_params: Mapping[str, Any]) -> None:
    """Refuse, up front, a drafter the policy cannot verify (trees for a chain-only policy) and a
    draft length that would leave the policy's lookahead inert (a block no longer than it)."""
    name = policy.name
    if cls.grows_trees and not policy.verifies_trees:
        raise SpecdecError(f"policy {name!r} verifies chains only; use drafter 'model' (or 'pld'), "
                           "or a policy that verifies trees (lossless, loose rules)")
    w = policy.lookahead
    if not w:
        return
    if cls.grows_trees and k.auto and cls.depth_limit(**drafter_params) <= w:
        raise SpecdecError(
            f"policy {name!r}: {policy.lookahead_label} needs paths longer than it, but a tree of "
            f"depth <= {cls.depth_limit(**drafter_params)} cannot grow that deep; raise tree_nodes (tree) "
            "or lookahead_window/lookahead_ngram (lookahead)")
    if k.fixed is not None and k.fixed <= w:  # a fixed k
        raise SpecdecError(
            f"policy {name!r}: {policy.lookahead_label} acts only on draft blocks longer than it, so k={k} "
            f"would leave it inert; use k >= {w + 1}, k='auto', {policy.lookahead_remedy}")


def tree_depth_as_k(k: K, drafter_params: Mapping[str, Any]) -> tuple[K, dict[str, Any]]:
    """A tree drafter's ``tree_depth`` is its depth limit each round, which a fixed ``k`` also sets
    (a tree's K policy drafts to that depth): ``(the request's K, the other drafter options)``.
    Both given and unequal is a one-line error."""
    depth = drafter_params.get("tree_depth")
    params = {key: v for key, v in drafter_params.items() if key != "tree_depth"}
    if depth is None:
        return k, params
    if not k.auto and k.fixed != depth:
        raise SpecdecError(f"k (draft length) {k} and tree_depth {depth} both set the tree's depth; give one")
    return K(depth), params


def check_tree_fits(cfg: "DecodeConfig", prompt_tokens: int, limit: int | None) -> None:
    """A token-tree drafter's tree must fit the context after the prompt (else the first verify
    pass would overflow it); refused before any work. Later, when the text leaves too little room
    for a tree, the engine takes plain steps."""
    cls = cfg.drafter_type  # None only where the policy drafts nothing
    if limit is None or not cfg.parsed.drafts or cls is None or not cls.grows_trees:
        return
    nodes = cls.tree_size(**cfg.drafter_params)
    if prompt_tokens + nodes > limit:
        raise SpecdecError(f"drafter {cfg.drafter!r}: its trees of up to {nodes} nodes do not fit the context after "
                           f"the prompt ({prompt_tokens} + {nodes} tokens > {limit}); lower its options or shorten "
                           "the prompt")


def split_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(drafter options, policy parameters)``: options named like a drafter option
    (``ngram_max``, ``tree_nodes``, ...: :data:`~specdec.core.drafters.ALL_DRAFTER_OPTIONS`) go to the
    drafter, the rest to the policy."""
    drafter = {k: v for k, v in options.items() if k in ALL_DRAFTER_OPTIONS}
    policy = {k: v for k, v in options.items() if k not in ALL_DRAFTER_OPTIONS}
    return drafter, policy


#: keywords a request takes besides the drafters' options and the rules' parameters
REQUEST_KEYWORDS = ("max_tokens", "stop_token_ids", "logprobs", "response_format", "json_schema", "regex", "choice", "grammar")


def check_stop_token_ids(ids) -> tuple[int, ...]:
    """A list of token ids (ints >= 0), as a tuple; one-line error otherwise."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple)):
        raise SpecdecError(f"stop_token_ids must be a list of token ids, got {ids!r}")
    return tuple(check_int("stop_token_ids (each)", t, lo=0) for t in ids)


def known_options() -> set[str]:
    """Every keyword some request can take: the fields, drafter options, loose policies' parameters
    (rule parameters bare and prefixed by their rule, ``theta`` and ``mars_theta``; the relaxation
    schedule's ``exact_prefix``) and structured output."""
    from .verify.policy import RULES, policy_param_names

    return set(DEFAULTS) | set(ALL_DRAFTER_OPTIONS) | set(REQUEST_KEYWORDS) | set(policy_param_names(RULES))


def check_known(options: Mapping[str, Any]) -> None:
    """A keyword no request takes (``do_sample``, ``max_lenght``) is a one-line error naming it and
    the closest known keyword; a known one that this policy or drafter does not take is left to
    their own checks."""
    import difflib

    known = known_options()
    for name in options:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise SpecdecError(f"unknown option {name!r}{hint} (options: docs/api.md)")


def overlay(base: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """Loose request options ``given`` over ``base`` (a config file's or the server's defaults under
    the caller's values, in :func:`specdec.core.settings.layer`; vLLM's engine default under a request's
    keys): ``given`` wins key by key, except that naming another policy than ``base`` names drops
    ``base``'s policy parameters (they belong to its policy), and naming another drafter than
    ``base`` names drops ``base``'s drafter options. The other request fields always carry over."""
    out = dict(base)
    if "policy" in given and "policy" in base and given["policy"] != base["policy"]:
        out = {k: v for k, v in out.items() if k in DEFAULTS or k in ALL_DRAFTER_OPTIONS}
    if "drafter" in given and "drafter" in base and given["drafter"] != base["drafter"]:
        out = {k: v for k, v in out.items() if k not in ALL_DRAFTER_OPTIONS}
    out.update(given)
    return out


@dataclass(frozen=True)
class DecodeConfig:
    """Everything that shapes one generation besides the prompt. Validated on creation; build it
    from loose user options with :meth:`from_options` (:func:`make_config`)."""

    policy: str = DEFAULTS["policy"]
    drafter: str = DEFAULTS["drafter"]
    #: draft tokens per round, or auto (chosen each round from the cost model): given loose (5,
    #: ``"auto"``) or as a :class:`~specdec.draftlength.K`, held as a K, parsed once, here
    k: K = DEFAULTS["k"]
    max_new_tokens: int = DEFAULTS["max_new_tokens"]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    drafter_params: Mapping[str, Any] = field(default_factory=dict)

    #: structured output (:mod:`specdec.core.constrain`): what the text must match, or None
    constraint: Constraint | None = None
    #: token ids that end the answer like an end-of-sequence token (vLLM's ``stop_token_ids``)
    stop_token_ids: tuple[int, ...] = ()
    #: None, or record the target's log-probability of each emitted token and this many alternatives
    #: (:mod:`specdec.core.logprobs`)
    logprobs: int | None = None
    #: who asks (:class:`~specdec.core.caller.Caller`; the server: its API key's digest and the
    #: request's cache salt): what the engine keeps across requests (the prefix cache, the suffix
    #: drafters' text, k=auto's state) serves only the same caller; :data:`Caller.SHARED` by default
    #: (every request that names none), :data:`Caller.ISOLATED` a caller of its own, whom no request
    #: before or after it serves. Given loose (a name, ``""``, None), converted once by
    #: :func:`~specdec.core.caller.as_caller`. Set with :meth:`with_settings`, never a request option
    caller: Caller = Caller.SHARED

    #: the parsed policy (``ar``: :class:`~specdec.core.verify.Plain`): parsed once, here, and used by the
    #: engine as is
    parsed: Policy = field(init=False, repr=False, compare=False)
    #: the drafter's registered class (:func:`specdec.core.drafters.drafter_class`), looked up once, here;
    #: None when the policy drafts nothing (plain decoding runs no drafter)
    drafter_type: type[Drafter] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # unknown names and bad parameters raise here, before any work; the result is kept
        object.__setattr__(self, "parsed", make_policy(self.policy, dict(self.policy_params)))
        if self.parsed.drafts:
            object.__setattr__(self, "drafter_params", check_drafter_options(self.drafter, dict(self.drafter_params)))
            object.__setattr__(self, "drafter_type", drafter_class(self.drafter))
        object.__setattr__(self, "k", K.parse(self.k))
        if self.parsed.drafts and "tree_depth" in self.drafter_params:
            k, params = tree_depth_as_k(self.k, self.drafter_params)
            object.__setattr__(self, "k", k)
            object.__setattr__(self, "drafter_params", params)
        check_int("max_new_tokens", self.max_new_tokens, lo=1)
        if self.parsed.drafts:
            check_drafter_fits_policy(self.parsed, self.drafter_type, self.k, self.drafter_params)
        check_constraint_fits(self)
        object.__setattr__(self, "stop_token_ids", check_stop_token_ids(self.stop_token_ids))
        object.__setattr__(self, "logprobs", check_logprobs(self.logprobs))
        object.__setattr__(self, "caller", as_caller(self.caller))

    @classmethod
    def from_options(
        cls, /, *, policy: str = DEFAULTS["policy"], drafter: str = DEFAULTS["drafter"], k: K | int | str = DEFAULTS["k"],
        max_new_tokens: int = DEFAULTS["max_new_tokens"], temperature: float = DEFAULTS["temperature"],
        top_p: float = DEFAULTS["top_p"], top_k: int = DEFAULTS["top_k"], seed: int | None = DEFAULTS["seed"],
        repetition_penalty: float = DEFAULTS["repetition_penalty"],
        presence_penalty: float = DEFAULTS["presence_penalty"],
        frequency_penalty: float = DEFAULTS["frequency_penalty"], stop_token_ids: Sequence[int] | None = None,
        logprobs: int | None = None,
        response_format: Mapping | None = None, json_schema: Mapping | str | None = None, regex: str | None = None,
        choice: Sequence[str] | None = None, grammar: str | None = None, **options: Any,
    ) -> DecodeConfig:
        """Validate loose request options into a :class:`DecodeConfig` (no model needed). Options
        named like a drafter option (``ngram_max``, ``ngram_min``, ``tree_nodes``, ...) go to the
        drafter, the rest to the policy (``theta``, ``mars_theta``, ...). A bad value is one
        :class:`~specdec.errors.SpecdecError`.

        Structured output (at most one; :mod:`specdec.core.constrain`, needs ``pip install
        'specdec-rules[structured]'``): ``response_format`` as OpenAI's (``{"type": "json_object"}`` or
        ``{"type": "json_schema", "json_schema": {"schema": {...}}}``), ``json_schema`` (a dict or its
        JSON text), ``regex``, ``choice`` (a list of strings) or ``grammar`` (a Lark grammar)."""
        if "max_tokens" in options:  # vLLM's and OpenAI's name for the budget
            given = options.pop("max_tokens")
            if max_new_tokens != DEFAULTS["max_new_tokens"] and max_new_tokens != given:
                raise SpecdecError("give max_new_tokens or max_tokens (its vLLM/OpenAI name), not both")
            max_new_tokens = given
        check_known(options)
        drafter_params, policy_params = split_options(options)
        sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                                  repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                                  frequency_penalty=frequency_penalty)
        constraint = None
        if any(x is not None for x in (response_format, json_schema, regex, choice, grammar)):
            from .constrain import constraint_from

            constraint = constraint_from(response_format=response_format, json_schema=json_schema, regex=regex,
                                         choice=choice, grammar=grammar)
        # k as given: __post_init__ parses it (K.parse)
        return cls(policy=policy, drafter=drafter, k=k, max_new_tokens=max_new_tokens, sampling=sampling,  # type: ignore[arg-type]
                   policy_params=policy_params, drafter_params=drafter_params, constraint=constraint,
                   stop_token_ids=tuple(stop_token_ids or ()), logprobs=logprobs)

    def with_settings(self, *, max_new_tokens: int | None = None, sampling: SamplingParams | None = None,
                      caller: Any = KEEP) -> DecodeConfig:
        """This request with another budget and/or sampling settings (e.g. a bench repeat's seed),
        or another ``caller``, without validating the policy, drafter and k again: they are kept as
        parsed. ``caller`` (:func:`~specdec.core.caller.as_caller`): a :class:`~specdec.core.caller.Caller`,
        or loose as always: a string names one (``""``: the shared caller, every request's by
        default), None makes the request a caller of its own (an isolated caller)."""
        out = copy.copy(self)
        if caller is not KEEP:
            object.__setattr__(out, "caller", as_caller(caller))
        if max_new_tokens is not None:
            object.__setattr__(out, "max_new_tokens", check_int("max_new_tokens", max_new_tokens, lo=1))
        if sampling is not None:
            if not isinstance(sampling, SamplingParams):
                raise SpecdecError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
            object.__setattr__(out, "sampling", sampling)
        return out


#: ``make_config(policy=..., drafter=..., k=..., max_new_tokens=..., temperature=..., top_p=...,
#: top_k=..., seed=..., **policy_and_drafter_options)``: :meth:`DecodeConfig.from_options`
make_config = DecodeConfig.from_options

__all__ = ["BENCH_SEED", "MAX_K", "DEFAULTS", "DecodeConfig", "GENERATION_FIELDS", "K",
           "check_drafter_fits_policy", "lookahead_of", "make_config", "overlay", "split_options"]
