"""The generative options of ``latencylab load`` (``--api`` switches them on).

Kept apart from ``gen_frontend`` so that building the CLI parser imports nothing heavy.
"""

from __future__ import annotations

import argparse

APIS = ("completions", "chat", "generate_stream", "generate")


def _max_tokens(text: str) -> int:
    try:
        n = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from exc
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n} (a request for no tokens has no first token)")
    return n


def add_gen_arguments(ld: argparse.ArgumentParser) -> None:
    """Add ``--api``, ``--prompts`` and ``--max-tokens`` to the ``load`` parser."""
    ld.add_argument(
        "--api", choices=APIS, default=None,
        help="generative endpoint: OpenAI completions / chat (stream: true), OIP generate_stream / generate; "
        "measures TTFT, TPOT, ITL and E2E (default rate 1/s)",
    )  # fmt: skip
    ld.add_argument(
        "--prompts", metavar="FILE.jsonl",
        help='--api: one {"prompt": ...} or {"messages": [...]} with "max_tokens" a line (default: built-in set)',
    )  # fmt: skip
    ld.add_argument("--max-tokens", type=_max_tokens, help="--api: every request's max_tokens (>= 1)")
