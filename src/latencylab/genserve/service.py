"""The generative model service: tokenizer, scheduler, the step thread, and one token stream per request.

The scheduler steps in a dedicated thread (the model's forwards release the GIL into torch's kernels). After
each step the thread hands the step's tokens to the event loop in one ``call_soon_threadsafe``; the loop
appends them to each request's :class:`TokenStream` and wakes its writer. The step thread never waits on a
client: a slow reader's tokens pile up in its own stream, which is bounded by its ``max_tokens`` (the ids and
their text), and its writer sends what has accumulated as one chunk when the socket drains (back-pressure
per stream, never on the batch). Stop strings are found on the loop as tokens arrive, whatever the reader's
pace; the scheduler then ends the sequence at its next step, and the text is cut before the stop string.

The SLO guard (``GenServeConfig.ladder`` with more than one rung; genserve/ladder.py, genserve/guard.py): each
model rung's engine has its own scheduler, and the one step thread steps every scheduler that has work, in turn
(two forwards at once would only fight over the same cores). ``open`` asks the guard which rung serves the
request; a probe of the rung above runs as a *shadow* copy there (at most ``probe_tokens`` tokens, its answer
discarded, its TTFT and TPOT observed), while the user is answered at the current rung. Every finished request
is observed by the guard on the step thread; the guard is evaluated every ``guard_every_s`` on the service's
clock, traffic or not, so a ladder left low when a burst ends climbs back on the timer.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from latencylab.clock import Clock, PerfCounterClock
from latencylab.genserve.api import BadRequest, GenParams
from latencylab.genserve.guard import GenGuard
from latencylab.genserve.ladder import AnswerCache, CachedAnswer, Rung, plan_ladder
from latencylab.genserve.metrics import GenMetrics
from latencylab.genserve.scheduler import (
    Engine,
    GenRequest,
    Sampling,
    Scheduler,
    SchedulerConfig,
    Seq,
    StepReport,
    TooLarge,
)  # fmt: skip
from latencylab.serve.admission import Shed
from latencylab.serve.batcher import now_reader
from latencylab.serve.guard import Alarm, Transition

log = logging.getLogger("latencylab.genserve")

__all__ = ["Codec", "GenServeConfig", "GenService", "HfCodec", "TokenStream"]


@dataclass(frozen=True, slots=True)
class GenServeConfig:
    """The generative server's settings (``latencylab serve --model gen``; docs/serve.md)."""

    model_name: str = "gen"
    aliases: tuple[str, ...] = ()  # other names a request's "model" may use (the Hugging Face id)
    host: str = "127.0.0.1"
    port: int = 8000
    token_env: str | None = None
    threads: int | None = None
    sched: SchedulerConfig = field(default_factory=SchedulerConfig)
    ttft_slo_s: float = 2.0  # each request's TTFT deadline: admission sheds what it predicts past it
    max_tokens_limit: int = 1024
    default_max_tokens: int = 256
    max_body_bytes: int = 1 << 20
    context_window: int = 8192
    # the SLO guard (docs/genserve.md): a ladder of one rung has no guard
    ladder: tuple[str, ...] = ("fp32",)  # best first, e.g. ("fp32", "int8", "capped", "cache")
    tpot_slo_s: float = 0.25  # the guard's TPOT p99 objective (its TTFT p99 objective is ttft_slo_s)
    guard: dict[str, Any] = field(default_factory=dict)  # GuardConfig overrides (window_s, dwell_s, ...)
    guard_every_s: float = 0.1  # how often the guard decides, traffic or not
    cap_tokens: int = 32  # the capped rung's max_tokens
    probe_tokens: int = 16  # a shadow probe's max_tokens: enough decode steps for a TPOT
    max_probes: int = 2  # shadow probes in flight at once (probes must not pile up on a struggling rung)
    cache_entries: int = 4096
    cache_ttl_s: float = 300.0  # fresh for this long, then stale (still served on the cache rung) for 10x
    int8_method: str = "dynamic"  # how the int8 rung is made (genserve/int8.py): "dynamic" or "weight"
    int8_fidelity: bool = True  # show the int8 rung's stored fidelity (python -m latencylab.genserve.int8)
    prefix_cache: bool = True  # prefill the chat template's fixed prefix once, reuse its K/V (genserve/prefix.py)
    prefill_dtype: str = "fp32"  # the prompt's forward: fp32, bf16 or auto (genserve/prefill.py); decode is FP32
    # the model's steps: "padded" (genserve/engine.py: a prefill chunk and the decode batch each their own forward,
    # one left-padded cache) or "packed" (genserve/packed.py: both in one forward, a static K/V buffer per sequence)
    engine: str = "padded"
    otlp_endpoint: str | None = None  # export a span per request (OTLP/HTTP), e.g. http://127.0.0.1:4318/v1/traces
    from_dir: str | None = None  # serve the variant `optimize --workload gen --out DIR` chose (from_optimize.py)


