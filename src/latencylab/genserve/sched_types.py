"""The generative scheduler's data: its configuration, a request, a sequence in flight, the engine it drives and
what one step reports (genserve/scheduler.py has the policy that uses them and re-exports every name here)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from latencylab.genserve.budget import PrefillBudget

__all__ = ["Engine", "GenRequest", "Sampling", "SchedulerConfig", "Seq", "StepReport", "TooLarge"]


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Bounds of the running batch and of the work admitted (docs/serve.md, "Generative serving")."""

    max_num_seqs: int = 8  # sequences in the running batch
    kv_budget_tokens: int = 16384  # KV cache positions reserved by running sequences (prompt + max_tokens each)
    prefill_chunk_tokens: int = 128  # prompt tokens prefilled per step (chunked prefill)
    max_waiting: int = 256  # queued sequences beyond the running batch; more are shed ("queue_full")
    margin_s: float = 0.02  # added to every TTFT prediction (timer, hand-over, first write)
    # admission plans a first token inside this fraction of the time left to its TTFT deadline: under overload
    # every admitted request is planned at the boundary, so the plan must sit below the deadline for the p99 to
    ttft_target_fraction: float = 0.9
    forecast_quantile: float = 0.9  # the quantile of recent forecast errors (actual / forecast) admission scales by
    # the TPOT objective (s): when set, a step's prefill budget follows the decoders' TPOT slack and the batch
    # grows only while its decode step fits (genserve/budget.py); None: a fixed prefill_chunk_tokens a step
    tpot_slo_s: float | None = None
    tpot_target_fraction: float = 0.9  # steps plan for this fraction of the TPOT objective
    # with tpot_slo_s: the longest gap (ITL) a step with decoders is planned to make (its decode + prefill);
    # None: only the TPOT plan bounds a step, and slack saved over cheap steps may go into one long gap
    itl_cap_s: float | None = None
    # with itl_cap_s: a step passes the cap (within the TPOT plan) when a prompt being prefilled is behind the time
    # admission planned its first token for (genserve/budget.py); False (the default: measured no better on the
    # built-in workload, session 23): the cap holds, and admission refuses what its chunks would bring in late
    itl_cap_yields: bool = False
    min_prefill_tokens: int = 16  # with tpot_slo_s: a step's prefill budget, at least (every prompt moves)
    max_prefill_tokens: int = 1024  # with tpot_slo_s: at most (and with nothing decoding: a prompt in one forward)
    # with tpot_slo_s: the TPOT margin. Steps plan for the target divided by the recent error of that plan (the
    # tpot_quantile of actual TPOT / planned TPOT over replies that used at least half of their plan), at most
    # tpot_max_scale: what the cost model does not see (work between steps, a costlier chunk) is learnt, and the
    # plan moves down until the replies' TPOT sits at the target again. 1.0 (the default): no margin beyond the
    # target; measured at 2x overload with 1.5 it over-reacted (docs/benchmarks/generative.md, "Session 13")
    tpot_quantile: float = 0.9
    tpot_max_scale: float = 1.0
    # speculative decoding on a fused (packed) engine: up to this many tokens drafted by prompt lookup for every
    # greedy decoding sequence, verified in the step's forward (genserve/packed.py); 0: off
    spec_lookup_k: int = 0
    # ... only in steps decoding at most this many sequences: above it a step is a matrix product already and the
    # verify rows cost their share (measured: 1.35x TPOT at batch 4, none at 8; docs/benchmarks/speculative.md)
    spec_max_batch: int = 4

    def __post_init__(self) -> None:
        if self.spec_lookup_k < 0 or self.spec_max_batch < 1:
            raise ValueError(
                f"need spec_lookup_k >= 0 and spec_max_batch >= 1, got {self.spec_lookup_k}, {self.spec_max_batch}"
            )
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.kv_budget_tokens < 2:
            raise ValueError(f"kv_budget_tokens must be >= 2, got {self.kv_budget_tokens}")
        if self.prefill_chunk_tokens < 1:
            raise ValueError(f"prefill_chunk_tokens must be >= 1, got {self.prefill_chunk_tokens}")
        if self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {self.max_waiting}")
        if not 0 < self.ttft_target_fraction <= 1:
            raise ValueError(f"ttft_target_fraction must be in (0, 1], got {self.ttft_target_fraction}")
        if not 0 < self.forecast_quantile <= 1:
            raise ValueError(f"forecast_quantile must be in (0, 1], got {self.forecast_quantile}")
        if self.tpot_slo_s is not None and self.tpot_slo_s <= 0:
            raise ValueError(f"tpot_slo_s must be > 0, got {self.tpot_slo_s}")
        if self.itl_cap_s is not None and self.itl_cap_s <= 0:
            raise ValueError(f"itl_cap_s must be > 0, got {self.itl_cap_s}")
        if not 0 < self.tpot_target_fraction <= 1:
            raise ValueError(f"tpot_target_fraction must be in (0, 1], got {self.tpot_target_fraction}")
        if self.tpot_max_scale < 1 or not 0 < self.tpot_quantile <= 1:
            raise ValueError(
                f"need tpot_max_scale >= 1 and 0 < tpot_quantile <= 1, got {self.tpot_max_scale}, {self.tpot_quantile}"
            )
        if not 1 <= self.min_prefill_tokens <= self.max_prefill_tokens:
            raise ValueError(
                f"need 1 <= min_prefill_tokens <= max_prefill_tokens, got {self.min_prefill_tokens}, "
                f"{self.max_prefill_tokens}"
            )

    def prefill_budget(self) -> PrefillBudget | None:
        """The TPOT-tied prefill budget (None without ``tpot_slo_s``: a fixed chunk a step)."""
        if self.tpot_slo_s is None:
            return None
        return PrefillBudget(
            self.tpot_slo_s * self.tpot_target_fraction, self.min_prefill_tokens, self.max_prefill_tokens,
            self.itl_cap_s, self.itl_cap_yields,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Sampling:
    """Token choice: greedy at temperature 0 (the default), else temperature + nucleus (top-p), seeded."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class GenRequest:
    """One generation: prompt token ids, the output limit, sampling, EOS ids and the TTFT deadline."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: Sampling = Sampling()
    eos_ids: frozenset[int] = frozenset()
    ttft_deadline_ns: int | None = None  # absolute, on the scheduler's clock; None: no admission check

    @property
    def kv_tokens(self) -> int:
        """KV positions the sequence may use: its prompt and every output token but the last."""
        return len(self.prompt_ids) + self.max_tokens - 1


class TooLarge(ValueError):
    """The request can never run: its KV reservation exceeds the whole budget (a 400, not a 503)."""


@dataclass(eq=False, slots=True)
class Seq:
    """A sequence in the scheduler: its request, progress and times (ns, the scheduler's clock)."""

    id: int
    req: GenRequest
    arrival_ns: int
    tokens: list[int] = field(default_factory=list)
    prefilled: int = 0  # prompt tokens already in the cache
    cached_tokens: int = 0  # of them, the engine's prefix cache held at admission (never prefilled here)
    state: str = "waiting"  # waiting -> prefill -> decode -> finished
    joined_ns: int | None = None  # entered the running batch
    first_token_ns: int | None = None
    token_ns: list[int] = field(default_factory=list)  # time each token was chosen (end of its step)
    finish_reason: str = ""  # "stop" (EOS or a stop string), "length", "cancelled"
    finished_ns: int | None = None
    cancel_reason: str = ""  # set by cancel()/stop(); applied at the next step
    cancel_ns: int | None = None  # when cancel()/stop() was called (the slot is freed at the next step's start)
    engine_state: Any = None  # the engine's per-sequence data (its KV cache)
    generator: Any = None  # the engine's sampler state (a seeded torch.Generator)
    user: Any = None  # the caller's handle (the HTTP layer's stream)
    forecast_s: float | None = None  # admission's TTFT forecast (unscaled), kept when it was near its deadline
    predicted_s: float | None = None  # admission's TTFT forecast (unscaled) of every request with a deadline

    @property
    def finished(self) -> bool:
        return self.state == "finished"

    @property
    def prompt_len(self) -> int:
        return len(self.req.prompt_ids)


class Engine(Protocol):
    """The model behind the scheduler (genserve/engine.py has the real one; tests use a fake)."""

    def prefill(self, seq: Seq, start: int, end: int) -> int | None:
        """Run prompt tokens ``[start, end)`` of ``seq`` into its cache; at the prompt's end return the first
        output token, else None."""

    def decode(self, seqs: Sequence[Seq]) -> list[int]:
        """One forward over every sequence (each has ``tokens[-1]`` not yet in its cache): the next token of each."""

    def release(self, seq: Seq) -> None:
        """Free ``seq``'s cache (it has left the batch)."""

    # optional: ``cached_prefix(prompt_ids) -> int``, the leading prompt tokens a prefix cache holds (the
    # sequence's prefill then starts there: genserve/prefix.py); an engine without it has none. A *fused* engine
    # (``fused = True``, genserve/packed.py) also has ``mixed(chunks, seqs) -> (first tokens, next tokens)``: a
    # step's chunks and decode batch in one forward, which the scheduler then calls once a step


@dataclass(frozen=True, slots=True)
class StepReport:
    """What one step did: timings (ns), the batch, the tokens chosen and the sequences that ended."""

    start_ns: int
    end_ns: int
    prefill_tokens: int
    prefill_ns: int
    decode_batch: int
    decode_ns: int
    tokens: tuple[tuple[Seq, int], ...]  # (sequence, token) in the order chosen
    finished: tuple[Seq, ...]  # ended this step (including cancellations applied at its start)
    joined: tuple[Seq, ...]  # entered the running batch this step
    running: int  # sequences in the batch after the step
    waiting: int
    kv_reserved: int  # KV tokens reserved after the step
    kv_used: int  # KV positions holding real tokens after the step
    drafted: int = 0  # speculative decoding: tokens drafted this step, and of them the ones the model agreed with
    draft_accepted: int = 0
