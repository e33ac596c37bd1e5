"""A real check of ``latencylab serve --model gen --from DIR`` on SmolLM2 (issue 19's export; run under the lock):

1. a small real search, ``optimize --workload gen --quick --only int8-smooth-keep-down`` with a budget every
   candidate meets, writes DIR (SmoothQuant folded in, every ``mlp.down_proj`` kept in float);
2. the variant ``serve --from`` rebuilds from DIR is compared with the one the search built (logits on a prompt);
3. the real server process is started on DIR (ladder: the variant, then the INT8 standby), its start-up lines,
   ``GET /v1/models`` and one chat completion printed.

    LATENCYLAB_CACHE=.cache/latencylab /tmp/lbench .venv/bin/python benchmarks/genserve_from_check.py [OUT_DIR]

Its first run (2026-12-02 10:44 UTC) was cut by a 540-s timeout that also counted the wait for the lock; the
same search and server, run by hand at 11:39 UTC, work (docs/genserve.md, "Serving what optimize found").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CAND = "int8-smooth-keep-down"
EXE = [sys.executable, "-m", "latencylab"]


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="genserve-from-"))
    t0 = time.perf_counter()
    cmd = [*EXE, "optimize", "--workload", "gen", "--quick", "--only", CAND, "--budget", "token_agreement>=0",
           "--threads", "1", "--out", str(out), "--quiet", "--time-budget", "300"]  # fmt: skip
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    print(f"search: {time.perf_counter() - t0:.1f} s; recipe.json:", flush=True)
    print(json.dumps({k: v for k, v in json.loads((out / "recipe.json").read_text()).items() if k != "params"}))

    import torch

    from latencylab.genserve.from_optimize import load_gen_plan, rebuild
    from latencylab.optimize.gen_candidates import GenContext, build
    from latencylab.optimize.gen_lab import GenLabConfig, smollm2_subject

    torch.set_num_threads(1)
    plan = load_gen_plan(out)
    subject = smollm2_subject(GenLabConfig.quick(only=(CAND,)))
    ours = rebuild(plan, subject.model, subject.describe["key"], tokenizer=_tokenizer())
    theirs = build(GenContext(subject.model, subject.inputs, 1), plan.params).model
    ids = torch.tensor([list(subject.inputs.timing_prompts[0])])
    with torch.inference_mode():
        a, b, f = (m(input_ids=ids).logits for m in (ours, theirs, subject.model))
    diff = float((a - b).abs().max())
    print(f"rebuilt vs the search's variant: logits equal: {torch.equal(a, b)}; max |diff| {diff:.3g}")
    print(f"rebuilt vs FP32: max |diff| {float((a - f).abs().max()):.3g}", flush=True)

    port = 18000 + os.getpid() % 1000
    srv = subprocess.Popen([*EXE, "serve", "--model", "gen", "--from", str(out), "--port", str(port), "--ladder",
                            f"{CAND},int8"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    t1 = time.perf_counter()
    try:
        assert srv.stdout is not None
        for line in srv.stdout:
            print("server>", line.rstrip(), flush=True)
            if line.startswith("  SLO guard"):
                break
        print(f"server start: {time.perf_counter() - t1:.1f} s")
        base = f"http://127.0.0.1:{port}"
        models = json.loads(urllib.request.urlopen(f"{base}/v1/models", timeout=30).read())
        print("GET /v1/models:", json.dumps(models["data"][0]))
        body = {"model": "gen", "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 16, "temperature": 0}  # fmt: skip
        req = urllib.request.Request(f"{base}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
        ans = json.loads(urllib.request.urlopen(req, timeout=60).read())
        print("chat:", json.dumps({k: ans[k] for k in ("choices", "usage", "latencylab") if k in ans}))
    finally:
        srv.terminate()
        srv.wait(30)
    return 0


def _tokenizer() -> object:
    from latencylab.workloads.gen_model import load_model

    return load_model().tokenizer


if __name__ == "__main__":
    raise SystemExit(main())
