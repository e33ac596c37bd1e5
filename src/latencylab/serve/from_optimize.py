"""``latencylab serve --from DIR``: serve what ``latencylab optimize --out DIR`` found, with its fallback ladder.

DIR is an optimize output directory: ``recipe.json`` (the choice: its candidate, workload, budget, measured
figures, ``artifact`` and ``rungs``), the chosen artifact (``model.onnx``), ``rungs/NAME.onnx`` (the ONNX
Runtime candidates of the Pareto front and the fastest INT8 candidate inside the budget) and ``optimize.json``
(the whole search: every candidate's status, p50 and fidelity, the Pareto front). The ladder is read off that
one search (:func:`assign_rungs`):

* **primary**: the chosen candidate (``recipe.json``);
* **lighter**: the fastest Pareto-front candidate with an artifact that is faster than the primary, inside the
  budget or not (a lighter model trades fidelity for time, as the built-in ladders' lighter rungs do);
* **quantized**: the fastest INT8 candidate (``params.quantization`` set) inside the budget with an artifact,
  other than the rungs above (if the primary is INT8, the next one);
* then ``cache``.

A rung with no candidate is left out, with the reason logged and listed in the model's metadata; none is ever
made up. Every rung is an ONNX file served by ONNX Runtime's CPU provider through the same variants as the
built-in ONNX rungs (:class:`~latencylab.serve.ort_text.OrtTextVariant` for text: the MiniLM tokenizer,
``input_ids`` + ``attention_mask`` int64 -> ``embedding``; :class:`~latencylab.serve.ort_vision.OrtVisionVariant`
for vision: the digits JPEG preprocessing, ``pixels`` float32 -> ``logits``), at the graph optimisation level
the search measured it at. Versions are the candidates' names. A choice exported as OpenVINO IR (``model.xml``:
the search chose an OpenVINO candidate) is served by OpenVINO instead (:mod:`latencylab.serve.ov_runner`), at the
inference precision the IR records; a length-routed choice (``route.json``) by both, split at its width
(:mod:`latencylab.serve.routed`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from latencylab.errors import LatencyLabError

__all__ = ["WORKLOADS", "Plan", "Rung", "assign_rungs", "check_interface", "load_plan", "plan_variants"]

log = logging.getLogger("latencylab.serve")

WORKLOADS = ("text", "vision")
ROLES = ("primary", "lighter", "quantized")
_FIDELITY = ("cos_mean", "cos_min", "top1", "accuracy")


@dataclass(frozen=True, slots=True)
class Rung:
    """One rung of the ladder and the candidate that fills it, with what the search measured for it."""

    role: str  # primary | lighter | quantized
    candidate: str
    artifact: str  # relative to the directory
    status: str  # the search's: baseline | inside-budget | outside-budget
    p50_ms: float | None
    p99_ms: float | None
    fidelity: dict[str, float | None]
    int8: bool
    graph: str = "all"  # ONNX Runtime graph optimisation level it was measured at
    input_policy: str = "as-given"

    def describe(self) -> dict[str, Any]:
        """The rung as the model's metadata lists it (JSON)."""
        return {
            "rung": self.role,
            "candidate": self.candidate,
            "artifact": self.artifact,
            "status": self.status,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "fidelity": dict(self.fidelity),
            "int8": self.int8,
            "graph_optimization": self.graph,
            "input_policy": self.input_policy,
        }

    def line(self) -> str:
        p50 = "p50 n/a" if self.p50_ms is None else f"p50 {self.p50_ms:.3f} ms"
        fid = ", ".join(f"{k} {v:.4f}" for k, v in self.fidelity.items() if v is not None) or "fidelity n/a"
        return f"{self.role}: {self.candidate} ({self.artifact}; {self.status}): {p50}, {fid}"


@dataclass(frozen=True, slots=True)
class Plan:
    """What ``serve --from DIR`` serves: the workload, its rungs in ladder order, and the rungs left out."""

    source: Path
    workload: str
    budget: str
    threads: int | None  # the intra-op threads the search measured at
    rungs: tuple[Rung, ...]
    absent: tuple[tuple[str, str], ...] = field(default=())  # (role, why)
    dropped: tuple[tuple[str, str], ...] = field(default=())  # (candidate, why): listed rung files not servable

    @property
    def ladder(self) -> tuple[str, ...]:
        return (*(r.candidate for r in self.rungs), "cache")

    def rung(self, name: str) -> Rung:
        for r in self.rungs:
            if r.candidate == name:
                return r
        raise LatencyLabError(
            f"{self.source}: {name!r} is not a rung of this ladder; its rungs: {', '.join(self.ladder[:-1])}"
        )

    def info(self) -> dict[str, Any]:
        """The ladder's source and its absent rungs, for the model's metadata (JSON)."""
        return {
            "source": {
                "from": str(self.source),
                "workload": self.workload,
                "budget": self.budget,
                "measured_threads": self.threads,
            },
            "absent": [{"rung": role, "reason": why} for role, why in self.absent],
            "dropped": [{"candidate": name, "reason": why} for name, why in self.dropped],
        }

    def lines(self) -> list[str]:
        """The startup log: which candidate fills which rung, with its measured p50 and fidelity."""
        head = f"serving {self.source} ({self.workload}, budget {self.budget}, measured at {self.threads} thread(s))"
        out = [head, *(r.line() for r in self.rungs)]
        out += [f"{role}: absent ({why})" for role, why in self.absent]
        out += [f"rung file of {name} not served: {why}" for name, why in self.dropped]
        out.append("cache: the result cache (last rung)")
        return out


