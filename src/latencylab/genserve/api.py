"""Request bodies of the generative APIs, checked: OpenAI completions and chat, OIP generate.

Each parser turns a JSON body into a :class:`GenParams` or raises :class:`BadRequest` (a 4xx with a message
naming the field). Unknown fields are refused (a misspelt ``max_token`` would otherwise be silently ignored);
so are ``n`` other than 1, a ``max_tokens`` below 1 or over the server's limit, a sampling value out of range,
and chat messages that are not a non-empty list of ``{role, content}`` strings. The prompt's length against
the context window is checked once it is tokenized (service.py), also as a 400.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["BadRequest", "GenParams", "parse_chat", "parse_completions", "parse_generate"]

ROLES = ("system", "user", "assistant")
_SAMPLING = {"max_tokens", "temperature", "top_p", "seed", "stop"}
COMPLETIONS_FIELDS = frozenset({"model", "prompt", "stream", "stream_options", "n", "user"} | _SAMPLING)
CHAT_FIELDS = frozenset({"model", "messages", "stream", "stream_options", "n", "user", "max_completion_tokens"}
                        | _SAMPLING)  # fmt: skip
GENERATE_FIELDS = frozenset({"text_input", "parameters", "id", "model", "model_name"})
GENERATE_PARAMETERS = frozenset({"stream"} | _SAMPLING)
MAX_STOP = 4


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


@dataclass(frozen=True, slots=True)
class GenParams:
    """One request, checked: a prompt or chat messages, and how to generate."""

    prompt: str | None
    messages: tuple[dict[str, str], ...] | None
    max_tokens: int | None  # None: the server's default
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    model: str | None


def load_json(body: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise BadRequest("the body must be a JSON object")
    return obj


def _unknown(obj: dict[str, Any], allowed: frozenset[str], where: str = "") -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        raise BadRequest(
            f"unknown field{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra))}{where}; "
            f"accepted: {', '.join(sorted(allowed))}",
            param=extra[0],
        )


def _number(obj: dict[str, Any], key: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    v = obj.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise BadRequest(f"{key} must be a number, got {v!r}", param=key)
    if v > hi or v < lo or (lo_open and v == lo):
        raise BadRequest(f"{key} must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {v!r}", param=key)
    return float(v)


def _max_tokens(obj: dict[str, Any], key: str, limit: int) -> int | None:
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(f"{key} must be a whole number, got {v!r}", param=key)
    if v < 1:
        raise BadRequest(f"{key} must be at least 1, got {v}", param=key)
    if v > limit:
        raise BadRequest(f"{key} {v} is over this server's limit of {limit}", param=key)
    return v


def _sampling(obj: dict[str, Any], limit: int, key: str = "max_tokens") -> dict[str, Any]:
    seed = obj.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise BadRequest(f"seed must be a whole number in [0, 2^63), got {seed!r}", param="seed")
    stop = obj.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,) if stop else ()
    elif isinstance(stop, list) and len(stop) <= MAX_STOP and all(isinstance(s, str) and s for s in stop):
        stops = tuple(stop)
    else:
        raise BadRequest(f"stop must be a string or a list of up to {MAX_STOP} non-empty strings", param="stop")
    return {
        "max_tokens": _max_tokens(obj, key, limit),
        "temperature": _number(obj, "temperature", 0.0, 0.0, 2.0),
        "top_p": _number(obj, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        "seed": seed,
        "stop": stops,
    }


def _stream(obj: dict[str, Any]) -> tuple[bool, bool]:
    stream = obj.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"stream must be true or false, got {stream!r}", param="stream")
    opts = obj.get("stream_options")
    usage = False
    if opts is not None:
        if not isinstance(opts, dict) or set(opts) - {"include_usage"}:
            raise BadRequest('stream_options must be {"include_usage": true|false}', param="stream_options")
        usage = bool(opts.get("include_usage", False))
    n = obj.get("n", 1)
    if n != 1 or isinstance(n, bool):
        raise BadRequest(f"n must be 1 (one choice per request), got {n!r}", param="n")
    return stream, usage


def _model(obj: dict[str, Any], key: str = "model") -> str | None:
    m = obj.get(key)
    if m is not None and not isinstance(m, str):
        raise BadRequest(f"{key} must be a string", param=key)
    return m


def parse_completions(body: bytes, limit: int) -> GenParams:
    obj = load_json(body)
    _unknown(obj, COMPLETIONS_FIELDS)
    prompt = obj.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest("prompt must be a non-empty string", param="prompt")
    stream, usage = _stream(obj)
    return GenParams(prompt, None, **_sampling(obj, limit), stream=stream, include_usage=usage, model=_model(obj))


def parse_chat(body: bytes, limit: int) -> GenParams:
    obj = load_json(body)
    _unknown(obj, CHAT_FIELDS)
    msgs = obj.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("messages must be a non-empty list of {role, content} objects", param="messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or set(m) - {"role", "content", "name"}:
            raise BadRequest(f"messages[{i}] must be an object with role and content", param="messages")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise BadRequest(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}", param="messages")
        if not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content must be a string", param="messages")
        out.append({"role": role, "content": content})
    if "max_completion_tokens" in obj and obj.get("max_tokens") is None:
        sampling = _sampling(obj, limit, "max_completion_tokens")
    else:
        sampling = _sampling(obj, limit)
    stream, usage = _stream(obj)
    return GenParams(None, tuple(out), **sampling, stream=stream, include_usage=usage, model=_model(obj))


def parse_generate(body: bytes, limit: int, stream: bool) -> GenParams:
    """OIP generate / generate_stream: ``{"text_input": ..., "parameters": {...}}``."""
    obj = load_json(body)
    _unknown(obj, GENERATE_FIELDS)
    text = obj.get("text_input")
    if not isinstance(text, str) or not text:
        raise BadRequest("text_input must be a non-empty string", param="text_input")
    params = obj.get("parameters", {})
    if not isinstance(params, dict):
        raise BadRequest("parameters must be an object", param="parameters")
    _unknown(params, GENERATE_PARAMETERS, " in parameters")
    if "stream" in params and not isinstance(params["stream"], bool):
        raise BadRequest("parameters.stream must be true or false", param="stream")
    return GenParams(text, None, **_sampling(params, limit), stream=stream, include_usage=False, model=None)
