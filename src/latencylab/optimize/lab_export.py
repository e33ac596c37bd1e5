"""What ``latencylab optimize`` writes: the chosen artifact, the rungs beside it for ``serve --from``, the
checks on ``--out`` (writable, holding only files latencylab wrote) and on a recipe's sources (sha256)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from latencylab.errors import LatencyLabError
from latencylab.optimize.search import SearchResult
from latencylab.optimize.types import BuildContext, Candidate


def export(ctx: BuildContext, cand: Candidate, out_dir: Path) -> Path:
    """Write the chosen variant's artifact: its ONNX file, or TorchScript for torch variants."""
    runner = cand.build(ctx)
    out_dir.mkdir(parents=True, exist_ok=True)
    save = getattr(runner, "export_artifact", None)  # a runtime with its own format (OpenVINO IR) writes it
    if callable(save):
        return Path(save(out_dir))
    path = getattr(runner, "model_path", None)
    if path is not None:
        dst = out_dir / "model.onnx"
        shutil.copyfile(path, dst)
        return dst
    module = getattr(runner, "module", None) or getattr(runner, "model", None)
    # a torch.compile'd module: export the module it wraps (compilation is a runtime step, in the recipe)
    module = getattr(module, "_orig_mod", module)
    if module is None:
        raise LatencyLabError(f"{cand.name}: the runner exposes neither model_path nor module: cannot export")
    import torch

    feed = ctx.adapter.heldout()[0]
    args = tuple(torch.from_numpy(feed[n]) for n in ctx.adapter.input_names)
    dst = out_dir / "model.pt"
    with torch.inference_mode():
        traced = torch.jit.trace(module, args, strict=False, check_trace=False)
    traced.save(str(dst))
    return dst


