"""OpenAI response bodies and streaming chunks for ``/v1/completions`` and ``/v1/chat/completions``."""

from __future__ import annotations

import json
import time
import uuid

from ..api import Output


def usage(out: Output) -> dict:
    """Token counts plus ``speculative``: this request's statistics (``Stats.to_dict()`` and ``tau``)."""
    n = len(out.token_ids)
    spec = out.stats.to_dict()
    spec["tau"] = out.stats.mean_acceptance_length
    return {"prompt_tokens": out.prompt_tokens, "completion_tokens": n,
            "total_tokens": out.prompt_tokens + n, "speculative": spec}


class Shaper:
    """Builds one request's bodies: same ``id``, ``created`` and ``model`` in every chunk."""

    def __init__(self, chat: bool, model: str):
        self.chat, self.model = chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "system_fingerprint": None}

    def response(self, out: Output) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": out.text}, "logprobs": None,
                      "finish_reason": out.finish_reason}
        else:
            choice = {"index": 0, "text": out.text, "logprobs": None, "finish_reason": out.finish_reason}
        return {**self._head(self.object), "choices": [choice], "usage": usage(out)}

    def chunk(self, text: str | None, finish_reason: str | None = None, role: bool = False,
              with_usage: bool = False) -> dict:
        """A streaming chunk: a text delta, or (``finish_reason`` set) the final one."""
        if self.chat:
            delta = {} if text is None else {"content": text}
            if role:
                delta = {"role": "assistant", **delta}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        body = {**self._head(self.object + ".chunk" if self.chat else self.object), "choices": [choice]}
        if with_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, out: Output) -> dict:
        head = self._head(self.object + ".chunk" if self.chat else self.object)
        return {**head, "choices": [], "usage": usage(out)}


def sse(data: dict | str) -> bytes:
    """One server-sent event: ``data: <json>`` and a blank line."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()
