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
            "total_tokens": out.prompt_tokens + n,
            "prompt_tokens_details": {"cached_tokens": out.stats.cached_prompt_tokens}, "speculative": spec}


class Shaper:
    """Builds one request's bodies: same ``id``, ``created`` and ``model`` in every chunk."""

    def __init__(self, chat: bool, model: str, tokenizer=None):
        self.chat, self.model, self.tokenizer = chat, model, tokenizer
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "system_fingerprint": None}

    def response(self, out: Output, echo=None, more: list[Output] | tuple = ()) -> dict:
        """The whole answer; ``echo`` (:class:`~specdec.frontends.server.worker.Echo`): /v1/completions' echo;
        ``more``: the choices after the first (``n`` > 1). ``usage`` counts every choice's tokens;
        its ``speculative`` statistics are the first choice's."""
        choices = [self._choice(i, o, echo) for i, o in enumerate([out, *more])]
        body = usage(out)
        if more:
            body["completion_tokens"] = sum(len(o.token_ids) for o in (out, *more))
            body["total_tokens"] = body["prompt_tokens"] + body["completion_tokens"]
        return {**self._head(self.object), "choices": choices, "usage": body}

    def _choice(self, index: int, out: Output, echo) -> dict:
        if self.chat:
            return {"index": index, "message": {"role": "assistant", "content": out.text},
                    "logprobs": self._chat_logprobs(out.logprobs), "finish_reason": out.finish_reason}
        text, lps = out.text, out.logprobs
        ids = list(out.token_ids)
        if echo is not None:
            text = self.tokenizer.decode(echo.prompt_ids) + text
            ids = list(echo.prompt_ids) + ids
            lps = None if lps is None or echo.logprobs is None else list(echo.logprobs) + list(lps)
        return {"index": index, "text": text, "logprobs": self._completion_logprobs(ids, lps),
                "finish_reason": out.finish_reason}

    def _piece(self, token: int) -> str:
        return self.tokenizer.decode([token])

    def _completion_logprobs(self, ids: list[int], lps) -> dict | None:
        """OpenAI's legacy completions shape: tokens, token_logprobs, top_logprobs, text_offset (an
        echoed prompt's first token has no log-probability: None, as in vLLM)."""
        if lps is None:
            return None
        tokens = [self._piece(t) for t in ids]
        offsets, at = [], 0
        for piece in tokens:
            offsets.append(at)
            at += len(piece)
        return {"tokens": tokens,
                "token_logprobs": [None if lp is None else lp.logprob for lp in lps],
                "top_logprobs": [None if lp is None else {self._piece(t): v for t, v in lp.top} for lp in lps],
                "text_offset": offsets}

    def _chat_logprobs(self, lps) -> dict | None:
        """OpenAI's chat shape: content, one entry per token with its top alternatives."""
        if lps is None:
            return None

        def entry(token: int, logprob: float) -> dict:
            piece = self._piece(token)
            return {"token": piece, "logprob": logprob, "bytes": list(piece.encode("utf-8"))}

        return {"content": [{**entry(lp.token, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
                            for lp in lps]}

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