def check_writable(path: str | Path, what: str, is_dir: bool) -> None:
    """Raise a one-line error now, before any work, unless ``path`` can be written later (a directory for
    ``is_dir``, else a file); missing parents count as creatable when the nearest existing one is a writable
    directory. Creates nothing."""
    p = Path(path).expanduser()
    if p.exists():
        if is_dir and not p.is_dir():
            raise LatencyLabError(f"{what} {path} is a file, not a directory")
        if not is_dir and p.is_dir():
            raise LatencyLabError(f"{what} {path} is a directory, not a file")
        if not os.access(p, os.W_OK | (os.X_OK if is_dir else 0)):
            raise LatencyLabError(f"{what} {path} is not writable")
        return
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise LatencyLabError(f"{what} {path} cannot be created: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise LatencyLabError(f"{what} {path} cannot be created: {parent} is not writable")


# what run_lab writes into --out (model.xml + model.bin: an OpenVINO IR; model.so: a TVM library)
OUT_FILES = (
    "model.onnx",
    "model.pt",
    "model.xml",
    "model.bin",
    "model.so",
    "route.json",
    "recipe.json",
    "optimize.json",
)
RUNGS_DIR = "rungs"  # and rungs/<candidate>.onnx


def _kind_of(path: Path) -> str | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc.get("kind") if isinstance(doc, dict) else None


def previous_artifacts(out_dir: Path, keep: Sequence[str | None] = ()) -> list[Path]:
    """The files an earlier run wrote into ``out_dir`` (:data:`OUT_FILES`, ``rungs/*.onnx``): this run removes
    them before it writes its own, so no artifact is left beside a result it does not belong to.

    Refuses (one line) when those names are there without a latencylab ``recipe.json`` or ``optimize.json``
    (they would be a user's files), and when one of them, or ``out_dir`` itself, is in ``keep`` (the run's
    ``--model`` / ``--inputs``). Other files are never touched.
    """
    out_dir = Path(out_dir).expanduser()
    protected = {Path(k).expanduser().resolve() for k in keep if k}
    if out_dir.resolve() in protected:
        raise LatencyLabError(f"--out {out_dir} is the --model directory: give another --out")
    if not out_dir.is_dir():
        return []
    found = [out_dir / n for n in OUT_FILES if (out_dir / n).is_file()]
    if (out_dir / RUNGS_DIR).is_dir():
        found += sorted(p for p in (out_dir / RUNGS_DIR).glob("*.onnx") if p.is_file())
    if not found:
        return []
    names = ", ".join(str(p.relative_to(out_dir)) for p in found)
    if _kind_of(out_dir / "recipe.json") != "recipe" and _kind_of(out_dir / "optimize.json") != "optimize":
        raise LatencyLabError(
            f"--out {out_dir} holds {names}, which latencylab did not write (no latencylab recipe.json or "
            "optimize.json beside them): give another --out, or move them away"
        )
    for p in found:
        if p.resolve() in protected:
            raise LatencyLabError(f"--out {out_dir} would replace {p.relative_to(out_dir)}, this run's input: "
                                  "give another --out")  # fmt: skip
    return found


def clear_previous(out_dir: Path, stale: Sequence[Path]) -> list[str]:
    """Remove ``stale`` (from :func:`previous_artifacts`) and an emptied ``rungs/``; the names removed."""
    removed = []
    for p in stale:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            removed.append(str(p.relative_to(out_dir)))
    rungs = out_dir / RUNGS_DIR
    with contextlib.suppress(OSError):  # not empty (a user's file in it) or absent: left as it is
        rungs.rmdir()
    return removed


def rung_candidates(res: SearchResult) -> list[str]:
    """Candidates whose artifacts go beside the choice for ``serve --from``'s ladder: the ONNX Runtime
    candidates on the Pareto front, and the fastest INT8 ONNX Runtime candidates inside the budget."""
    names = [n for n in res.pareto if res.by_name(n).backend == "onnxruntime"]
    int8 = [
        c for c in res.candidates
        if c.backend == "onnxruntime" and c.status == "inside-budget" and (c.params.get("quantization"))
        and c.latency() is not None
    ]  # fmt: skip
    int8.sort(key=lambda c: c.latency().at(0.5).value)  # type: ignore[union-attr]
    names += [c.name for c in int8[:2]]
    return list(dict.fromkeys(n for n in names if n != res.chosen))


def export_rungs(ctx: BuildContext, cands: Sequence[Candidate], res: SearchResult, out_dir: Path) -> dict[str, str]:
    """Write ``out_dir/rungs/<name>.onnx`` for :func:`rung_candidates`; name -> path relative to ``out_dir``.
    A candidate whose build fails here is left out (serve says the rung is absent)."""
    by_name = {c.name: c for c in cands}
    out: dict[str, str] = {}
    for name in rung_candidates(res):
        cand = by_name.get(name)
        if cand is None:
            continue
        try:
            runner = cand.build(ctx)
            src = Path(getattr(runner, "model_path"))  # noqa: B009 (an ORT runner's file)
        except Exception:  # reported as an absent rung by serve
            continue
        dst = out_dir / "rungs" / f"{name}.onnx"
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        out[name] = str(dst.relative_to(out_dir))
    return out


def check_sources(path: Path, model: dict[str, Any], force: bool) -> list[str]:
    """Refuse to rebuild a recipe on another model or other inputs than it records (sha256), unless
    ``force``; the mismatches forced through, in words."""
    from latencylab.optimize.adapters import model_digest

    forced = []
    for what, key, digest_key in (("model", "model_path", "model_sha256"), ("inputs", "inputs_path", "inputs_sha256")):
        where, recorded = model.get(key), model.get(digest_key)
        if not where:
            continue
        if not Path(where).exists():
            raise LatencyLabError(f"{path}: the recipe's {what} {where} is not there")
        if not recorded:
            continue
        now = model_digest(where)
        if now != recorded:
            msg = (
                f"{where} is not the {what} this recipe was made from (sha256 {now[:12]}, the recipe records "
                f"{recorded[:12]})"
            )
            if not force:
                raise LatencyLabError(
                    f"{path}: {msg}: rebuilding would measure something else; --force to rebuild anyway"
                )
            forced.append(msg)
    return forced
