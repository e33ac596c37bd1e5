"""Prompts of the gen workload: a built-in set with a spread of lengths, or a JSONL file.

One home for the prompt distribution: ``latencylab profile --workload gen`` runs these prompts, and
``latencylab load`` sends them (``latencylab.load.prompts`` re-exports this module).

A JSONL file has one request per line: ``{"prompt": "...", "max_tokens": 64}`` or ``{"messages": [{"role":
"user", "content": "..."}], "max_tokens": 64}`` (``max_tokens`` optional: the default applies). A line that
is not such an object is refused with its file and line number, before anything is sent; so is a
``max_tokens`` that is not a whole number >= 1.

The built-in set mixes short chat questions with instructions over passages of the text workload's corpus
(Python documentation sentences) of growing length, from a few words to about 2,000 characters, with
``max_tokens`` from 32 to 256 in the proportion a chat service sees (most answers short, a few long).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from latencylab.errors import LatencyLabError

DEFAULT_MAX_TOKENS = 128


@dataclass(frozen=True, slots=True)
class Prompt:
    """One generative request: a prompt (completions, OIP generate) or chat messages, and its token limit."""

    prompt: str | None
    max_tokens: int
    messages: list[dict[str, Any]] | None = None
    label: str = ""

    @property
    def chars(self) -> int:
        if self.messages is not None:
            return sum(len(str(m.get("content", ""))) for m in self.messages)
        return len(self.prompt or "")


def check_max_tokens(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise LatencyLabError(f"{where}: max_tokens must be a whole number >= 1, got {value!r}")
    if value < 1:
        raise LatencyLabError(f"{where}: max_tokens must be >= 1, got {value} (a request for no tokens has no TTFT)")
    return value


def read_prompts(path: str | Path, default_max_tokens: int = DEFAULT_MAX_TOKENS) -> list[Prompt]:
    """The prompts of a JSONL file (see the module docstring); LatencyLabError names the first bad line."""
    p = Path(path)
    if not p.is_file():
        raise LatencyLabError(f"--prompts {path}: no such file")
    out = []
    for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{p}:{i}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise LatencyLabError(f"{where}: not JSON ({exc.msg})") from exc
        if not isinstance(obj, dict):
            raise LatencyLabError(f"{where}: expected an object with 'prompt' or 'messages'")
        max_tokens = check_max_tokens(obj.get("max_tokens", default_max_tokens), where)
        if "messages" in obj:
            msgs = obj["messages"]
            if (
                not isinstance(msgs, list)
                or not msgs
                or not all(
                    isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in msgs
                )
            ):
                raise LatencyLabError(f"{where}: 'messages' must be a non-empty list of {{role, content}} strings")
            out.append(Prompt(None, max_tokens, msgs, f"{p.name}:{i}"))
        elif isinstance(obj.get("prompt"), str) and obj["prompt"]:
            out.append(Prompt(obj["prompt"], max_tokens, None, f"{p.name}:{i}"))
        else:
            raise LatencyLabError(f"{where}: needs a non-empty string 'prompt' or a 'messages' list")
    if not out:
        raise LatencyLabError(f"{p}: no prompts")
    return out


_QUESTIONS = (
    "What is the capital of France?",
    "Name three primary colours.",
    "How many days are there in a leap year?",
    "Explain in one sentence what a hash table is.",
    "Write a haiku about the sea.",
    "What is the difference between a list and a tuple in Python?",
    "Give me two tips for writing clear commit messages.",
    "Why is the sky blue? Answer briefly.",
)
_TASKS = (
    "Summarise the following documentation notes in two sentences.",
    "List the main ideas of the following text as short bullet points.",
    "Rewrite the following notes as a short paragraph for a beginner.",
    "Which Python modules are mentioned in the following text? Explain what each does.",
)
# (passage size in corpus sentences, max_tokens) for the instruction prompts: lengths from ~60 to ~2,000 chars
_CONTEXTS = ((1, 64), (3, 128), (6, 128), (12, 256))
_QUESTION_TOKENS = (32, 32, 64, 32, 64, 128, 64, 32)


def builtin_prompts(max_tokens: int | None = None) -> list[Prompt]:
    """The built-in prompt set (16 prompts); ``max_tokens`` overrides every prompt's own limit."""
    from latencylab.workloads.text import corpus

    texts = corpus()
    out = [
        Prompt(q, max_tokens or n, None, f"question[{i}]")
        for i, (q, n) in enumerate(zip(_QUESTIONS, _QUESTION_TOKENS, strict=True))
    ]
    k = 0
    for j, task in enumerate(_TASKS):
        for size, n in _CONTEXTS[j % 2 :: 2]:  # tasks alternate short/mid and mid/long passages
            passage = " ".join(texts[(k + s) % len(texts)] for s in range(size))
            k += size
            out.append(Prompt(f"{task}\n\n{passage}", max_tokens or n, None, f"task[{j}]x{size}"))
    return out


def with_max_tokens(prompts: Sequence[Prompt], max_tokens: int) -> list[Prompt]:
    """The same prompts, every one limited to ``max_tokens``."""
    return [Prompt(p.prompt, max_tokens, p.messages, p.label) for p in prompts]
