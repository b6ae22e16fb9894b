"""``GET /metrics``: Prometheus metrics through ``prometheus_client`` (one registry per app).

vLLM's names where one exists (``vllm:spec_decode_num_drafts_total``,
``vllm:time_to_first_token_seconds``, ...; label ``model_name``) so existing dashboards and scripts
read them; ``specdec_*`` for the rest. Counters of a request move when it finishes; a cancelled
request (client gone) counts only in ``specdec_requests_cancelled``.

Labels come from a closed set, whatever clients send: policies by their registered names (a
composition of loose rules as its rules in a fixed order), rules by theirs, anything else
``other`` (:func:`policy_label`), so the page stays small.

Latencies: time to first token = time queued + prefill + the first round (tokens arrive a round at
a time); inter-token latency = each later round's duration spread over the tokens it committed,
one observation per token, as vLLM observes one per output token.
"""

from __future__ import annotations

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..api import Output
from ...core.verify.policy import POLICIES, RULES

prometheus_client.disable_created_metrics()  # no *_created series: counters read as in vLLM

BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST


def policy_label(name: str) -> str:
    """The label of a policy: its registered name, a composition's rules sorted and joined by
    ``+``, else ``other``."""
    if name in POLICIES:
        return name
    parts = [p.strip() for p in str(name).split("+")]
    if len(set(parts)) == len(parts) and all(p in RULES for p in parts):
        return "+".join(sorted(parts))
    return "other"


def rule_label(name: str) -> str:
    """A loose rule's label: its registered name, else ``other``."""
    return name if name in RULES else "other"


class Metrics:
    """The server's metrics; thread-safe (prometheus_client's own locks)."""

    def __init__(self, model_name: str, positions: int = 0):
        self.model = {"model_name": model_name}
        self.registry = r = CollectorRegistry(auto_describe=True)
        m = ["model_name"]
        self.running = Gauge("vllm:num_requests_running", "Requests generating now (0 or 1: one engine).", m, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests queued for the engine.", m, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens of finished requests.", m, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generated tokens of finished requests.", m,
                                         registry=r)
        self.success = Counter("vllm:request_success", "Finished requests, by finish reason.",
                               [*m, "finished_reason"], registry=r)
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Verify passes that checked at least one draft token.",
                              m, registry=r)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.", m, registry=r)
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.", m, registry=r)
        self.accepted_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                    "Draft tokens accepted, by draft position (0-based).", [*m, "position"], registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time from queueing to the first generated tokens.",
                              m, buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Time between generated tokens (per token).", m,
                             buckets=ITL_BUCKETS, registry=r)
        self.requests = Counter("specdec_requests", "HTTP requests answered, by endpoint and status code.",
                                ["endpoint", "status"], registry=r)
        self.errors = Counter("specdec_errors", "Error responses (status >= 400, client disconnects excluded).",
                              ["status"], registry=r)
        self.cancelled = Counter("specdec_requests_cancelled",
                                 "Requests whose client went away before the end (engine freed).", registry=r)
        self.generated = Counter("specdec_generated_tokens", "Generated tokens of finished requests, by policy.",
                                 ["policy"], registry=r)
        self.passes = Counter("specdec_verify_passes", "Target verify passes (plain decoding: one per token).",
                              ["policy"], registry=r)
        self.relaxed = Counter("specdec_relaxed_accepts", "Draft tokens accepted only by a loose (lossy) rule.",
                               ["rule"], registry=r)
        self.generation_seconds = Counter("specdec_generation_seconds", "Engine time of finished requests.",
                                          ["policy"], registry=r)
        self.queue_seconds = Counter("specdec_queue_seconds", "Time finished requests spent queued.", registry=r)
        self.depth = Gauge("specdec_queue_depth", "Requests queued or running.", registry=r)
        self.duration = Histogram("specdec_request_duration_seconds", "Time from queueing to the end of generation.",
                                  buckets=BUCKETS, registry=r)
        for c in (self.prompt_tokens, self.generation_tokens, self.drafts, self.draft_tokens, self.accepted):
            c.labels(**self.model)
        for pos in range(positions):
            self.accepted_pos.labels(**self.model, position=str(pos))
        self.ttft.labels(**self.model)
        self.itl.labels(**self.model)

    def cancel(self) -> None:
        self.cancelled.inc()

    def response(self, endpoint: str, status: int) -> None:
        """Count one HTTP response."""
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()
        if status >= 400 and status != 499:
            self.errors.labels(status=str(status)).inc()

    def finished(self, out: Output, queued_s: float, total_s: float) -> None:
        """Count one finished generation."""
        s, m, n = out.stats, self.model, len(out.token_ids)
        self.prompt_tokens.labels(**m).inc(out.prompt_tokens)
        self.generation_tokens.labels(**m).inc(n)
        self.success.labels(**m, finished_reason=out.finish_reason).inc()
        if s.drafts:
            self.drafts.labels(**m).inc(s.drafted_at[0] if s.drafted_at else 0)
            self.draft_tokens.labels(**m).inc(s.drafted)
            self.accepted.labels(**m).inc(s.accepted)
            for pos, a in enumerate(s.accepted_at):
                self.accepted_pos.labels(**m, position=str(pos)).inc(a)
        policy = policy_label(s.policy)
        self.generated.labels(policy=policy).inc(n)
        self.passes.labels(policy=policy).inc(s.rounds)
        self.generation_seconds.labels(policy=policy).inc(s.total_seconds)
        self.queue_seconds.inc(max(0.0, queued_s))
        for rule, count in (s.relaxed or {}).items():
            self.relaxed.labels(rule=rule_label(rule)).inc(count)
        self.duration.observe(total_s)
        ttft, itl = latencies(s.round_ends, s.accepted_per_round, queued_s)
        if ttft is not None:
            self.ttft.labels(**m).observe(ttft)
        for value in itl:
            self.itl.labels(**m).observe(value)

    def render(self, waiting: int, running: int) -> bytes:
        """The exposition text, with the queue gauges as of now."""
        self.running.labels(**self.model).set(running)
        self.waiting.labels(**self.model).set(waiting)
        self.depth.set(waiting + running)
        return generate_latest(self.registry)


def latencies(round_ends: list[float], accepted: list[int], queued_s: float) -> tuple[float | None, list[float]]:
    """(time to first token, inter-token latencies) from the engine's round end times (seconds
    since the generation started) and the drafts each round kept (+1 token each round)."""
    if not round_ends:
        return None, []
    itl = []
    for i in range(1, len(round_ends)):
        tokens = 1 + (accepted[i] if i < len(accepted) else 0)
        itl += [(round_ends[i] - round_ends[i - 1]) / tokens] * tokens
    return queued_s + round_ends[0], itl
