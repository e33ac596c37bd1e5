"""Per-core rate of latencylab's open-loop generator vs Locust (FastHttpUser), on one null endpoint.

The claim (issue): the highest rate latencylab sustains on one core, with its own lateness p99 <= 1 ms,
is at least twice what Locust (FastHttpUser, one process) pushes through one core on the same endpoint.

* Endpoint: Debian's nginx, one worker pinned to the server core, answering the OIP v2 infer path with a
  fixed body from memory (benchmarks/peers/nginx_null.conf). Its worker's CPU is measured in every run and
  printed as "nginx core" (share of its core busy at that rate), so it is visibly never the bottleneck.
* Locust: its own venv (benchmarks/peers/locust_setup.sh), headless, one process, pinned to the client
  core, FastHttpUser with no wait time, POSTing the same bytes latencylab sends
  (benchmarks/peers/locustfile.py). Closed loop, so its throughput at saturation is its per-core rate;
  the highest over the ``--users`` values counts. Stats are reset once all users are spawned.
* latencylab: ``latencylab load --arrivals constant:R`` in a fresh process pinned to the client core, one
  run per rate. A rate passes when the run is valid, lateness p99 <= 1 ms, and nothing failed or was
  shed. Bracket (halve/double from ``--start-rate``), then bisect to ``--precision``. A failing rate is
  retried up to ``--tries`` times (the first pass counts), because a VM's host can freeze a vCPU for
  4-12 ms at a time, which fails any lateness criterion regardless of rate; the host-noise probe printed
  each round (a spin loop on the client core) shows how much of that there is.
* For reference, latencylab's closed loop (``--concurrency U``) with Locust's user counts: both tools'
  client cost per request on the same terms (not the claim: closed loops hide stalls).

Rounds are interleaved (Locust, latencylab, Locust, latencylab ...) so drift hits both tools.

    bash benchmarks/peers/locust_setup.sh                # once: Locust's venv
    apt-get update && apt-get install -y nginx-light     # once: the null endpoint
    .venv/bin/python benchmarks/load_vs_locust.py [--quick] [--rounds 2] [--duration 8] [--users 16 64 256]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from _serving import core_ticks, free_port, noise_probe, pin_to
from latencylab.load.payloads import fetch_metadata, payloads_for_model

ROOT = Path(__file__).resolve().parent.parent
PEERS = ROOT / "benchmarks" / "peers"
LOCUST_VENV = ROOT / "benchmarks" / ".venvs" / "locust"
MODEL = "null"
INFER_PATH = f"/v2/models/{MODEL}/infer"
LATENESS_P99_MS = 1.0
INSTALL_NGINX = "apt-get update && apt-get install -y nginx-light"


# ---------------------------------------------------------------------------------------------- helpers


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    ru = os.times()
    return ru.children_user + ru.children_system


def fmt_rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}/s"


# ----------------------------------------------------------------------------------------------- nginx


@contextlib.contextmanager
def nginx_null(nginx: str, core: int) -> Iterator[tuple[str, int]]:
    """Run nginx (master + 1 worker) in the foreground on a free port, pinned to ``core``; yield (url, worker pid)."""
    with tempfile.TemporaryDirectory(prefix="ll-nginx-") as tmp:
        port = free_port()
        conf = (PEERS / "nginx_null.conf").read_text().replace("@PORT@", str(port)).replace("@DIR@", tmp)
        (Path(tmp) / "nginx.conf").write_text(conf)
        log = open(Path(tmp) / "nginx.log", "wb")  # noqa: SIM115 (closed below, after the process)
        proc = subprocess.Popen(
            [nginx, "-p", tmp, "-c", f"{tmp}/nginx.conf", "-e", "stderr", "-g", "daemon off;"],
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=pin_to(core),
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    with urllib.request.urlopen(f"{url}/v2/models/{MODEL}", timeout=1) as r:
                        r.read()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        log.flush()
                        tail = (Path(tmp) / "nginx.log").read_text(errors="replace").strip().splitlines()[-3:]
                        raise SystemExit(f"nginx did not start: {' | '.join(tail) or 'no output'}") from None
                    time.sleep(0.05)
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            if len(children) != 1:
                raise SystemExit(f"expected one nginx worker, found {len(children)}")
            yield url, int(children[0])
        finally:
            proc.send_signal(signal.SIGQUIT)  # graceful: closes keep-alive connections, exits
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            log.close()


# ---------------------------------------------------------------------------------------------- runs


@dataclass
class Run:
    tool: str  # "locust", "latencylab open", "latencylab closed"
    round: int
    rate: float | None  # locust/closed: achieved req/s; open: the offered constant rate
    users: int | None = None
    passed: bool | None = None  # open loop only
    why: str = ""
    lateness_p99_ms: float | None = None
    late_fraction: float | None = None
    failures: int = 0
    requests: int = 0
    client_cpu_percent: float | None = None
    nginx_us_per_request: float | None = None
    others_percent: float | None = None  # the busier core's CPU used by other processes during the run
    extra: dict[str, Any] = field(default_factory=dict)

    def costs(self) -> str:
        return (
            f"client CPU {self.client_cpu_percent or 0:.0f}%, nginx core {self.nginx_busy_percent:.0f}%, "
            f"other processes {self.others_percent or 0:.0f}%"
        )

    @property
    def nginx_busy_percent(self) -> float:
        """Share of nginx's core this run's rate keeps busy (its CPU per request x requests per second)."""
        return (self.rate or 0.0) * (self.nginx_us_per_request or 0.0) / 1e4


def run_locust(url: str, body_file: Path, users: int, seconds: float, core: int, work: Path, rnd: int) -> Run:
    prefix = work / f"locust-r{rnd}-u{users}"
    cmd = [
        str(LOCUST_VENV / "bin" / "locust"),
        "-f", str(PEERS / "locustfile.py"),
        "--headless", "-u", str(users), "-r", str(users), "-t", f"{seconds:g}s", "-H", url,
        "--reset-stats",  # measure after all users are spawned (-r users: within ~1 s)
        "--csv", str(prefix), "--json-file", str(prefix),
        "--only-summary", "--skip-log", "--exit-code-on-error", "0",
    ]  # fmt: skip
    env = {**os.environ, "LOCUST_BODY_FILE": str(body_file), "LOCUST_INFER_PATH": INFER_PATH}
    cpu0 = children_cpu_s()
    t0 = time.monotonic()
    with open(f"{prefix}.log", "wb") as log:
        proc = subprocess.run(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=pin_to(core), timeout=seconds + 60
        )
    wall = time.monotonic() - t0
    cpu = children_cpu_s() - cpu0
    if proc.returncode != 0:
        tail = Path(f"{prefix}.log").read_text(errors="replace").strip().splitlines()[-3:]
        raise SystemExit(f"locust exited {proc.returncode}: {' | '.join(tail)}")
    # Final stats: the JSON file is written at exit; the CSV's last flush can miss the final second.
    (entry,) = json.loads(Path(f"{prefix}.json").read_text())
    span = entry["last_request_timestamp"] - entry["start_time"]
    n = int(entry["num_requests"])
    with open(f"{prefix}_stats.csv", newline="") as fh:
        agg = next(r for r in csv.DictReader(fh) if r["Name"] == "Aggregated")
    return Run(
        tool="locust",
        round=rnd,
        rate=n / span if span > 0 else None,
        users=users,
        failures=int(entry["num_failures"]),
        requests=n,
        client_cpu_percent=100 * cpu / wall,
        extra={
            "csv_requests_per_s": float(agg["Requests/s"]),
            "csv_failures": int(agg["Failure Count"]),
            "median_response_ms": float(agg["Median Response Time"]),
            "p99_response_ms": float(agg["99%"]),
        },
    )


def run_latencylab(
    url: str, jsonl: Path, core: int, seconds: float, work: Path, rnd: int, rate: float | None, users: int | None
) -> Run:
    """One ``latencylab load`` run in a fresh process pinned to ``core``: open loop at ``rate``, else closed."""
    out = work / (f"lab-r{rnd}-open-{rate:.0f}.json" if rate else f"lab-r{rnd}-closed-u{users}.json")
    mode = ["--arrivals", f"constant:{rate:.0f}"] if rate else ["--concurrency", str(users)]
    cmd = [
        sys.executable, "-m", "latencylab", "load", "--url", url, "--model", MODEL, *mode,
        "--duration", f"{seconds:g}", "--payload", str(jsonl), "--json", str(out), "--quiet",
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, preexec_fn=pin_to(core), timeout=seconds + 120, check=False
    )
    if proc.returncode != 0 or not out.is_file():
        raise SystemExit(f"latencylab load exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    s = json.loads(out.read_text())["summary"]
    out.unlink()  # the summary is kept in this benchmark's own JSON; the histograms are not needed
    failures = int(s["error"]) + int(s["shed"])
    run = Run(
        tool="latencylab open" if rate else "latencylab closed",
        round=rnd,
        rate=rate if rate else s["throughput_ok"],
        users=users,
        lateness_p99_ms=s["lateness_p99_ms"],
        late_fraction=s["late_fraction"],
        failures=failures,
        requests=int(s["sent"]),
        client_cpu_percent=s["client_cpu_percent"],
        extra={
            "achieved_rate": s["achieved_rate"],
            "p99_ms": s.get("p99_ms"),
            "uncorrected_p99_ms": s.get("uncorrected_p99_ms"),
            "lateness_max_ms": s["lateness_max_ms"],
            "connections_opened": s["connections_opened"],
            "max_in_flight": s["max_in_flight"],
            "errors_by_reason": s["errors_by_reason"],
            "invalid_reasons": s["invalid_reasons"],
        },
    )
    if rate:
        reasons = []
        if not s["valid"]:
            reasons.append(f"invalid ({s['late_fraction']:.1%} late > 1 ms)")
        if s["lateness_p99_ms"] is None or s["lateness_p99_ms"] > LATENESS_P99_MS:
            reasons.append(f"lateness p99 {s['lateness_p99_ms']:.2f} ms > {LATENESS_P99_MS:g} ms")
        if failures:
            reasons.append(f"{failures} failed/shed")
        if s["achieved_rate"] is None or s["achieved_rate"] < 0.98 * rate:
            reasons.append(f"achieved only {fmt_rate(s['achieved_rate'])}")
        run.passed = not reasons
        run.why = "; ".join(reasons) or f"lateness p99 {s['lateness_p99_ms']:.3f} ms"
    return run


@dataclass
class Bench:
    args: argparse.Namespace
    url: str
    nginx_worker: int
    body_file: Path
    jsonl: Path
    work: Path
    runs: list[Run] = field(default_factory=list)

    def measured(self, fn: Any, *a: Any) -> Run:
        """Run ``fn(*a)``; attach nginx's CPU per request, and how busy other processes kept both cores."""
        a_ = self.args
        c0, k0 = proc_cpu_s(self.nginx_worker), children_cpu_s()
        (cb0, ct0), (sb0, st0) = core_ticks(a_.client_core), core_ticks(a_.server_core)
        run: Run = fn(*a)
        dc, dk = proc_cpu_s(self.nginx_worker) - c0, children_cpu_s() - k0
        (cb1, ct1), (sb1, st1) = core_ticks(a_.client_core), core_ticks(a_.server_core)
        if run.requests:
            run.nginx_us_per_request = 1e6 * dc / run.requests
        # /proc/stat counts USER_HZ (100/s) ticks; what is busy beyond the tool's and nginx's own CPU is others'.
        hz = os.sysconf("SC_CLK_TCK")
        if ct1 > ct0 and st1 > st0:
            run.others_percent = max(
                100 * ((cb1 - cb0) / hz - dk) / ((ct1 - ct0) / hz),
                100 * ((sb1 - sb0) / hz - dc) / ((st1 - st0) / hz),
                0.0,
            )
        self.runs.append(run)
        return run

    def locust(self, users: int, rnd: int) -> Run:
        a = self.args
        r = self.measured(run_locust, self.url, self.body_file, users, a.locust_duration, a.client_core, self.work, rnd)
        print(
            f"  locust   users {users:4d}: {fmt_rate(r.rate):>10}  failures {r.failures}  {r.costs()}",
            flush=True,
        )
        return r

    def closed(self, users: int, rnd: int) -> Run:
        a = self.args
        r = self.measured(run_latencylab, self.url, self.jsonl, a.client_core, a.duration, self.work, rnd, None, users)
        print(
            f"  lab closed users {users:4d}: {fmt_rate(r.rate):>10}  failures {r.failures}  {r.costs()}",
            flush=True,
        )
        return r

    def open_step(self, rate: float, rnd: int) -> bool:
        """One rate, retried up to --tries times while it fails (host noise); True at the first pass."""
        a = self.args
        for attempt in range(1, a.tries + 1):
            r = self.measured(
                run_latencylab, self.url, self.jsonl, a.client_core, a.duration, self.work, rnd, rate, None
            )
            r.extra["attempt"] = attempt
            print(
                f"  lab open {fmt_rate(rate):>10} try {attempt}: {'pass' if r.passed else 'FAIL'}  {r.why}  "
                f"({r.extra['connections_opened']} connections, {r.costs()})",
                flush=True,
            )
            if r.passed:
                return True
            if (r.lateness_p99_ms or 0) > 100:
                break  # fell behind for good (not a brief host stall): retrying will not change it
        return False

    def search(self, start: float, rnd: int) -> float | None:
        """Highest passing constant rate: bracket by halving/doubling from ``start``, then bisect."""
        a = self.args
        lo: float | None = None
        hi: float | None = None
        rate = float(round(start))
        steps = 0
        while steps < a.max_steps:
            steps += 1
            if self.open_step(rate, rnd):
                lo = rate
            else:
                hi = rate
            if lo is not None and hi is not None:
                break
            if lo is None:
                rate = float(round(rate / 2))
                if rate < a.min_rate:
                    return None
            else:
                rate = float(round(rate * 2))
                if rate > a.max_rate:
                    return lo
        while lo is not None and hi is not None and hi / lo > 1 + a.precision and steps < a.max_steps:
            steps += 1
            mid = float(round((lo + hi) / 2))
            if self.open_step(mid, rnd):
                lo = mid
            else:
                hi = mid
        return lo


