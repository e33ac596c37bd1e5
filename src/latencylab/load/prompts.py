"""Prompts for generative load tests: the gen workload's prompt distribution (one home for it:
:mod:`latencylab.workloads.gen_prompts`), re-exported for the load generator."""

from __future__ import annotations

from latencylab.workloads.gen_prompts import (
    DEFAULT_MAX_TOKENS,
    Prompt,
    builtin_prompts,
    check_max_tokens,
    read_prompts,
    with_max_tokens,
)

__all__ = ["DEFAULT_MAX_TOKENS", "Prompt", "builtin_prompts", "check_max_tokens", "read_prompts", "with_max_tokens"]
