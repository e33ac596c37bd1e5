"""The generative model service: tokenizer, scheduler, the step thread, and one token stream per request.

The scheduler steps in a dedicated thread (the model's forwards release the GIL into torch's kernels). After
each step the thread hands the step's tokens to the event loop in one ``call_soon_threadsafe``; the loop
appends them to each request's :class:`TokenStream` and wakes its writer. The step thread never waits on a
client: a slow reader's tokens pile up in its own stream, which is bounded by its ``max_tokens`` (the ids and
their text), and its writer sends what has accumulated as one chunk when the socket drains (back-pressure
per stream, never on the batch). Stop strings are found on the loop as tokens arrive, whatever the reader's
pace; the scheduler then ends the sequence at its next step, and the text is cut before the stop string.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from latencylab.clock import Clock, PerfCounterClock
from latencylab.genserve.api import BadRequest, GenParams
from latencylab.genserve.metrics import GenMetrics
from latencylab.genserve.scheduler import Engine, GenRequest, Sampling, Scheduler, SchedulerConfig, Seq, StepReport
from latencylab.serve.batcher import now_reader

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
        self.prompt_tokens = 0

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
                    self.svc.sched.stop(self.seq)
        self.event.set()

    def end(self, reason: str, error: str = "") -> None:
        if not self.finish:
            self.finish = "stop" if self.stopped else reason
            self.error = error
        self.event.set()

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


class GenService:
    """The scheduler and its step thread, for one model (see the module docstring)."""

    def __init__(
        self,
        cfg: GenServeConfig,
        codec: Codec,
        engine: Engine,
        eos: frozenset[int],
        clock: Clock | None = None,
    ) -> None:
        self.cfg = cfg
        self.codec = codec
        self.engine = engine
        self.eos = eos
        self.clock = clock or PerfCounterClock()
        self.now_ns = now_reader(self.clock)
        self.sched = Scheduler(engine, cfg.sched, self.clock)
        self.metrics = GenMetrics(cfg.model_name, cfg.sched.kv_budget_tokens)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.failed = ""  # the step thread's error, if it died

    @property
    def names(self) -> tuple[str, ...]:
        return (self.cfg.model_name, *self.cfg.aliases)

    # -- lifecycle

    def warmup(self, prompt_tokens: int = 64, max_tokens: int = 4) -> None:
        """Seed the cost model with real steps (before serving): one sequence alone, then a full batch."""
        prompt = tuple(range(100, 100 + prompt_tokens))
        for n in (1, self.cfg.sched.max_num_seqs):
            for _ in range(n):
                self.sched.submit(GenRequest(prompt, max_tokens))
            while self.sched.step() is not None:
                pass
        self.sched.costs.output_fraction = 1.0  # the warm-up's fixed lengths say nothing of real replies

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="genserve-steps", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        with self.sched.work:
            self.sched.work.notify_all()
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        sched = self.sched
        while not self._stopping.is_set():
            if not sched.wait_for_work(0.2):
                continue
            try:
                rep = sched.step()
            except Exception as exc:  # a bug in the engine: fail what is in flight, keep serving
                log.exception("generation step failed")
                self._fail_all(f"generation failed ({type(exc).__name__})")
                continue
            if rep is None:
                continue
            self.metrics.observe_step(rep)
            if (rep.tokens or rep.finished) and self._loop is not None:
                self._loop.call_soon_threadsafe(self._deliver, rep)

    def _fail_all(self, message: str) -> None:
        seqs = list(self.sched.running) + list(self.sched.waiting)
        for s in seqs:
            self.sched.cancel(s, "error")
        try:
            self.sched.step()  # applies the cancellations (releases the caches)
        except Exception:
            log.exception("cleanup after a failed step failed")
        if self._loop is not None:
            for s in seqs:
                if isinstance(s.user, TokenStream):
                    self._loop.call_soon_threadsafe(s.user.end, "error", message)

    def _deliver(self, rep: StepReport) -> None:
        for s, tok in rep.tokens:
            if isinstance(s.user, TokenStream):
                s.user.push(tok)
        for s in rep.finished:
            if isinstance(s.user, TokenStream):
                s.user.end(s.finish_reason)

    # -- requests

    def prompt_ids(self, params: GenParams) -> list[int]:
        if params.messages is not None:
            return self.codec.encode_chat(params.messages)
        return self.codec.encode(params.prompt or "")

    def open(self, params: GenParams, start_ns: int) -> TokenStream:
        """Tokenize, check against the context window, submit. Raises BadRequest (400), ``Shed`` (503)."""
        from latencylab.genserve.scheduler import TooLarge

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
        req = GenRequest(
            tuple(ids), max_tokens, Sampling(params.temperature, params.top_p, params.seed), self.eos,
            start_ns + int(self.cfg.ttft_slo_s * 1e9),
        )  # fmt: skip
        try:
            stream.seq = self.sched.submit(req, user=stream)
        except TooLarge as exc:
            raise BadRequest(str(exc), param="max_tokens") from None
        return stream

    def cancel(self, stream: TokenStream) -> None:
        if stream.seq is not None and not stream.finish:
            self.sched.cancel(stream.seq)
