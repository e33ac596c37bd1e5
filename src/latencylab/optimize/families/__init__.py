"""Candidate families: one module per runtime, each exposing ``candidates(ctx) -> list[Candidate]``."""
