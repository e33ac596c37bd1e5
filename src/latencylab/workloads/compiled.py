"""Built-in ``compiled`` workload: a tiny MLP under ``torch.compile(dynamic=False)`` whose input shape changes.

It exists to show a real recompilation: with static shapes, every new input shape makes TorchDynamo trace
and the backend (Inductor by default) compile the graph again, inside the timed forward stage, so the
iteration where the shape first changes is hundreds of times slower than the others ("latency suddenly
jumps"). The pipeline's probe records, per iteration, the input shape and the compile events counted by
TorchDynamo (``torch._dynamo.utils.counters["frames"]["ok"]``) with their compile time, so ``diagnose``
can say "recompiled at iteration N (shape X)".

Stages::

    prepare     (preprocess)   scale the input tensor (a trivial normalisation)
    forward     (forward)      the compiled MLP under torch.inference_mode
    postprocess (postprocess)  argmax -> numpy

``params``: ``shapes`` (sequence length from an iteration on: ``16@0,32@200,48@400``, default that),
``backend`` (inductor | aot_eager | eager, default inductor), ``dim`` (features, default 32), ``offset``
(added to the iteration numbers in ``shapes``: the profiler numbers warm-up iterations first, so
``offset=<warmup>`` makes ``shapes`` refer to timed iterations, as the synthetic workload's ``offset``).
"""

from __future__ import annotations

from typing import Any

from latencylab.errors import LatencyLabError, MissingDependencyError
from latencylab.pipeline import Pipeline
from latencylab.workloads import WorkloadOptions

BACKENDS = ("inductor", "aot_eager", "eager")
DEFAULT_SHAPES = "16@0,32@200,48@400"


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"16@0,32@200"`` -> [(0, 16), (200, 32)]: (first iteration, sequence length), ascending."""
    out: list[tuple[int, int]] = []
    for part in text.split(","):
        length, sep, at = part.strip().partition("@")
        try:
            item = (int(at), int(length))
        except ValueError:
            raise LatencyLabError(f"compiled: shapes entry {part!r} must look like LENGTH@ITERATION") from None
        if not sep or item[0] < 0 or item[1] < 1:
            raise LatencyLabError(f"compiled: shapes entry {part!r} must look like LENGTH@ITERATION (>= 0, >= 1)")
        out.append(item)
    out.sort()
    if not out or out[0][0] != 0:
        raise LatencyLabError("compiled: shapes must give the length from iteration 0 (e.g. 16@0,...)")
    return out


def length_at(schedule: list[tuple[int, int]], i: int) -> int:
    """The sequence length in force at iteration ``i``."""
    cur = schedule[0][1]
    for at, length in schedule:
        if i >= at:
            cur = length
    return cur


def build(opts: WorkloadOptions) -> Pipeline:
    known = {"shapes", "backend", "dim", "offset"}
    unknown = set(opts.params) - known
    if unknown:
        raise LatencyLabError(f"unknown compiled param(s) {sorted(unknown)}; known: {sorted(known)}")
    backend = opts.params.get("backend", "inductor")
    if backend not in BACKENDS:
        raise LatencyLabError(f"compiled: backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    try:
        dim = int(opts.params.get("dim", "32"))
        offset = int(opts.params.get("offset", "0"))
    except ValueError:
        raise LatencyLabError("compiled: dim and offset must be integers") from None
    if not 1 <= dim <= 4096 or offset < 0:
        raise LatencyLabError("compiled: dim must be in [1, 4096] and offset >= 0")
    schedule = [(at + offset, length) for at, length in parse_shapes(opts.params.get("shapes", DEFAULT_SHAPES))]
    try:
        import torch
        from torch._dynamo.utils import compilation_time_metrics, counters
    except ImportError as exc:
        raise MissingDependencyError("torch", "text") from exc

    torch._dynamo.reset()  # a fresh cache: an earlier build in this process must not hide the compiles
    gen = torch.Generator().manual_seed(opts.seed)
    model = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.ReLU(), torch.nn.Linear(2 * dim, 8)).eval()
    compiled = torch.compile(model, dynamic=False, backend=backend)
    bs = opts.batch_size
    inputs: dict[int, Any] = {}

    def source(i: int) -> Any:
        length = length_at(schedule, i)
        if length not in inputs:
            inputs[length] = torch.randn(bs, length, dim, generator=gen)
        return inputs[length]

    def prepare(x: Any) -> Any:
        return x * 0.5

    def forward(x: Any) -> Any:
        with torch.inference_mode():
            return compiled(x)

    def postprocess(y: Any) -> Any:
        return y.argmax(dim=-1).numpy()

    def compile_state() -> tuple[int, float]:
        return int(counters["frames"]["ok"]), float(sum(compilation_time_metrics.get("_compile.compile_inner", [])))

    last = list(compile_state())

    def probe(i: int) -> dict[str, Any]:
        frames, secs = compile_state()
        done, spent = frames - last[0], secs - last[1]
        last[0], last[1] = frames, secs
        return {"shape": [bs, length_at(schedule, i), dim], "compiles": done, "compile_s": round(spent, 6)}

    pipe = Pipeline(
        "compiled",
        source=source,
        probe=probe,
        metadata={
            "model": f"MLP {dim}-{2 * dim}-8 under torch.compile(dynamic=False, backend={backend!r})",
            "backend": backend,
            "batch_size": bs,
            "shapes": [{"from_iteration": at, "seq_len": length} for at, length in schedule],
        },
    )
    pipe.stage("prepare", prepare, kind="preprocess")
    pipe.stage("forward", forward, kind="forward")
    pipe.stage("postprocess", postprocess, kind="postprocess")
    return pipe
