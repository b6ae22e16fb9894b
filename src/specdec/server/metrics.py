"""Counters for ``GET /metrics`` in the Prometheus text format (0.0.4), written by hand.

vLLM's names where one exists (``vllm:spec_decode_num_drafts_total``, ...; label ``model_name``)
so existing dashboards and scripts read them; ``specdec_*`` for the rest. Counters of a request
move when it finishes; a cancelled request (client gone) counts only in ``specdec_requests_cancelled``.
"""

from __future__ import annotations

import threading
from collections import defaultdict

from ..api import Output

#: name -> (type, help). Counters are exposed with the ``_total`` suffix, as prometheus_client does.
FAMILIES = {
    "vllm:num_requests_running": ("gauge", "Requests generating now (0 or 1: one engine, one request at a time)."),
    "vllm:num_requests_waiting": ("gauge", "Requests queued for the engine."),
    "vllm:prompt_tokens": ("counter", "Prompt tokens of finished requests."),
    "vllm:generation_tokens": ("counter", "Generated tokens of finished requests."),
    "vllm:request_success": ("counter", "Finished requests, by finish reason."),
    "vllm:spec_decode_num_drafts": ("counter", "Verify passes that checked at least one draft token."),
    "vllm:spec_decode_num_draft_tokens": ("counter", "Draft tokens proposed."),
    "vllm:spec_decode_num_accepted_tokens": ("counter", "Draft tokens accepted."),
    "vllm:spec_decode_num_accepted_tokens_per_pos": ("counter", "Draft tokens accepted, by draft position (0-based)."),
    "specdec_requests": ("counter", "HTTP requests answered, by endpoint and status code."),
    "specdec_errors": ("counter", "Error responses (status >= 400, client disconnects excluded), by status code."),
    "specdec_requests_cancelled": ("counter", "Requests whose client went away before the end (engine freed)."),
    "specdec_generated_tokens": ("counter", "Generated tokens of finished requests, by policy."),
    "specdec_verify_passes": ("counter", "Target verify passes (plain decoding: one per token), by policy."),
    "specdec_relaxed_accepts": ("counter", "Draft tokens accepted only by a loose (lossy) rule, by rule."),
    "specdec_generation_seconds": ("counter", "Engine time of finished requests, by policy."),
    "specdec_queue_seconds": ("counter", "Time finished requests spent queued before the engine took them."),
    "specdec_queue_depth": ("gauge", "Requests queued or running."),
    "specdec_request_duration_seconds": ("histogram", "Time from queueing to the end of generation."),
}
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def _labels(labels: dict) -> str:
    if not labels:
        return ""
    esc = (str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for v in labels.values())
    return "{" + ",".join(f'{k}="{v}"' for k, v in zip(labels, esc)) + "}"


def _num(v: float) -> str:
    return repr(float(v))


class Metrics:
    """Thread-safe counters, gauges and one histogram; :meth:`render` writes the exposition text."""

    def __init__(self, model_name: str, positions: int = 0):
        self.model = {"model_name": model_name}
        self._lock = threading.Lock()
        self._values: dict[str, dict[tuple, float]] = defaultdict(dict)
        self._hist = {"count": 0, "sum": 0.0, "buckets": [0] * len(BUCKETS)}
        for name in ("vllm:prompt_tokens", "vllm:generation_tokens", "vllm:spec_decode_num_drafts",
                     "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens"):
            self.inc(name, 0, **self.model)
        for pos in range(positions):
            self.inc("vllm:spec_decode_num_accepted_tokens_per_pos", 0, **self.model, position=str(pos))
        self.inc("specdec_requests_cancelled", 0)

    def inc(self, name: str, value: float = 1, **labels) -> None:
        key = tuple(labels.items())
        with self._lock:
            series = self._values[name]
            series[key] = series.get(key, 0) + value

    def response(self, endpoint: str, status: int) -> None:
        """Count one HTTP response."""
        self.inc("specdec_requests", endpoint=endpoint, status=str(status))
        if status >= 400 and status != 499:
            self.inc("specdec_errors", status=str(status))

    def finished(self, out: Output, queued_s: float, total_s: float) -> None:
        """Count one finished generation."""
        s, m, n = out.stats, self.model, len(out.token_ids)
        self.inc("vllm:prompt_tokens", out.prompt_tokens, **m)
        self.inc("vllm:generation_tokens", n, **m)
        self.inc("vllm:request_success", **m, finished_reason=out.finish_reason)
        if s.policy != "ar":
            self.inc("vllm:spec_decode_num_drafts", s.drafted_at[0] if s.drafted_at else 0, **m)
            self.inc("vllm:spec_decode_num_draft_tokens", s.drafted, **m)
            self.inc("vllm:spec_decode_num_accepted_tokens", s.accepted, **m)
            for pos, a in enumerate(s.accepted_at):
                self.inc("vllm:spec_decode_num_accepted_tokens_per_pos", a, **m, position=str(pos))
        self.inc("specdec_generated_tokens", n, policy=s.policy)
        self.inc("specdec_verify_passes", s.rounds, policy=s.policy)
        self.inc("specdec_generation_seconds", s.total_seconds, policy=s.policy)
        self.inc("specdec_queue_seconds", queued_s)
        for rule, count in (s.relaxed or {}).items():
            self.inc("specdec_relaxed_accepts", count, rule=rule)
        with self._lock:
            h = self._hist
            h["count"] += 1
            h["sum"] += total_s
            for i, edge in enumerate(BUCKETS):
                if total_s <= edge:
                    h["buckets"][i] += 1

    def render(self, waiting: int, running: int) -> str:
        """The exposition text, with the queue gauges as of now."""
        gauges = {"vllm:num_requests_running": (running, self.model), "vllm:num_requests_waiting": (waiting, self.model),
                  "specdec_queue_depth": (waiting + running, {})}
        lines = []
        with self._lock:
            values = {name: dict(series) for name, series in self._values.items()}
            hist = {**self._hist, "buckets": list(self._hist["buckets"])}
        for name, (kind, text) in FAMILIES.items():
            exposed = name + "_total" if kind == "counter" else name
            lines += [f"# HELP {exposed} {text}", f"# TYPE {exposed} {kind}"]
            if kind == "gauge":
                value, labels = gauges[name]
                lines.append(f"{name}{_labels(labels)} {_num(value)}")
            elif kind == "counter":
                for key, value in values.get(name, {}).items():
                    lines.append(f"{exposed}{_labels(dict(key))} {_num(value)}")
            else:
                for edge, count in zip(BUCKETS, hist["buckets"]):
                    lines.append(f'{name}_bucket{{le="{edge}"}} {_num(count)}')
                lines.append(f'{name}_bucket{{le="+Inf"}} {_num(hist["count"])}')
                lines += [f"{name}_sum {_num(hist['sum'])}", f"{name}_count {_num(hist['count'])}"]
        return "\n".join(lines) + "\n"