# ----------------------------------------------------------------------------------------------- main


def versions(nginx: str) -> dict[str, str]:
    nginx_v = subprocess.run([nginx, "-v"], capture_output=True, text=True, check=False).stderr.strip()
    locust_v = subprocess.run(
        [str(LOCUST_VENV / "bin" / "locust"), "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    peer = subprocess.run(
        [
            str(LOCUST_VENV / "bin" / "python"),
            "-c",
            "import importlib.metadata as m, sys; "
            "print(sys.version.split()[0], m.version('gevent'), m.version('geventhttpclient'))",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    try:
        uvloop_v = metadata.version("uvloop")
    except metadata.PackageNotFoundError:
        uvloop_v = "not installed (asyncio loop)"
    return {
        "python (latencylab)": sys.version.split()[0],
        "latencylab": metadata.version("latencylab"),
        "uvloop (latencylab's event loop)": uvloop_v,
        "locust": locust_v,
        "python (locust venv)": peer[0] if peer else "?",
        "gevent / geventhttpclient": " / ".join(peer[1:]) if peer else "?",
        "nginx": nginx_v,
        "kernel": platform.release(),
        "cpu": next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?"),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per latencylab run (default 8)")
    ap.add_argument("--locust-duration", type=float, default=15.0, help="seconds per Locust run (default 15)")
    ap.add_argument("--users", type=int, nargs="+", default=[16, 64, 256], help="Locust users (best counts)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    ap.add_argument("--start-rate", type=float, default=4000.0, help="first latencylab rate (req/s)")
    ap.add_argument("--min-rate", type=float, default=200.0)
    ap.add_argument("--max-rate", type=float, default=100_000.0)
    ap.add_argument("--precision", type=float, default=0.05, help="bisect until hi/lo <= 1 + this")
    ap.add_argument("--tries", type=int, default=3, help="runs of a failing rate before it counts as failed")
    ap.add_argument("--max-steps", type=int, default=14, help="rates tried per search, at most")
    ap.add_argument("--no-closed", action="store_true", help="skip latencylab's closed-loop reference runs")
    ap.add_argument("--client-core", type=int, default=0)
    ap.add_argument("--server-core", type=int, default=1)
    ap.add_argument("--noise-seconds", type=float, default=2.0, help="host-noise probe per round")
    ap.add_argument("--json", metavar="PATH", help="write every run and the verdict as JSON")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 round, short runs, coarse search")
    args = ap.parse_args(argv)
    if args.quick:
        args.duration, args.locust_duration, args.users, args.rounds = 3.0, 6.0, [64], 1
        args.precision, args.tries, args.max_steps, args.noise_seconds = 0.25, 1, 6, 0.5
    return args


def preflight(args: argparse.Namespace) -> str:
    nginx = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)
    if nginx is None:
        print(f"nginx not found: install it with `{INSTALL_NGINX}`", file=sys.stderr)
        raise SystemExit(2)
    if not (LOCUST_VENV / "bin" / "locust").is_file():
        print("Locust's venv is missing: run `bash benchmarks/peers/locust_setup.sh`", file=sys.stderr)
        raise SystemExit(2)
    cores = os.sched_getaffinity(0)
    if args.client_core == args.server_core or not {args.client_core, args.server_core} <= cores:
        print(f"need two distinct usable cores; have {sorted(cores)}", file=sys.stderr)
        raise SystemExit(2)
    return nginx


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    nginx = preflight(args)
    t_start = time.monotonic()
    vers = versions(nginx)
    print("versions:")
    for k, v in vers.items():
        print(f"  {k}: {v}")
    print(
        f"cores: client (generators) {args.client_core}, server (nginx) {args.server_core}; "
        f"latencylab {args.duration:g} s per run, Locust {args.locust_duration:g} s per run, users {args.users}, "
        f"{args.rounds} round(s), pass = valid and lateness p99 <= {LATENESS_P99_MS:g} ms and 0 failures"
    )
    with nginx_null(nginx, args.server_core) as (url, worker), tempfile.TemporaryDirectory(prefix="ll-lvl-") as tmp:
        work = Path(tmp)
        # The one request both tools send: latencylab's payload for the null model's declared input.
        (payload,) = payloads_for_model(fetch_metadata(url, MODEL), n=1)
        body_file, jsonl = work / "body.json", work / "body.jsonl"
        body_file.write_bytes(payload.body)
        jsonl.write_bytes(payload.body + b"\n")
        # The CLI re-encodes a .jsonl line with json.dumps: check the bytes on the wire are identical.
        assert json.dumps(json.loads(payload.body)).encode() == payload.body
        with urllib.request.urlopen(
            urllib.request.Request(
                url + INFER_PATH, data=payload.body, headers={"Content-Type": "application/json"}, method="POST"
            ),
            timeout=5,
        ) as resp:
            print(f"endpoint: {url}{INFER_PATH} (nginx worker pid {worker}) -> {resp.status} {resp.read().decode()}")
        print(f"request body ({len(payload.body)} bytes): {payload.body.decode()}")
        os.sched_setaffinity(0, {args.client_core})  # this script idles on the client core, off nginx's
        bench = Bench(args, url, worker, body_file, jsonl, work)
        per_round: list[dict[str, Any]] = []
        start = args.start_rate
        for rnd in range(1, args.rounds + 1):
            noise = noise_probe(args.client_core, args.noise_seconds, args.server_core)
            print(
                f"round {rnd}: host noise on core {args.client_core}: {noise['stalls_over_1ms']} stalls > 1 ms "
                f"in {args.noise_seconds:g} s ({noise['stalled_percent']:.2f}% of the time, "
                f"longest {noise['longest_ms']:.1f} ms); core {args.server_core} busy with other processes "
                f"{noise['other_core_busy_percent']:.0f}%",
                flush=True,
            )
            if noise["stalled_percent"] > 0.5 or noise["other_core_busy_percent"] > 10:
                print("  WARNING: the machine is busy or noisy; lateness-limited rates will come out low")
            locust = [bench.locust(u, rnd) for u in args.users]
            best_locust = max(locust, key=lambda r: r.rate or 0)
            lab = bench.search(start, rnd)
            if lab is not None:
                start = lab  # the next round's bracket starts where this one ended
            closed = [] if args.no_closed else [bench.closed(u, rnd) for u in args.users]
            ratio = lab / best_locust.rate if lab and best_locust.rate else None
            per_round.append(
                {
                    "round": rnd,
                    "noise": noise,
                    "locust_rate": best_locust.rate,
                    "locust_users": best_locust.users,
                    "latencylab_rate": lab,
                    "latencylab_closed_best": max((r.rate or 0 for r in closed), default=None),
                    "ratio": ratio,
                }
            )
            print(
                f"round {rnd}: latencylab {fmt_rate(lab)} vs Locust {fmt_rate(best_locust.rate)} "
                f"(users {best_locust.users}): ratio {'-' if ratio is None else f'{ratio:.2f}'}",
                flush=True,
            )
    elapsed = time.monotonic() - t_start
    report(bench.runs, per_round, args, elapsed)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "kind": "load_vs_locust",
            "versions": vers,
            "args": vars(args),
            "rounds": per_round,
            "runs": [{**asdict(r), "nginx_busy_percent": r.nginx_busy_percent} for r in bench.runs],
            "elapsed_s": elapsed,
        }
        Path(args.json).write_text(json.dumps(doc, indent=1))
        print(f"wrote {args.json}")
    return 0


def report(runs: list[Run], per_round: list[dict[str, Any]], args: argparse.Namespace, elapsed: float) -> None:
    print()
    print(
        f"{'round':>5}  {'tool':<34} {'users':>5} {'per-core rate':>14} {'lateness p99':>13} "
        f"{'failures':>8} {'client CPU':>10} {'nginx core':>10} {'others':>6}"
    )
    for pr in per_round:
        rnd = pr["round"]
        for r in runs:
            if r.round != rnd or r.tool == "latencylab open":
                continue
            label = "locust FastHttpUser (closed loop)" if r.tool == "locust" else "latencylab closed (reference)"
            print(
                f"{rnd:>5}  {label:<34} {r.users:>5} {fmt_rate(r.rate):>14} {'-':>13} {r.failures:>8} "
                f"{r.client_cpu_percent or 0:>9.0f}% {r.nginx_busy_percent:>9.0f}% {r.others_percent or 0:>5.0f}%"
            )
        best = [r for r in runs if r.round == rnd and r.tool == "latencylab open" and r.rate == pr["latencylab_rate"]]
        best = [r for r in best if r.passed]
        if best:
            r = best[-1]
            print(
                f"{rnd:>5}  {'latencylab open loop, constant':<34} {'-':>5} {fmt_rate(r.rate):>14} "
                f"{r.lateness_p99_ms or 0:>10.3f} ms {r.failures:>8} {r.client_cpu_percent or 0:>9.0f}% "
                f"{r.nginx_busy_percent:>9.0f}% {r.others_percent or 0:>5.0f}%"
            )
        else:
            print(f"{rnd:>5}  {'latencylab open loop, constant':<34} {'-':>5} {'none passed':>14}")
    labs = [p["latencylab_rate"] for p in per_round if p["latencylab_rate"]]
    locs = [p["locust_rate"] for p in per_round if p["locust_rate"]]
    ratios = [p["ratio"] for p in per_round if p["ratio"]]
    claim = [r for r in runs if r.tool == "locust" or (r.tool == "latencylab open" and r.passed)]
    if claim:
        top = max(claim, key=lambda r: r.nginx_busy_percent)
        closed_top = max((r.nginx_busy_percent for r in runs if r.tool == "latencylab closed"), default=0.0)
        verdict = "not the bottleneck" if top.nginx_busy_percent < 50 else "WARNING: close to being the bottleneck"
        print(
            f"nginx core busy at most {top.nginx_busy_percent:.0f}% in the runs behind the ratio "
            f"({top.tool} at {fmt_rate(top.rate)}): {verdict}"
            + (f"; latencylab's closed-loop reference pushed it to {closed_top:.0f}%" if closed_top else "")
        )
    if labs and locs:
        best_ratio = max(labs) / max(locs)
        print(
            f"best of rounds: latencylab {fmt_rate(max(labs))} vs Locust {fmt_rate(max(locs))}: "
            f"ratio {best_ratio:.2f} (target >= 2.00: {'MET' if best_ratio >= 2 else 'NOT MET'})"
        )
        print(f"per-round ratios: {', '.join(f'{x:.2f}' for x in ratios)} (median {statistics.median(ratios):.2f})")
    else:
        print("no ratio: " + ("latencylab passed no rate" if not labs else "Locust produced no rate"))
    cpu = [r.client_cpu_percent for r in runs if r.tool == "latencylab open" and r.client_cpu_percent]
    if cpu:
        print(
            f"latencylab open-loop client CPU: {min(cpu):.0f}-{max(cpu):.0f}% of one core at every rate "
            "(it spin-waits the last 1.5 ms before each send, so this is not a measure of its load)"
        )
    busy = [r for r in runs if (r.others_percent or 0) > 10]
    if busy:
        print(
            f"WARNING: other processes used > 10% of a core during {len(busy)} of {len(runs)} runs "
            f"(up to {max(r.others_percent or 0 for r in busy):.0f}%): figures from a shared machine are low and noisy"
        )
    print(f"benchmark took {elapsed:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
