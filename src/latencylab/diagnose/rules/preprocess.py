"""Rule: the data path (loading, decoding, preprocessing) takes a large share of end-to-end time.

Benchmarks that time only the forward pass are blind to it (SEEDS section 1: preprocessing was 42% of the
total in one case; moving JPEG decoding to the GPU saved 40 ms in another). Share = the stage's total time
over the run / the total end-to-end time, as in ``latencylab profile``.
"""

from __future__ import annotations

from collections.abc import Sequence

from latencylab.diagnose.rules.common import pct, profiles, stage_shares
from latencylab.findings import Evidence, Finding
from latencylab.results import LoadedResult

RULE = "preprocess-dominates"
DATA_KINDS = ("load", "preprocess")
WARN_SHARE = 0.35  # the articles' onion: preprocessing is normally 10-20% of the total
CRITICAL_SHARE = 0.5  # more time preparing inputs than everything else together


def _remedies(name: str, kind: str) -> list[str]:
    low = name.lower()
    if any(w in low for w in ("decode", "jpeg", "jpg", "png", "image")):
        return [
            f"{name}: decode on the accelerator (nvJPEG, torchvision.io.decode_jpeg on CUDA, DALI) or in a separate "
            "worker process; decode at reduced size when the model input is smaller than the image (Pillow "
            "Image.draft / libjpeg-turbo DCT scaling); use a faster decoder (libjpeg-turbo, pillow-simd); cache "
            "decoded tensors of repeated inputs"
        ]
    if "token" in low:
        return [
            f"{name}: tokenize whole batches in one call with the fast (Rust) tokenizer, in another worker "
            "overlapped with the forward pass; cache token ids of repeated texts; cap max_length to what the "
            "inputs need"
        ]
    if kind == "load":
        return [f"{name}: prefetch and read asynchronously (a producer thread or process), cache hot inputs"]
    return [
        f"{name}: move resize/normalise to the accelerator or fold the normalisation into the first layer; send "
        "uint8 and convert on the device; lower the input resolution if accuracy allows; cache results of "
        "repeated inputs"
    ]


def rule(results: Sequence[LoadedResult]) -> list[Finding]:
    out: list[Finding] = []
    for r, prof in profiles(results):
        shares = stage_shares(prof)
        data = [s for s in prof.stages if s.kind in DATA_KINDS]
        data_share = sum(shares[s.name] for s in data)
        if not data or data_share < WARN_SHARE:
            continue
        top = max(prof.stages, key=lambda s: shares[s.name])
        data.sort(key=lambda s: -shares[s.name])
        names = " + ".join(s.name for s in data)
        verb = "is" if len(data) == 1 else "are"
        parts = ", ".join(f"{s.name} {shares[s.name]:.0%}" for s in data)
        fwd = sum(shares[s.name] for s in prof.stages if s.kind == "forward")
        title = (
            f"data path {names} {verb} {data_share:.0%} of end-to-end time ({parts}; forward {fwd:.0%}); "
            f"largest single stage: {top.name} {shares[top.name]:.0%}"
        )
        ev = [
            Evidence("data path share (load + preprocess)", pct(data_share), "%"),
            Evidence("largest data-path stage", f"{data[0].name} ({data[0].kind})"),
        ]
        for s in data:
            ev.append(Evidence(f"{s.name} share", pct(shares[s.name]), "%"))
            ev.append(Evidence(f"{s.name} mean", round(float(s.array().mean()) / 1e6, 4), "ms"))
        ev.append(Evidence("forward share", pct(fwd), "%"))
        ev.append(Evidence("largest single stage", f"{top.name} ({top.kind}), {pct(shares[top.name])}%"))
        remedies = [x for s in data for x in _remedies(s.name, s.kind)]
        remedies.append(
            "overlap the data path with the forward pass (double buffering: prepare input i+1 while the model runs "
            "input i; `latencylab experiment` measures it on the vision workload)"
        )
        out.append(
            Finding(
                rule=RULE,
                severity="critical" if data_share >= CRITICAL_SHARE else "warning",
                title=title,
                evidence=tuple(ev),
                recommendation="; ".join(remedies),
                source=r.source,
                details={
                    "shares": {k: round(v, 6) for k, v in shares.items()},
                    "data_share": round(data_share, 6),
                    "top_stage": top.name,
                },
            )
        )
    return out
