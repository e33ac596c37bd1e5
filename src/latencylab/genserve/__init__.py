"""Generative serving: iteration-level (continuous) batching of a causal LM behind an OpenAI-compatible API.

scheduler (which sequences run each step; torch-free), cost (TTFT prediction for admission), engine (the
real model: chunked prefill, padded batched decode), app (HTTP: OpenAI + OIP generate), metrics.
"""