# ------------------------------------------------------------------------------------------- the rung rule


def _p50(c: Mapping[str, Any] | None) -> float | None:
    v = None if c is None else c.get("p50_ms")
    return float(v) if isinstance(v, int | float) else None


def _is_int8(c: Mapping[str, Any]) -> bool:
    params = c.get("params") or {}
    if isinstance(params, Mapping) and isinstance(params.get("short"), Mapping):  # a length-routed pair
        return all(_is_int8({"params": params.get(m)}) for m in ("short", "long"))
    return isinstance(params, Mapping) and params.get("quantization") is not None


def assign_rungs(
    chosen: str, candidates: Sequence[Mapping[str, Any]], pareto: Sequence[str], artifacts: Mapping[str, Any]
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The ladder one search describes: ([(role, candidate name)], [(absent role, why)]).

    ``candidates`` are optimize's candidate records (name, status, p50_ms, params), ``pareto`` the front's
    names, ``artifacts`` the candidates that have a servable file (besides the chosen one). See the module
    docstring for the rule; p50s are the search's, measured in the same interleaved rounds.
    """
    by = {str(c.get("name")): c for c in candidates}
    rungs = [("primary", chosen)]
    absent: list[tuple[str, str]] = []
    p0 = _p50(by.get(chosen))
    if p0 is None:
        absent.append(("lighter", f"the primary {chosen} has no measured p50 to be faster than"))
    else:
        faster = [n for n in pareto if n != chosen and (p := _p50(by.get(n))) is not None and p < p0]
        served = [n for n in faster if n in artifacts]
        if served:
            rungs.append(("lighter", min(served, key=lambda n: (_p50(by[n]), n))))
        elif faster:
            absent.append(
                (
                    "lighter",
                    f"no ONNX artifact for the Pareto-front candidates faster than the primary: {', '.join(faster)}",
                )
            )
        else:
            absent.append(("lighter", f"no Pareto-front candidate is faster than the primary ({p0:.3f} ms)"))
    used = {n for _, n in rungs}
    int8 = [
        n
        for n, c in by.items()
        if _is_int8(c) and c.get("status") == "inside-budget" and n not in used and _p50(c) is not None
    ]
    served = [n for n in int8 if n in artifacts]
    if served:
        rungs.append(("quantized", min(served, key=lambda n: (_p50(by[n]), n))))
    elif int8:
        absent.append(("quantized", f"no ONNX artifact for the INT8 candidates inside the budget: {', '.join(int8)}"))
    else:
        other = " other than the rungs above" if any(_is_int8(by[n]) for n in used if n in by) else ""
        absent.append(("quantized", f"no INT8 candidate inside the budget{other}"))
    return rungs, absent


# ------------------------------------------------------------------------------------------- the directory


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise LatencyLabError(f"{path}: not a readable {what} ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise LatencyLabError(f"{path}: not a {what} (a JSON object was expected)")
    return data


def check_interface(path: Path, workload: str) -> None:
    """Raise a LatencyLabError unless the ONNX file (or OpenVINO IR) at ``path`` has the workload's serving
    interface."""
    if Path(path).suffix == ".json":  # a length-routed pair (serve/routed.py)
        from latencylab.serve.routed import check_route_interface

        check_route_interface(Path(path), workload)
        return
    if Path(path).suffix == ".xml":  # an OpenVINO IR (serve/ov_runner.py)
        from latencylab.serve.ov_runner import OvModel, check_ov_interface

        check_ov_interface(OvModel(Path(path)), workload)
        return
    from latencylab.serve.ort_text import ort_session

    session = ort_session(path, 1, graph="disabled")  # fast: the interface only
    if workload == "vision":
        from latencylab.serve.ort_vision import vision_shape

        try:
            vision_shape(session)
        except LatencyLabError as exc:
            raise LatencyLabError(f"{path}: {exc}") from None
        return
    inputs = {i.name: i.type for i in session.get_inputs()}
    want = {"input_ids": "tensor(int64)", "attention_mask": "tensor(int64)"}
    if inputs != want:
        got = ", ".join(f"{n} {t}" for n, t in inputs.items())
        raise LatencyLabError(
            f"{path}: an ONNX text model takes input_ids and attention_mask, tensor(int64); this one takes {got}"
        )
    out = session.get_outputs()
    if not out or out[0].name != "embedding" or out[0].type != "tensor(float)" or len(out[0].shape) != 2:
        got = ", ".join(f"{o.name} {o.type} {list(o.shape)}" for o in out)
        raise LatencyLabError(
            f"{path}: an ONNX text model's first output is embedding (batch, hidden) float; got {got}"
        )
    if not isinstance(out[0].shape[1], int):
        raise LatencyLabError(f"{path}: the embedding's last dimension must be fixed, got {out[0].shape[1]!r}")


_PLANS: dict[tuple[str, int], Plan] = {}


def load_plan(source: str | Path) -> Plan:
    """Read and check an optimize output directory; the ladder it describes (cached per recipe.json version)."""
    root = Path(source)
    if not root.is_dir():
        raise LatencyLabError(f"{root}: no such directory (give the --out directory of latencylab optimize)")
    recipe_path = root / "recipe.json"
    if not recipe_path.is_file():
        raise LatencyLabError(f"{root}: no recipe.json: not an output directory of latencylab optimize --out")
    key = (str(recipe_path.resolve()), recipe_path.stat().st_mtime_ns)
    if key not in _PLANS:
        _PLANS[key] = _plan(root, _read_json(recipe_path, "recipe"))
    return _PLANS[key]


def _plan(root: Path, recipe: dict[str, Any]) -> Plan:
    where = root / "recipe.json"
    if recipe.get("kind") != "recipe":
        raise LatencyLabError(f"{where}: not a latencylab recipe (kind {recipe.get('kind')!r}, expected 'recipe')")
    workload = recipe.get("workload")
    if workload == "gen":
        raise LatencyLabError(f"{where}: a generative search's choice: serve it with `serve --model gen --from DIR`")
    if workload not in WORKLOADS:
        raise LatencyLabError(
            f"{where}: workload {workload!r} cannot be served: serve --from knows {', '.join(WORKLOADS)}"
        )
    chosen = str(recipe.get("candidate") or "")
    artifact = recipe.get("artifact")
    if not chosen or not artifact:
        raise LatencyLabError(f"{where}: the search exported no artifact for its choice {chosen or '(none)'}")
    if not str(artifact).endswith((".onnx", ".xml", "route.json")):
        raise LatencyLabError(
            f"{where}: the choice {chosen} is {artifact}, not ONNX, OpenVINO IR or a route: only those can be served "
            "(optimize with --families onnxruntime to choose among ONNX Runtime candidates)"
        )
    if not (root / artifact).is_file():
        raise LatencyLabError(f"{root / artifact}: the recipe's artifact is missing")
    check_interface(root / artifact, workload)

    doc_path = root / "optimize.json"
    if doc_path.is_file():
        doc = _read_json(doc_path, "optimize result")
        if doc.get("kind") not in (None, "optimize"):
            raise LatencyLabError(f"{doc_path}: not an optimize result (kind {doc.get('kind')!r})")
        summary = doc.get("summary") or {}
        ch = summary.get("chosen")
        ch_name = ch.get("name") if isinstance(ch, Mapping) else ch
        if ch_name is not None and ch_name != chosen:
            raise LatencyLabError(
                f"{root}: recipe.json chose {chosen} but optimize.json chose {ch_name}: not the same search"
            )
        candidates = [c for c in doc.get("candidates") or [] if isinstance(c, Mapping)]
        pareto = [str(n) for n in summary.get("pareto") or []]
    else:
        candidates, pareto = [], []
    by = {str(c.get("name")): c for c in candidates}
    if chosen not in by:  # no search record: what the recipe measured
        measured = recipe.get("measured") or {}
        by[chosen] = {
            "name": chosen,
            "status": "inside-budget",
            "params": recipe.get("params") or {},
            "p50_ms": measured.get("p50_ms"),
            "p99_ms": measured.get("p99_ms"),
            "fidelity": {k: measured.get(k) for k in _FIDELITY},
            "input_policy": recipe.get("input_policy"),
        }
        candidates = [*candidates, by[chosen]]

    artifacts: dict[str, str] = {}
    dropped: list[tuple[str, str]] = []
    rung_files = recipe.get("rungs") or {}
    if not isinstance(rung_files, Mapping):
        raise LatencyLabError(f"{where}: rungs must map candidate names to ONNX files")
    for name, rel in rung_files.items():
        path = root / str(rel)
        if name == chosen:
            continue
        if not str(rel).endswith(".onnx") or not path.is_file():
            dropped.append((str(name), f"{rel} is not an ONNX file in {root}"))
            continue
        try:
            check_interface(path, workload)
        except LatencyLabError as exc:
            dropped.append((str(name), str(exc)))
            continue
        artifacts[str(name)] = str(rel)

    if doc_path.is_file():
        roles, absent = assign_rungs(chosen, candidates, pareto, artifacts)
    else:
        roles = [("primary", chosen)]
        absent = [(r, f"no {doc_path.name}: the other rungs come from the search's candidates") for r in ROLES[1:]]
    files = {**artifacts, chosen: str(artifact)}
    rungs = tuple(_rung(role, name, by[name], files[name]) for role, name in roles)
    threads = recipe.get("threads")
    return Plan(
        root,
        str(workload),
        str(recipe.get("budget") or ""),
        int(threads) if isinstance(threads, int) else None,
        rungs,
        tuple(absent),
        tuple(dropped),
    )


def _rung(role: str, name: str, c: Mapping[str, Any], artifact: str) -> Rung:
    fid = c.get("fidelity") or {}
    params = c.get("params") or {}
    short = params.get("short")
    onnx_params: Mapping[str, Any] = short if isinstance(short, Mapping) else params  # a routed pair: its ONNX member
    p99 = c.get("p99_ms")
    return Rung(
        role=role,
        candidate=name,
        artifact=artifact,
        status=str(c.get("status") or "?"),
        p50_ms=_p50(c),
        p99_ms=float(p99) if isinstance(p99, int | float) else None,
        fidelity={k: fid.get(k) for k in _FIDELITY if fid.get(k) is not None},
        int8=_is_int8(c),
        graph=str(onnx_params.get("graph_optimization") or "all"),
        input_policy=str(c.get("input_policy") or params.get("shape_policy") or "as-given"),
    )


# ------------------------------------------------------------------------------------------- the variants


def _tokenizer() -> Any:
    from latencylab.errors import MissingDependencyError
    from latencylab.workloads.text import model_dir

    try:
        import transformers
    except ImportError as exc:
        raise MissingDependencyError("transformers", "text") from exc
    return transformers.AutoTokenizer.from_pretrained(model_dir(), local_files_only=True)


def plan_variants(plan: Plan, names: Sequence[str], max_batch_size: int, device: str) -> list[Any]:
    """The variants ``names`` (rungs of ``plan``, in ladder order) as ONNX Runtime CPU variants."""
    if device != "cpu":
        raise LatencyLabError(f"serve --from runs its ONNX rungs on the CPU only (device is {device!r})")
    from latencylab.serve.ort_text import ort_text_variant
    from latencylab.serve.ort_vision import OrtVisionVariant

    tok = _tokenizer() if plan.workload == "text" else None
    out: list[Any] = []
    for name in names:
        r = plan.rung(name)
        path = plan.source / r.artifact
        desc = f"{r.candidate} from {plan.source} ({r.role} rung of the search's ladder)"
        v: Any
        if r.artifact.endswith("route.json"):  # ONNX Runtime below the route's width, OpenVINO from it
            import torch

            from latencylab.serve.routed import RoutedTextVariant

            if plan.workload != "text":
                raise LatencyLabError(f"{path}: a length-routed variant serves text only")
            v = RoutedTextVariant(r.candidate, r.role, tok, path, threads=torch.get_num_threads(),
                                  graph=r.graph, max_batch_size=max_batch_size, description=desc)  # fmt: skip
        elif r.artifact.endswith(".xml"):  # an OpenVINO IR: served by OpenVINO, as the search measured it
            import torch

            from latencylab.serve.ov_runner import OvTextVariant, OvVisionVariant

            if plan.workload == "text":
                v = OvTextVariant(r.candidate, r.role, tok, path, threads=torch.get_num_threads(),
                                  max_batch_size=max_batch_size, description=desc)  # fmt: skip
            else:
                v = OvVisionVariant(r.candidate, r.role, path, threads=torch.get_num_threads(),
                                    max_batch_size=max_batch_size, description=desc)  # fmt: skip
        elif plan.workload == "text":
            v = ort_text_variant(
                r.candidate,
                r.role,
                tok,
                path=path,
                fuse=False,  # the artifact is served as the search measured it
                graph=r.graph,
                max_batch_size=max_batch_size,
                description=desc,
            )
        else:
            import torch

            v = OrtVisionVariant(
                r.candidate,
                r.role,
                path,
                threads=torch.get_num_threads(),
                graph=r.graph,
                max_batch_size=max_batch_size,
                description=desc,
            )
        v.provenance = r.describe()
        out.append(v)
    if out:
        out[0].ladder_info = plan.info()
    return out
