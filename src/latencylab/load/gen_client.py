"""Generative protocols the load generator speaks: OpenAI-compatible completions and chat (``stream: true``),
and the Open Inference Protocol's generate extension (``generate``, ``generate_stream``).

Each protocol is a :class:`GenApi`: the request path and body it sends for a :class:`~latencylab.load.prompts.Prompt`,
and how it reads the answer (a :class:`~latencylab.load.sse.StreamKind`):

* ``completions`` -- ``POST /v1/completions`` ``{"model", "prompt", "max_tokens", "stream": true,
  "stream_options": {"include_usage": true}}``; events ``data: {"choices": [{"text": ...}]}``, an optional
  usage event (``usage.completion_tokens``), then ``data: [DONE]``.
* ``chat`` -- ``POST /v1/chat/completions`` with ``messages``; the text is in ``choices[0].delta.content``
  (the first event, carrying only the role, is not a token).
* ``generate_stream`` -- ``POST /v2/models/{m}/generate_stream`` ``{"text_input", "parameters":
  {"max_tokens", "stream": true}}``; events ``data: {"text_output": ...}``; the end of the body ends it.
* ``generate`` -- ``POST /v2/models/{m}/generate``: one JSON answer ``{"text_output": ...}`` (end to end
  only: a one-shot answer has no first token of its own).

An event that carries output text counts as one token unless the protocol says otherwise (OIP events may
carry ``"token_count"``); the server's ``usage.completion_tokens``, when sent, is the request's token count.
An event with an ``error`` field (or ``event: error``) fails the request with the server's message.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from latencylab.errors import LatencyLabError
from latencylab.load.gen_cli import APIS
from latencylab.load.generator import Payload
from latencylab.load.prompts import Prompt
from latencylab.load.sse import MAX_REASON, Trace, error_message


def _json(trace: Trace, data: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(data)
    except ValueError:
        trace.fail(f"malformed event data (not JSON): {data[:60]!r}")
        return None
    if not isinstance(obj, dict):
        trace.fail(f"malformed event data (not a JSON object): {data[:60]!r}")
        return None
    return obj


def _error_event(trace: Trace, obj: dict[str, Any]) -> bool:
    if obj.get("error"):
        trace.fail(f"error event: {error_message(json.dumps(obj).encode())}"[:MAX_REASON])
        return True
    return False


@dataclass(frozen=True, slots=True)
class GenApi:
    """One generative protocol: request building (path, body) and stream reading (``StreamKind``)."""

    name: str  # one of APIS

    @property
    def needs_end(self) -> bool:
        return self.name in ("completions", "chat")

    @property
    def streaming(self) -> bool:
        return self.name != "generate"

    def path(self, model: str) -> str:
        if self.name == "completions":
            return "/v1/completions"
        if self.name == "chat":
            return "/v1/chat/completions"
        return f"/v2/models/{model}/{self.name}"

    def body(self, model: str, prompt: Prompt) -> dict[str, Any]:
        """The JSON request for one prompt (``prompt.max_tokens`` is sent as is: the server judges it)."""
        if self.name == "chat":
            messages = prompt.messages or [{"role": "user", "content": prompt.prompt or ""}]
            return {
                "model": model, "messages": messages, "max_tokens": prompt.max_tokens, "stream": True,
                "stream_options": {"include_usage": True},
            }  # fmt: skip
        if prompt.messages is not None:
            raise LatencyLabError(f"prompt {prompt.label}: 'messages' needs --api chat ({self.name} takes a prompt)")
        if self.name == "completions":
            return {
                "model": model, "prompt": prompt.prompt, "max_tokens": prompt.max_tokens, "stream": True,
                "stream_options": {"include_usage": True},
            }  # fmt: skip
        params: dict[str, Any] = {"max_tokens": prompt.max_tokens}
        if self.name == "generate_stream":
            params["stream"] = True
        return {"text_input": prompt.prompt, "parameters": params}

    def payloads(self, model: str, prompts: Sequence[Prompt]) -> list[Payload]:
        return [Payload(json.dumps(self.body(model, p)).encode(), p.label) for p in prompts]

    # -- StreamKind ------------------------------------------------------------------------------------
    def event(self, trace: Trace, kind: str, data: str, t_ns: int) -> None:
        if trace.error:
            return  # after an error event the rest of the stream is read but not counted
        if self.needs_end and data.strip() == "[DONE]":
            trace.saw_end = True
            return
        if kind == "error":  # an SSE error event: its data is the message, JSON or not
            trace.fail(f"error event: {error_message(data.encode())}"[:MAX_REASON])
            return
        obj = _json(trace, data)
        if obj is None or _error_event(trace, obj):
            return
        if self.needs_end:
            usage = obj.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                trace.usage_tokens = usage["completion_tokens"]
            for choice in obj.get("choices") or ():
                if not isinstance(choice, dict):
                    continue
                if self.name == "chat":
                    delta = choice.get("delta")
                    text = delta.get("content") if isinstance(delta, dict) else None
                else:
                    text = choice.get("text")
                if text:
                    trace.token(t_ns)
                    return  # n = 1: one choice per request
            return
        text = obj.get("text_output")
        if text:
            n = obj.get("token_count")
            trace.token(t_ns, n if isinstance(n, int) and n > 0 else 1)

    def whole(self, trace: Trace, body: bytes, t_ns: int) -> None:
        trace.streamed = False
        try:
            obj = json.loads(body)
        except ValueError:
            trace.fail(f"answer is not JSON: {error_message(body)}")
            return
        if not isinstance(obj, dict) or obj.get("error"):
            trace.fail(f"error answer: {error_message(body)}")
            return
        if not obj.get("text_output"):
            trace.fail("answer without text_output")
            return
        trace.token(t_ns, 1)


def gen_api(name: str) -> GenApi:
    if name not in APIS:
        raise LatencyLabError(f"--api {name!r}: one of {', '.join(APIS)}")
    return GenApi(name)