class Codec(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class HfCodec:
    """A transformers tokenizer: raw prompts as they are, chat messages through the model's chat template."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        from latencylab.workloads.gen import chat_ids

        return chat_ids(self.tok, messages)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tok.decode(list(ids), skip_special_tokens=True))


class TokenStream:
    """One request's output on the event loop: token ids, their text, what the writer has sent, the end."""

    def __init__(self, svc: GenService, params: GenParams, eos: frozenset[int]) -> None:
        self.svc = svc
        self.params = params
        self.eos = eos
        self.ids: list[int] = []
        self.text = ""
        self.sent = 0  # characters of ``text`` the writer has taken
        self.finish = ""  # "stop" | "length" | "cancelled" | "error" once ended
        self.stopped = False  # a stop string was seen (text is cut there)
        self.error = ""
        self.event = asyncio.Event()
        self.seq: Seq | None = None
        self.sched: Scheduler = svc.sched
        self.prompt_tokens = 0
        self.start_ns = 0  # the handler's start (the service's clock)
        self.epoch0 = 0  # time.time_ns() at the handler's start (spans are in epoch ns)
        self.level = 0  # the ladder rung that serves it
        self.rung = svc.rungs[0].name
        self.routed = True  # its latency is evidence for the guard about ``level``
        self.cap: int | None = None  # the capped rung cut its max_tokens to this
        self.cache_key: bytes | None = None
        self.cached: CachedAnswer | None = None  # answered from the cache

    # -- the loop side of the step thread (svc._deliver)
    def push(self, tok: int) -> None:
        if self.stopped or self.finish:
            return
        if tok not in self.eos:
            self.ids.append(tok)
            self.text = self.svc.codec.decode(self.ids)
            cut = min((i for i in (self.text.find(s) for s in self.params.stop) if i >= 0), default=-1)
            if cut >= 0:
                self.text = self.text[:cut]
                self.stopped = True
                if self.seq is not None:
                    self.sched.stop(self.seq)
                    self.svc.wake()
        self.event.set()

    def end(self, reason: str, error: str = "") -> None:
        if not self.finish:
            self.finish = "stop" if self.stopped else reason
            self.error = error
            cache = self.svc.cache
            if cache is not None and self.cache_key is not None and self.finish in ("stop", "length"):
                cache.put(self.cache_key, self.ids, self.text, self.finish, self.rung, self.cap)
        self.event.set()

    def replay(self, hit: CachedAnswer) -> None:
        """Answer from the cache: the whole stored answer, at once."""
        self.cached = hit
        self.ids = list(hit.ids)
        self.text = hit.text
        self.cap = hit.cap
        self.finish = hit.finish
        self.event.set()

    def label(self) -> dict[str, Any]:
        """Which rung answered and how (the response's ``latencylab`` field; docs/genserve.md)."""
        return {
            "rung": self.rung,
            "producer": self.cached.producer if self.cached is not None else self.rung,
            "cached": self.cached is not None,
            "max_tokens_cap": self.cap,
            "capped": self.cap is not None and self.finish == "length" and self.completion_tokens >= self.cap,
        }

    def headers(self) -> dict[str, str]:
        """The label as response headers (known when the response starts)."""
        out = {"X-LatencyLab-Rung": self.rung}
        if self.cap is not None:
            out["X-LatencyLab-Max-Tokens-Cap"] = str(self.cap)
        if self.cached is not None:
            out["X-LatencyLab-Cache"] = "stale" if self.cached.stale else "hit"
        return out

    # -- the writer's side
    def ready(self) -> str:
        """Text not yet taken that is safe to send: not the start of a possible stop string, not a half
        character (the tokenizer's U+FFFD for an incomplete UTF-8 sequence)."""
        end = len(self.text)
        if not self.finish:
            while end > self.sent and self.text[end - 1] == "\ufffd":
                end -= 1
            for s in self.params.stop:
                for k in range(min(len(s) - 1, end - self.sent), 0, -1):
                    if self.text[end - k : end] == s[:k]:
                        end -= k
                        break
        out = self.text[self.sent : end]
        self.sent = max(self.sent, end)
        return out

    async def chunks(self) -> Any:
        """Yield text pieces as they become sendable, until the sequence ends (then the rest)."""
        while True:
            await self.event.wait()
            self.event.clear()
            piece = self.ready()
            if piece:
                yield piece
            if self.finish:
                rest = self.ready()
                if rest:
                    yield rest
                return

    @property
    def completion_tokens(self) -> int:
        return len(self.ids)

    @property
    def finish_reason(self) -> str:
        return "length" if self.finish == "length" else "stop"


class _Probe:
    """A shadow copy of a request on the rung above the guard's: only the guard sees its times."""

    shadow = True  # metrics.py leaves shadow sequences out of the request histograms

    __slots__ = ("level", "start_ns")

    def __init__(self, level: int, start_ns: int) -> None:
        self.level = level
        self.start_ns = start_ns


class GenService:
    """The schedulers and their step thread, for one model (see the module docstring).

    ``engine`` serves the ladder's first rung; ``standby`` holds the other model rungs' engines by name (e.g.
    ``{"int8": ...}``)."""

    def __init__(
        self,
        cfg: GenServeConfig,
        codec: Codec,
        engine: Engine,
        eos: frozenset[int],
        clock: Clock | None = None,
        *,
        standby: Mapping[str, Engine] | None = None,
        on_alarm: Callable[[Alarm], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.codec = codec
        self.engine = engine
        self.eos = eos
        self.clock = clock or PerfCounterClock()
        self.now_ns = now_reader(self.clock)
        engines: dict[str, Engine] = {cfg.ladder[0]: engine, **(standby or {})}
        self.rungs: tuple[Rung, ...] = plan_ladder(cfg.ladder, list(engines), cfg.cap_tokens)
        used = dict.fromkeys(r.engine for r in self.rungs)
        self.scheds: dict[str, Scheduler] = {name: Scheduler(engines[name], cfg.sched, self.clock) for name in used}
        self.sched = self.scheds[self.rungs[0].engine]  # the top rung's
        self.metrics = GenMetrics(cfg.model_name, cfg.sched.kv_budget_tokens * len(self.scheds))
        self.guard: GenGuard | None = None
        if len(self.rungs) > 1:
            self.guard = GenGuard(
                [r.name for r in self.rungs], cfg.ttft_slo_s, cfg.tpot_slo_s, cfg.guard, self.clock,
                self._alarm(on_alarm), name=cfg.model_name,
            )  # fmt: skip
            self.metrics.ladder_level.labels(cfg.model_name).set(0)
        self.cache = AnswerCache(cfg.cache_entries, cfg.cache_ttl_s, self.clock) if self.rungs[-1].cache else None
        self.info: dict[str, Any] = {}  # what the server knows of its rungs (the int8 rung's fidelity, ...)
        self.served: dict[str, Any] | None = None  # the variant served, when it came from an optimize search
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._probes = 0  # shadow probes in flight
        self._next_eval_ns = 0
        self.failed = ""  # the step thread's error, if it died

    @property
    def names(self) -> tuple[str, ...]:
        return (self.cfg.model_name, *self.cfg.aliases)

    def _alarm(self, user: Callable[[Alarm], None] | None) -> Callable[[Alarm], None]:
        def on_alarm(alarm: Alarm) -> None:
            self.metrics.alarm.labels(self.cfg.model_name).set(1 if alarm.active else 0)
            if user is not None:
                user(alarm)

        return on_alarm

    # -- lifecycle

    def warmup(self, prompt_tokens: int = 64, max_tokens: int = 4) -> None:
        """Seed each scheduler's cost model with real steps (before serving): single prompts of two lengths (the
        prefill's fixed and per-token costs), then one sequence alone and a full batch (decode steps)."""
        prompt = tuple(range(100, 100 + prompt_tokens))
        lengths = sorted({max(1, prompt_tokens // 8), min(prompt_tokens * 2, self.cfg.sched.prefill_chunk_tokens)})
        for sched in self.scheds.values():
            forwards: list[tuple[int, float]] = []  # one prompt, one forward: a fixed cost and a cost per token
            for n_tok in lengths * 3:
                sched.submit(GenRequest(tuple(range(100, 100 + n_tok)), 1))
                while (rep := sched.step()) is not None:
                    if rep.prefill_tokens:
                        forwards.append((rep.prefill_tokens, rep.prefill_ns / 1e9))
            sched.costs.fit_prefill(forwards)
            for n in (1, self.cfg.sched.max_num_seqs):
                for _ in range(n):
                    sched.submit(GenRequest(prompt, max_tokens))
                while sched.step() is not None:
                    pass
            sched.costs.output_fraction = 1.0  # the warm-up's fixed lengths say nothing of real replies

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="genserve-steps", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(30)

    def wake(self) -> None:
        """Something was submitted or cancelled: the step thread looks at once."""
        self._wake.set()

    def _run(self) -> None:
        idle_s = min(0.2, self.cfg.guard_every_s) if self.guard is not None else 0.2
        while not self._stopping.is_set():
            self._wake.clear()
            if not self.run_once():
                self._wake.wait(idle_s)

    def run_once(self) -> bool:
        """One step of every scheduler with work (each step's tokens handed to the loop, or to the streams
        directly without one: unit tests), then the guard's decision if it is due; True if anything ran."""
        ran = False
        for sched in self.scheds.values():
            if not sched.has_work():
                continue
            try:
                rep = sched.step()
            except Exception as exc:  # a bug in the engine: fail what is in flight, keep serving
                log.exception("generation step failed")
                self._fail_all(sched, f"generation failed ({type(exc).__name__})")
                continue
            if rep is None:
                continue
            ran = True
            self.metrics.observe_step(rep)
            if sched is self.sched:
                self.metrics.forecast_scale.labels(self.cfg.model_name).set(sched.forecast_error.scale(rep.end_ns))
            self._account(rep)
            if rep.tokens or rep.finished:
                if self._loop is not None:
                    self._loop.call_soon_threadsafe(self._deliver, rep)
                else:
                    self._deliver(rep)
        if ran and len(self.scheds) > 1:
            s = list(self.scheds.values())
            self.metrics.set_state(
                sum(len(x.running) for x in s), sum(len(x.waiting) for x in s), sum(x.kv_reserved for x in s),
                sum(x.kv_used for x in s),
            )  # fmt: skip
        if self.guard is not None:
            now = self.now_ns()
            if now >= self._next_eval_ns:
                self._next_eval_ns = now + int(self.cfg.guard_every_s * 1e9)
                self.evaluate_guard()
        return ran

    def evaluate_guard(self) -> Transition | None:
        """Let the guard decide now (the step thread does, every ``guard_every_s``); the step it made."""
        if self.guard is None:
            return None
        t = self.guard.evaluate()
        if t is not None:
            m = self.cfg.model_name
            self.metrics.ladder_level.labels(m).set(t.to_level)
            self.metrics.transitions.labels(m, t.direction).inc()
        return t

    def _fail_all(self, sched: Scheduler, message: str) -> None:
        seqs = list(sched.running) + list(sched.waiting)
        for s in seqs:
            sched.cancel(s, "error")
        try:
            sched.step()  # applies the cancellations (releases the caches)
        except Exception:
            log.exception("cleanup after a failed step failed")
        for s in seqs:
            if isinstance(s.user, _Probe):
                with self._lock:
                    self._probes -= 1
            elif isinstance(s.user, TokenStream):
                if self._loop is not None:
                    self._loop.call_soon_threadsafe(s.user.end, "error", message)
                else:
                    s.user.end("error", message)

    def _deliver(self, rep: StepReport) -> None:
        for s, tok in rep.tokens:
            if isinstance(s.user, TokenStream):
                s.user.push(tok)
        for s in rep.finished:
            if isinstance(s.user, TokenStream):
                s.user.end(s.finish_reason)

    # -- the guard's evidence (on the step thread)

    def _account(self, rep: StepReport) -> None:
        guard = self.guard
        if guard is None:
            return
        for s in rep.finished:
            user = s.user
            if isinstance(user, _Probe):
                with self._lock:
                    self._probes -= 1
                self.metrics.probes.labels(self.cfg.model_name, self.rungs[user.level].name).inc()
                if s.finish_reason in ("stop", "length") and s.first_token_ns is not None:
                    guard.observe(user.level, *_times(s, user.start_ns), probe=True)
                else:
                    guard.observe_breach(user.level, probe=True)
            elif isinstance(user, TokenStream) and s.first_token_ns is not None:
                if user.routed and s.finish_reason in ("stop", "length"):
                    guard.observe(user.level, *_times(s, user.start_ns), probe=False)
                self._first_served(user.level)

    def _first_served(self, level: int) -> None:
        assert self.guard is not None
        switch = self.guard.first_served(level)
        if switch is not None:
            self.metrics.switch.labels(self.cfg.model_name, self.rungs[level].name).observe(switch)

    # -- requests

    def prompt_ids(self, params: GenParams) -> list[int]:
        if params.messages is not None:
            return self.codec.encode_chat(params.messages)
        return self.codec.encode(params.prompt or "")

    def open(self, params: GenParams, start_ns: int) -> TokenStream:
        """Tokenize, check against the context window, pick the rung, submit. Raises BadRequest (400),
        ``Shed`` (503)."""
        ids = self.prompt_ids(params)
        window = self.cfg.context_window
        if len(ids) >= window:
            raise BadRequest(
                f"the prompt is {len(ids)} tokens: it does not fit this model's context window of {window} tokens",
                param="prompt",
            )
        room = window - len(ids)
        if params.max_tokens is not None and params.max_tokens > room:
            raise BadRequest(
                f"the prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) = {len(ids) + params.max_tokens} "
                f"tokens, over this model's context window of {window} tokens",
                param="max_tokens",
            )
        max_tokens = params.max_tokens or min(self.cfg.default_max_tokens, room)
        stream = TokenStream(self, params, self.eos)
        stream.prompt_tokens = len(ids)
        stream.start_ns = start_ns
        m = self.cfg.model_name
        level = 0
        if self.guard is not None:
            level = self.guard.route()
            current = self.guard.level
            if level < current:  # a probe of the rung above: a shadow runs there, the user is served here
                self._shadow(level, ids, params, max_tokens, start_ns)
                level = current
        rung = self.rungs[level]
        if self.cache is not None:
            stream.cache_key = AnswerCache.key(ids, max_tokens, params.temperature, params.top_p, params.seed,
                                               params.stop)  # fmt: skip
        if rung.cache:
            hit = self.cache.get(stream.cache_key) if self.cache and stream.cache_key else None
            if hit is not None:
                self.metrics.cache.labels(m, "stale" if hit.stale else "hit").inc()
                stream.level, stream.rung = level, rung.name
                stream.replay(hit)
                if self.guard is not None:
                    self.guard.observe(level, (self.now_ns() - start_ns) / 1e9, None, probe=False)
                    self._first_served(level)
                self.metrics.rung_requests.labels(m, rung.name).inc()
                return stream
            self.metrics.cache.labels(m, "miss").inc()
            level -= 1  # no stored answer: the rung above answers, and it is no evidence about either rung
            stream.routed = False
            rung = self.rungs[level]
        stream.level, stream.rung = level, rung.name
        if rung.cap is not None and max_tokens > rung.cap:
            max_tokens = stream.cap = rung.cap
        sched = stream.sched = self.scheds[rung.engine]
        req = GenRequest(
            tuple(ids), max_tokens, Sampling(params.temperature, params.top_p, params.seed), self.eos,
            start_ns + int(self.cfg.ttft_slo_s * 1e9),
        )  # fmt: skip
        try:
            stream.seq = sched.submit(req, user=stream)
        except TooLarge as exc:
            raise BadRequest(str(exc), param="max_tokens") from None
        self.metrics.rung_requests.labels(m, rung.name).inc()
        self._wake.set()
        return stream

    def _shadow(self, level: int, ids: list[int], params: GenParams, max_tokens: int, start_ns: int) -> None:
        """Run a probe of ``level`` beside the user's request (see the module docstring)."""
        assert self.guard is not None
        rung = self.rungs[level]
        if rung.cache:
            return
        with self._lock:
            if self._probes >= self.cfg.max_probes:
                return
            self._probes += 1
        n = min(max_tokens, self.cfg.probe_tokens, rung.cap or max_tokens)
        req = GenRequest(
            tuple(ids), n, Sampling(params.temperature, params.top_p, params.seed), self.eos,
            start_ns + int(self.cfg.ttft_slo_s * 1e9),
        )  # fmt: skip
        try:
            self.scheds[rung.engine].submit(req, user=_Probe(level, start_ns))
        except (Shed, TooLarge):  # a probe the rung cannot take is evidence against stepping up to it
            with self._lock:
                self._probes -= 1
            self.metrics.probes.labels(self.cfg.model_name, rung.name).inc()
            self.guard.observe_breach(level, probe=True)

    def cancel(self, stream: TokenStream) -> None:
        if stream.seq is not None and not stream.finish:
            stream.sched.cancel(stream.seq)
            self._wake.set()

    def snapshot(self) -> dict[str, Any]:
        """The ladder, the guard's state, the cache's counters and admission's last refusals on the deadline (what
        each forecast, scaled by what, against what it was allowed) (``GET /v2/models/{m}/guard``)."""
        out: dict[str, Any] = {
            "ladder": [{"rung": r.name, "engine": r.engine, "max_tokens_cap": r.cap, "cache": r.cache,
                        **self.info.get(r.name, {})} for r in self.rungs],
        }  # fmt: skip
        if self.guard is not None:
            out["guard"] = self.guard.snapshot()
        if self.cache is not None:
            out["cache"] = self.cache.store.stats()
        now = self.sched.now_ns()
        out["admission"] = {
            "forecast_scale": self.sched.forecast_error.scale(now),
            "recent_sheds": [{**d, "age_s": round((now - d["at_ns"]) / 1e9, 3)} for d in self.sched.refusals()],
        }
        return out


def _times(s: Seq, start_ns: int) -> tuple[float, float | None]:
    """(TTFT, TPOT) of a finished sequence, seconds: TTFT from ``start_ns``; no TPOT for one token."""
    assert s.first_token_ns is not None
    ttft = (s.first_token_ns - start_ns) / 1e9
    n = len(s.token_ns)
    return ttft, ((s.token_ns[-1] - s.token_ns[0]) / (n - 1) / 1e9 if n >= 2 else None)
