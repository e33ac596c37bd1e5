"""The server's model repository config: a small TOML file listing models, their ladder and limits.

Example (``serve.toml``)::

    [server]
    host = "127.0.0.1"          # never 0.0.0.0 unless you mean it
    port = 8000
    max_body_bytes = 4194304
    token_env = "LATENCYLAB_TOKEN"   # optional: require "Authorization: Bearer <value of this env var>"
    webhook = "http://127.0.0.1:9000/alarm"   # optional: alarms are POSTed here as JSON
    otlp_endpoint = "http://127.0.0.1:4318/v1/traces"  # optional: OTLP/HTTP trace export
    switch_interval_ms = 0.5    # the process's GIL switch interval (CPython's default is 5 ms)
    gc_freeze = true            # freeze what start-up and warm-up left (gc.freeze): full collections skip it

    [[models]]
    name = "text"               # built-in: text (MiniLM) or vision (digits CNN)
    ladder = ["fp32-onnx", "trunc64", "int8", "cache"]   # primary -> lighter -> quantised -> cached answer + alarm
    # from_optimize = "best/"   # or: serve what `latencylab optimize --out best/` found (ladder optional: the
                                #   search's, serve/from_optimize.py); any name
    slo_ms = 100                # P99 objective the guard holds (quantile below)
    quantile = 0.99
    max_batch_size = 8
    max_queue_delay_ms = 4      # longest a request waits for its batch to fill
    max_queue = 256             # beyond this, requests are shed with 503 + Retry-After
    default_deadline_ms = 30000 # deadline of requests that do not state one
    compute_workers = 1         # batches computed at once per variant (with --threads 1: one core each)
    long_input_threads = 2      # optional (text): a batch whose longest input has >= long_input_tokens tokens
    long_input_tokens = 96      #   runs on this many intra-op threads (the others on --threads)
    ort_threads = 1             # optional (ONNX Runtime variants): the session's intra-op threads (default:
                                #   the server's --threads); with compute_workers = 2, two 1-thread forwards
    ort_spin_us = 3000          # optional (ONNX Runtime variants): idle intra-op threads spin this long, then
                                #   sleep (default: ORT's own, which spins through the gaps of a served load)
    admission_slack = "boundary"  # what admission adds to its prediction: boundary | off (serve/slack.py)
    slo_target_fraction = 0.9   # the admitted latency is aimed inside this fraction of min(deadline, SLO)
    admission_margin = "learned" # learned: a margin fed back from admitted latency | fixed: (1 - fraction) x SLO
    margin_quantile = 0.99      #   the quantile of admitted latency (2-s windows) the learned margin puts there
    admit_when_idle = true      # nothing ahead of a request: judged by the fixed target (slo_target_fraction) and
                                #   a slack learned from such requests, not by the margin + slack learned behind a queue
    direct_when_idle = false    # idle batcher: preprocess + compute on the compute thread, one hand-over
    preprocess_in_batch = false # preprocess on the compute thread, in the batch (no preprocess pool; variants
                                #   without cost buckets only, e.g. vision): one core gains nothing from a pool
    order_by = "deadline"       # text buckets run shortest first, unless a request's deadline is at risk;
                                #   "slo": unless its start + slo_ms (or its deadline, if sooner) is at risk
    cache_ttl_s = 60
    cache_entries = 10000
    [models.guard]              # optional overrides of GuardConfig
    window_s = 10
    dwell_s = 5
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from latencylab.errors import LatencyLabError
from latencylab.files import read_toml

KNOWN_MODELS = ("text", "vision")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    ladder: tuple[str, ...]
    slo_ms: float = 100.0
    quantile: float = 0.99
    max_batch_size: int = 8
    max_queue_delay_ms: float = 4.0
    max_queue: int = 256
    default_deadline_ms: float = 30_000.0
    cache_ttl_s: float = 60.0
    cache_entries: int = 10_000
    compute_workers: int = 1
    long_input_threads: int | None = None
    long_input_tokens: int = 96
    ort_spin_us: int | None = None  # ONNX Runtime variants: session.intra_op.spin_duration_us (None: ORT's)
    ort_threads: int | None = None  # ONNX Runtime variants: the session's intra-op threads (None: --threads)
    admission_slack: str = "boundary"  # "boundary" | "off" (serve/slack.py)
    # admission aims at the deadline less (1 - this) x min(the request's budget, slo_ms): with a deadline equal
    # to the SLO, at 90% of it, so the noise around the prediction keeps the admitted p99 inside the SLO
    slo_target_fraction: float = 0.9
    # "learned": the margin is fed back from the latency of admitted requests (serve/slack.LearnedMargin), until
    # their margin_quantile sits at slo_target_fraction x the SLO; "fixed": (1 - slo_target_fraction) x the SLO
    admission_margin: str = "learned"
    margin_quantile: float = 0.99
    # a request with nothing queued or computing ahead of it is admitted if its predicted finish (+ the batcher's
    # 3-ms margin + the idle slack, learned from such requests alone) is inside the fixed target, whatever the learned
    # margin and boundary slack say: they are learned from requests admitted behind a queue, and once they grow past
    # the SLO they would refuse the very requests that show them too large (issue 22, docs/benchmarks/serve.md)
    admit_when_idle: bool = True
    direct_when_idle: bool = False  # an idle batcher preprocesses + computes a request in one hand-over
    # preprocess each request on the compute thread, just before its batch's forward, instead of in the preprocess
    # pool: two thread hand-offs fewer per request (docs/benchmarks/serve.md, session 18); not for variants with
    # cost buckets (text), whose bucket is known only once preprocessed
    preprocess_in_batch: bool = False
    # what the order of text buckets protects: "deadline" (the deadline only: with the 30-s default, plain
    # shortest-first) or "slo" (each request's start + slo_ms, or its deadline if sooner; measured worse here)
    order_by: str = "deadline"
    guard: dict[str, Any] = field(default_factory=dict)
    # "package.module:function": called as function(variant_names, max_batch_size, device) -> list of Variants,
    # for models that are not built in (e.g. an exported artifact wrapped in a Variant).
    factory: str | None = None
    # an output directory of `latencylab optimize --out`: the ladder's rungs are its candidates (serve --from)
    from_optimize: str | None = None

    def __post_init__(self) -> None:
        if self.factory is not None and self.from_optimize is not None:
            raise LatencyLabError(f"model {self.name!r}: give either factory or from_optimize, not both")
        if self.factory is None and self.from_optimize is None and self.name not in KNOWN_MODELS:
            raise LatencyLabError(
                f"model {self.name!r}: unknown; built-in models are {', '.join(KNOWN_MODELS)} (or give a factory)"
            )
        if not self.ladder or self.ladder[0] == "cache":
            raise LatencyLabError(f"model {self.name!r}: the ladder must start with a model variant")
        if "cache" in self.ladder[:-1]:
            raise LatencyLabError(f"model {self.name!r}: 'cache' can only be the last rung of the ladder")
        if len(set(self.ladder)) != len(self.ladder):
            raise LatencyLabError(f"model {self.name!r}: a ladder rung appears twice")
        for key in ("slo_ms", "max_queue_delay_ms", "default_deadline_ms", "cache_ttl_s"):
            if not getattr(self, key) > 0:
                raise LatencyLabError(f"model {self.name!r}: {key} must be > 0")
        for key in ("max_batch_size", "max_queue", "cache_entries", "compute_workers"):
            if getattr(self, key) < 1:
                raise LatencyLabError(f"model {self.name!r}: {key} must be >= 1")
        if self.ort_spin_us is not None and (
            isinstance(self.ort_spin_us, bool) or not isinstance(self.ort_spin_us, int) or self.ort_spin_us < 0
        ):
            raise LatencyLabError(f"model {self.name!r}: ort_spin_us must be a whole number of microseconds >= 0")
        if self.ort_threads is not None and (
            isinstance(self.ort_threads, bool) or not isinstance(self.ort_threads, int) or self.ort_threads < 1
        ):
            raise LatencyLabError(f"model {self.name!r}: ort_threads must be a whole number >= 1")
        if not 0 < self.quantile < 1:
            raise LatencyLabError(f"model {self.name!r}: quantile must be a fraction, e.g. 0.99")
        f = self.slo_target_fraction
        if isinstance(f, bool) or not isinstance(f, int | float) or not 0 < f <= 1:
            raise LatencyLabError(f"model {self.name!r}: slo_target_fraction must be in (0, 1], got {f!r}")
        if self.admission_margin not in ("learned", "fixed"):
            raise LatencyLabError(
                f"model {self.name!r}: admission_margin must be learned or fixed, got {self.admission_margin!r}"
            )
        mq = self.margin_quantile
        if isinstance(mq, bool) or not isinstance(mq, int | float) or not 0 < mq < 1:
            raise LatencyLabError(f"model {self.name!r}: margin_quantile must be a fraction, e.g. 0.99, got {mq!r}")
        if self.order_by not in ("slo", "deadline"):
            raise LatencyLabError(f"model {self.name!r}: order_by must be slo or deadline, got {self.order_by!r}")
        if self.admission_slack not in ("boundary", "off"):
            raise LatencyLabError(
                f"model {self.name!r}: admission_slack must be boundary or off, got {self.admission_slack!r}"
            )

    @property
    def variants(self) -> tuple[str, ...]:
        return tuple(r for r in self.ladder if r != "cache")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    models: tuple[ModelConfig, ...]
    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = 4 * 1024 * 1024
    token_env: str | None = None
    webhook: str | None = None
    otlp_endpoint: str | None = None
    device: str = "cpu"
    threads: int | None = None
    # deadlines count from a request's X-Request-Start header when it has one (serve/request_start.py)
    trust_request_start: bool = True
    switch_interval_ms: float = 0.5  # sys.setswitchinterval for the server process (CPython's default: 5 ms)
    preprocess_threads: int = 2  # the preprocess pool; 0: preprocess inline on the event loop
    # gc.freeze() once warm: a full collection then walks what serving allocated, not the ~400k objects of the
    # model and its framework (220 ms idle, a 360-385-ms stall of every answer under 4x overload; session 16)
    gc_freeze: bool = True

    def __post_init__(self) -> None:
        if not self.models:
            raise LatencyLabError("the config serves no model")
        if self.preprocess_threads < 0:
            raise LatencyLabError(f"preprocess_threads must be >= 0, got {self.preprocess_threads}")
        if not 0 < self.switch_interval_ms <= 100:
            raise LatencyLabError(f"switch_interval_ms must be in (0, 100], got {self.switch_interval_ms}")
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise LatencyLabError("a model is listed twice")
        if not 0 <= self.port < 65536:
            raise LatencyLabError(f"port {self.port} is out of range")
        if self.max_body_bytes < 1024:
            raise LatencyLabError("max_body_bytes must be >= 1024")


def _build(cls: Any, data: dict[str, Any], where: str) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise LatencyLabError(f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise LatencyLabError(f"{where}: {exc}") from exc


def parse_config(data: dict[str, Any], where: str = "config") -> ServerConfig:
    server = dict(data.get("server", {}))
    models = []
    for i, m in enumerate(data.get("models", [])):
        m = dict(m)
        if "ladder" in m:
            m["ladder"] = tuple(m["ladder"])
        elif m.get("from_optimize"):
            from latencylab.serve.from_optimize import load_plan

            m["ladder"] = load_plan(str(m["from_optimize"])).ladder
        models.append(_build(ModelConfig, m, f"{where}: models[{i}]"))
    extra = set(data) - {"server", "models"}
    if extra:
        raise LatencyLabError(f"{where}: unknown section(s) {sorted(extra)}; use [server] and [[models]]")
    return _build(ServerConfig, {**server, "models": tuple(models)}, f"{where}: [server]")


def load_config(path: str | Path) -> ServerConfig:
    """The server config in the TOML file ``path`` (one-line :class:`LatencyLabError` if it is missing or malformed)."""
    return parse_config(read_toml(path, "config file"), str(Path(path)))


def default_ladder(model: str, device: str = "cpu") -> tuple[str, ...]:
    """The built-in ladder of ``model``: its variants' default ladder (serve/variants.py ``LADDERS``) + cache.

    Text on a CPU starts on ``fp32-onnx``, the fastest text runtime measured on these machines (docs/serve.md,
    "Variants and runtimes"); ONNX Runtime's CPU provider cannot run on a GPU, so there the torch ``fp32`` leads.
    """
    from latencylab.serve.variants import LADDERS

    if model not in LADDERS:
        raise LatencyLabError(f"unknown model {model!r}; built-in models are {', '.join(KNOWN_MODELS)}")
    names = [name for name, _ in LADDERS[model]]
    if device != "cpu":
        names = ["fp32" if n == "fp32-onnx" else n for n in names]
    return (*names, "cache")


def default_config(model: str = "text", **overrides: Any) -> ServerConfig:
    """The built-in config for one model with its full ladder (used by ``latencylab serve --model``)."""
    if model not in KNOWN_MODELS:
        raise LatencyLabError(f"unknown model {model!r}; built-in models are {', '.join(KNOWN_MODELS)}")
    server = {k: v for k, v in overrides.items() if k in {f.name for f in fields(ServerConfig)}}
    mcfg = {k: v for k, v in overrides.items() if k in {f.name for f in fields(ModelConfig)}}
    ladder = default_ladder(model, str(server.get("device", "cpu")))
    return ServerConfig(models=(ModelConfig(name=model, ladder=ladder, **mcfg),), **server)
