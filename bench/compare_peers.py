#!/usr/bin/env python3
"""Run hamq through the same steps as the peer benchmarks (../shared/peers) and write the
result in their JSON layout, so ../shared/peers/summarize.py lists hamq next to RabbitMQ
and NATS.

Setups (every run of every setup on a fresh `hamq dev` cluster, all on 127.0.0.1):
  single                 hamq dev --mode single                    (async flush; ~ RabbitMQ classic / NATS R1)
  r3-quorum2             hamq dev --mode master-slave --replicas 3 --in-sync-replicas 2
                         (sync_master, async flush; ~ RabbitMQ quorum / NATS R3)
  single-syncflush       single      + --flush-disk-type sync     (fsync before ack)
  r3-quorum2-syncflush   r3-quorum2  + --flush-disk-type sync

Per run and setup (same parameters as the peers):
  0. warm-up: 2000 msgs to a separate topic (not measured)
  1. hamq bench produce --batch 1 --inflight <window> --count <count> --size <size> --json
  2. hamq bench consume --count <messages produced> --json
  3. hamq bench latency --count <lat-count> --size <size> --json            (p50 / p99)
Runs are interleaved over setups (run 1: all setups, run 2: all setups, ...).
Server CPU = utime+stime of the name server and broker PIDs (from the ready line) over the
phase's elapsed_s; client CPU = CPU of the `hamq bench` child minus the CPU of a bare
`hamq bench ... --help` start (interpreter + imports), over elapsed_s (approximate).

By default the run uses a snapshot of src/hamq copied to a temporary directory (PYTHONPATH), because the editable
install otherwise loads whatever is on disk when each process starts while others edit the tree
(--live-src disables this). Standard library only (plus the hamq CLI). Every wait is bounded. Processes are stopped by
PID only (SIGTERM to the `hamq dev` PID, which stops its children, then wait).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
HAMQ = os.environ.get("HAMQ_BIN", os.path.join(REPO, ".venv", "bin", "hamq"))
# The peer kit (../shared/peers next to the repo, or $PEERS_KIT) decides where results and
# logs go, so hamq's land next to the peers' wherever the kit keeps its state.
PEERS_KIT = os.environ.get("PEERS_KIT", os.path.join(REPO, "..", "shared", "peers"))
sys.path.insert(0, PEERS_KIT)
try:
    from benchlib import PEERS_DIR, RESULTS_DIR
except ImportError:
    sys.exit(f"no peer kit at {PEERS_KIT} (set PEERS_KIT)")
TMP_DIR = tempfile.gettempdir()
CLK_TCK = os.sysconf("SC_CLK_TCK")

SETUPS = {
    "single": ["--mode", "single"],
    "r3-quorum2": ["--mode", "master-slave", "--replicas", "3", "--in-sync-replicas", "2"],
    "single-syncflush": ["--mode", "single", "--flush-disk-type", "sync"],
    "r3-quorum2-syncflush": [
        "--mode",
        "master-slave",
        "--replicas",
        "3",
        "--in-sync-replicas",
        "2",
        "--flush-disk-type",
        "sync",
    ],
}
DEFAULT_SETUPS = "single,r3-quorum2,single-syncflush,r3-quorum2-syncflush"
READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 40.0


class BenchError(RuntimeError):
    pass


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- small stats helpers (same semantics as peers/benchlib.spread) -------------------------


def spread(vals):
    vals = [x for x in vals if x is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "runs": []}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "runs": vals}


def fmt_spread(s, digits=0):
    if s["median"] is None:
        return "n/a"
    f = f"{{:,.{digits}f}}"
    return f"{f.format(s['median'])} [{f.format(s['min'])}-{f.format(s['max'])}]"


def loadavg():
    try:
        with open("/proc/loadavg") as fh:
            return fh.read().split()[:3]
    except OSError:
        return None


def proc_cpu_s(pids):
    tot = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            tot += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return tot / CLK_TCK


def children_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


# ---- ports ----------------------------------------------------------------------------------


def ports_for(base: int, replicas: int):
    ports = [base, base + 1000]  # the name server, hamq dev's web console
    for i in range(replicas):
        ports += [base + 1035 + 10 * i, base + 1036 + 10 * i]
    return ports


def port_free(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def pick_port_base(replicas: int) -> int:
    for _ in range(200):  # bounded
        base = random.randrange(20000, 23000)
        if all(port_free(p) for p in ports_for(base, replicas)):
            return base
    raise BenchError("no free port base found in 20000-23000 after 200 tries")


# ---- the cluster ------------------------------------------------------------------------------


class DevCluster:
    def __init__(self, setup: str, logdir: str):
        self.setup = setup
        self.args = SETUPS[setup]
        self.replicas = (
            int(self.args[self.args.index("--replicas") + 1]) if "--replicas" in self.args else 1
        )
        self.logdir = logdir
        self.proc = None
        self.ready = None
        self.data = None

    def start(self):
        self.data = tempfile.mkdtemp(prefix=f"hamq-cmp-{self.setup}-")
        self.port_base = pick_port_base(self.replicas)
        self.cmd = [
            HAMQ,
            "dev",
            "--data",
            self.data,
            "--port-base",
            str(self.port_base),
            *self.args,
        ]
        self.stderr_path = os.path.join(self.logdir, f"dev-{os.path.basename(self.data)}.stderr")
        self.stderr = open(self.stderr_path, "wb")  # noqa: SIM115 (the child holds it)
        log("start: " + " ".join(self.cmd))
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            stdin=subprocess.DEVNULL,
            cwd=TMP_DIR,
        )
        deadline = time.monotonic() + READY_TIMEOUT_S
        buf = b""
        while time.monotonic() < deadline:
            r, _, _ = select.select(
                [self.proc.stdout], [], [], max(0.0, deadline - time.monotonic())
            )
            if not r:
                break
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                raise BenchError(
                    f"hamq dev exited before ready (code {self.proc.wait(10)}); "
                    f"see {self.stderr_path}"
                )
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if isinstance(obj, dict) and obj.get("event") == "ready":
                    self.ready = obj
                    self.namesrv = obj["namesrv"]
                    self.server_pids = [obj["namesrv_pid"]] + [b["pid"] for b in obj["brokers"]]
                    return obj
        raise BenchError(f"hamq dev not ready after {READY_TIMEOUT_S} s; see {self.stderr_path}")

    def stop(self, keep_logs=False):
        """SIGTERM to the hamq dev PID, bounded wait; report (not hide) anything abnormal."""
        problems = []
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                problems.append(
                    f"hamq dev pid {self.proc.pid} did not exit {STOP_TIMEOUT_S} s after SIGTERM; "
                    f"sent SIGKILL to that pid"
                )
                self.proc.kill()
                self.proc.wait(10)
        if self.proc is not None:
            rc = self.proc.returncode
            if rc not in (0, -signal.SIGTERM, 128 + signal.SIGTERM):
                problems.append(f"hamq dev exited with code {rc}")
        # children are in their own sessions: make sure none survived (by recorded PID only)
        if self.ready:
            time.sleep(0.2)
            for pid in self.server_pids:
                if _pid_is_ours(pid):
                    problems.append(
                        f"server pid {pid} still alive after hamq dev exited; sent SIGTERM"
                    )
                    try:
                        os.kill(pid, signal.SIGTERM)
                    except OSError:
                        pass
        if self.stderr:
            self.stderr.close()
        if self.data and os.path.isdir(self.data):
            if keep_logs or problems:
                for f in os.listdir(self.data):
                    if f.endswith(".log"):
                        shutil.copy(
                            os.path.join(self.data, f),
                            os.path.join(self.logdir, f"{os.path.basename(self.data)}-{f}"),
                        )
            shutil.rmtree(self.data, ignore_errors=True)
        for p in problems:
            log("PROBLEM: " + p)
        return problems


def _pid_is_ours(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().replace(b"\0", b" ")
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
        return b"hamq" in cmd and state != "Z"
    except OSError:
        return False


# ---- running one `hamq bench` phase --------------------------------------------------------


def run_bench(cluster: DevCluster, args, timeout_s, startup_cpu):
    cmd = [HAMQ, "bench", *args, "--namesrv", cluster.namesrv, "--json"]
    c0 = children_cpu_s()
    s0 = proc_cpu_s(cluster.server_pids)
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, timeout=timeout_s, cwd=TMP_DIR)
    except subprocess.TimeoutExpired as e:
        raise BenchError(
            f"timeout after {timeout_s} s: {' '.join(cmd)}; stderr: "
            f"{(e.stderr or b'').decode(errors='replace')[-2000:]}"
        ) from None
    wall = time.perf_counter() - t0
    s1 = proc_cpu_s(cluster.server_pids)
    c1 = children_cpu_s()
    if p.returncode != 0:
        raise BenchError(
            f"exit {p.returncode}: {' '.join(cmd)}\nstdout: {p.stdout.decode(errors='replace')[-2000:]}"
            f"\nstderr: {p.stderr.decode(errors='replace')[-3000:]}"
        )
    try:
        res = json.loads(p.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise BenchError(f"no JSON from {' '.join(cmd)}: {p.stdout!r} {p.stderr!r}") from None
    el = max(res.get("elapsed_s") or 0, 1e-6)
    res["command"] = " ".join(cmd)
    res["process_wall_s"] = wall
    res["client_cpu_pct"] = 100 * max(0.0, (c1 - c0) - startup_cpu) / el
    # server CPU is sampled around the whole `hamq bench` process (client start, topic
    # creation and warm-up included, when the servers are nearly idle) and divided by the
    # measured phase time: a slight over-estimate.
    res["servers_cpu_pct"] = 100 * (s1 - s0) / el
    res["servers_cpu_pct_over_process_wall"] = 100 * (s1 - s0) / wall
    return res


def measure_startup_cpu():
    vals = []
    for _ in range(3):
        c0 = children_cpu_s()
        subprocess.run([HAMQ, "bench", "produce", "--help"], capture_output=True, timeout=60)
        vals.append(children_cpu_s() - c0)
    return min(vals)


def one_run(setup, run, a, logdir, startup_cpu):
    cl = DevCluster(setup, logdir)
    res = {"run": run, "setup": setup, "loadavg": loadavg(), "problems": []}
    ok = False
    try:
        ready = cl.start()
        res["cluster"] = {
            "command": cl.cmd if isinstance(cl.cmd, str) else " ".join(cl.cmd),
            "ready": ready,
        }
        if a.warmup:
            w = run_bench(
                cl,
                [
                    "produce",
                    "--topic",
                    "WarmUp",
                    "--batch",
                    "1",
                    "--inflight",
                    str(a.window),
                    "--count",
                    str(a.warmup),
                    "--size",
                    str(a.size),
                    "--queues",
                    str(a.queues),
                ],
                120,
                startup_cpu,
            )
            res["warmup"] = {
                k: w.get(k) for k in ("messages", "errors", "first_error", "msgs_per_s")
            }
            if w["errors"]:
                res["problems"].append(
                    f"warm-up: {w['messages']} of {a.warmup} msgs, errors {w['errors']}, "
                    f"first_error {w.get('first_error')}"
                )
        ms = str(a.phase_timeout)
        pub = run_bench(
            cl,
            [
                "produce",
                "--topic",
                "BenchTopic",
                "--batch",
                "1",
                "--inflight",
                str(a.window),
                "--count",
                str(a.count),
                "--size",
                str(a.size),
                "--queues",
                str(a.queues),
                "--max-seconds",
                ms,
            ],
            a.phase_timeout + 60,
            startup_cpu,
        )
        res["publish"] = pub
        if pub["errors"] or pub["messages"] != a.count:
            res["problems"].append(
                f"produce: {pub['messages']} of {a.count} msgs, errors {pub['errors']}, "
                f"first_error {pub.get('first_error')}"
            )
        cons = run_bench(
            cl,
            [
                "consume",
                "--topic",
                "BenchTopic",
                "--count",
                str(pub["messages"]),
                "--max-seconds",
                ms,
            ],
            a.phase_timeout + 60,
            startup_cpu,
        )
        res["consume"] = cons
        if cons["messages"] != pub["messages"]:
            res["problems"].append(f"consume: {cons['messages']} of {pub['messages']} msgs")
        lat = run_bench(
            cl,
            [
                "latency",
                "--topic",
                "LatencyTopic",
                "--count",
                str(a.lat_count),
                "--size",
                str(a.size),
                "--queues",
                str(a.queues),
                "--max-seconds",
                ms,
            ],
            a.phase_timeout + 60,
            startup_cpu,
        )
        res["latency"] = lat
        if lat["errors"] or lat["messages"] != a.lat_count:
            res["problems"].append(
                f"latency: {lat['messages']} of {a.lat_count} sends, errors {lat['errors']}, "
                f"first_error {lat.get('first_error')}"
            )
        ok = True
    except BenchError as e:
        res["problems"].append(str(e))
        log(f"run {run} {setup} FAILED: {e}")
    finally:
        res["problems"] += cl.stop(keep_logs=not ok)
    return res


def snapshot_src(dest_root):
    """Copy this checkout's src/hamq to dest_root/hamq (others edit the tree during the run; the editable
    install would otherwise load whatever is on disk at each process start). Bounded retries until
    the copy imports cleanly."""
    src = os.path.join(REPO, "src", "hamq")
    vpy = os.path.join(os.path.dirname(HAMQ), "python")
    last = None
    for attempt in range(1, 7):
        dst = os.path.join(dest_root, "hamq")
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        env = dict(os.environ, PYTHONPATH=dest_root)
        p = subprocess.run(
            [
                vpy,
                "-c",
                "import hamq, hamq.cli.main, hamq.broker.server, hamq.namesrv.server, "
                "hamq.cli.bench; print(hamq.__file__)",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        if p.returncode == 0 and p.stdout.strip().startswith(dest_root):
            h = hashlib.sha256()
            for d, _, files in sorted(os.walk(dst)):
                for f in sorted(files):
                    fp = os.path.join(d, f)
                    h.update(os.path.relpath(fp, dst).encode())
                    with open(fp, "rb") as fh:
                        h.update(fh.read())
            return {
                "path": dst,
                "attempts": attempt,
                "sha256": h.hexdigest()[:16],
                "taken_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
        last = (p.stdout + p.stderr)[-1500:]
        log(
            f"source snapshot attempt {attempt} does not import: {last.strip().splitlines()[-1] if last.strip() else '?'}"
        )
        time.sleep(10)
    raise BenchError(f"no importable snapshot of {src} after 6 attempts; last error:\n{last}")


def git_rev():
    try:
        rev = subprocess.run(
            ["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except Exception:  # noqa: BLE001
        return None


def hamq_version():
    try:
        p = subprocess.run(
            [
                os.path.join(os.path.dirname(HAMQ), "python"),
                "-c",
                "import importlib.metadata as m; print(m.version('hamq'))",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return p.stdout.strip() or None
    except Exception:  # noqa: BLE001
        return None


def phase_ok(r, phase, count, lat_count):
    """Did this phase of this run do what the peers' phase does? Runs where sends failed are kept
    in raw but left out of the summary metrics (the msgs/s of a run that stored 10% of its
    messages, and the consume rate of that smaller backlog, are not comparable)."""
    pub = r.get("publish")
    pub_ok = bool(pub) and not pub["errors"] and pub["messages"] == count
    if phase == "publish":
        return pub_ok
    if phase == "consume":
        return pub_ok and "consume" in r and r["consume"]["messages"] == pub["messages"]
    lat = r.get("latency")
    return bool(lat) and not lat["errors"] and lat["messages"] == lat_count


def summarize(raw, count, lat_count):
    def vals(rs, phase, key, only_ok=True):
        return [
            x[phase][key]
            for x in rs
            if phase in x and (not only_ok or phase_ok(x, phase, count, lat_count))
        ]

    summary = {}
    for s, rs in raw.items():
        summary[s] = {
            "publish_msgs_per_s": spread(vals(rs, "publish", "msgs_per_s")),
            "consume_msgs_per_s": spread(vals(rs, "consume", "msgs_per_s")),
            "sync_p50_ms": spread(vals(rs, "latency", "p50_ms")),
            "sync_p99_ms": spread(vals(rs, "latency", "p99_ms")),
            "publish_client_cpu_pct": spread(vals(rs, "publish", "client_cpu_pct")),
            "publish_servers_cpu_pct": spread(vals(rs, "publish", "servers_cpu_pct")),
            "consume_client_cpu_pct": spread(vals(rs, "consume", "client_cpu_pct")),
            "consume_servers_cpu_pct": spread(vals(rs, "consume", "servers_cpu_pct")),
            "latency_client_cpu_pct": spread(vals(rs, "latency", "client_cpu_pct")),
            "latency_servers_cpu_pct": spread(vals(rs, "latency", "servers_cpu_pct")),
            # every run, failed sends included (successful msgs / elapsed)
            "publish_ok_msgs_per_s_all_runs": spread(vals(rs, "publish", "msgs_per_s", False)),
            "publish_ok_msgs_all_runs": spread(vals(rs, "publish", "messages", False)),
            "publish_errors_all_runs": spread(vals(rs, "publish", "errors", False)),
            "runs_with_problems": sum(1 for x in rs if x["problems"]),
            "runs": len(rs),
        }
    return summary


def without_machine_paths(text: str) -> str:
    """Results name paths relative to the repo and the temporary directory, not this
    machine's (they are committed to bench/peers-results/)."""
    return text.replace(REPO + os.sep, "").replace(TMP_DIR + os.sep, "$TMPDIR" + os.sep)


def write_and_print(data, name, ts):
    info, summary = data["info"], data["summary"]
    p = info["params"]
    path = os.path.join(RESULTS_DIR, f"{name}-{ts}.json")
    with open(path, "w") as fh:
        fh.write(without_machine_paths(json.dumps(data, indent=2, default=str)))
    shutil.copy(path, os.path.join(RESULTS_DIR, f"{name}-latest.json"))
    print()
    print(
        f"hamq {info['server_version']}: {p['count']} x {p['size']} B, batch 1, {p['window']} in flight, "
        f"latency over {p['lat_count']} one-at-a-time sends; median [min-max] of {p['runs']} runs "
        f"(phases whose sends failed left out)"
    )
    hdr = [
        "setup",
        "publish msg/s",
        "consume msg/s",
        "sync p50 ms",
        "sync p99 ms",
        "pub CPU client/servers %",
        "runs with problems",
        "failed sends per run",
    ]
    print("| " + " | ".join(hdr) + " |")
    print("|" + "|".join("---" for _ in hdr) + "|")
    for s, m in summary.items():
        c = m["publish_client_cpu_pct"]["median"]
        v = m["publish_servers_cpu_pct"]["median"]
        e = m["publish_errors_all_runs"]
        row = [
            s,
            fmt_spread(m["publish_msgs_per_s"]),
            fmt_spread(m["consume_msgs_per_s"]),
            fmt_spread(m["sync_p50_ms"], 2),
            fmt_spread(m["sync_p99_ms"], 2),
            "n/a" if c is None else f"{c:.0f} / {v:.0f}",
            f"{m['runs_with_problems']} of {m['runs']}",
            fmt_spread(e) if e["median"] else "0",
        ]
        print("| " + " | ".join(row) + " |")
    for s, probs in info.get("problems", {}).items():
        for pr in probs:
            print(f"problem {s}: {pr.splitlines()[0][:300]}")
    return path


def resummarize(path, name):
    """Recompute the summary of an existing result file (raw kept) and write it as the latest."""
    with open(path) as fh:
        data = json.load(fh)
    p = data["info"]["params"]
    data["summary"] = summarize(data["raw"], p["count"], p["lat_count"])
    data["info"]["resummarized_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ts = os.path.basename(path).replace(name + "-", "").replace(".json", "")
    if ts == "latest":
        ts = time.strftime("%Y%m%d-%H%M%S")
    return write_and_print(data, name, ts)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--setups", default=DEFAULT_SETUPS, help=f"comma list of {', '.join(SETUPS)}")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--count", type=int, default=50000)
    ap.add_argument(
        "--window", type=int, default=1000, help="sends in flight (--inflight, --batch 1)"
    )
    ap.add_argument("--lat-count", type=int, default=2000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument(
        "--queues", type=int, default=4, help="queues of each bench topic (hamq bench default)"
    )
    ap.add_argument("--warmup", type=int, default=2000)
    ap.add_argument("--phase-timeout", type=float, default=180.0)
    ap.add_argument("--name", default="hamq", help="result file prefix in $PEERS_DIR/results")
    ap.add_argument(
        "--live-src",
        action="store_true",
        help="use the editable install as is instead of a snapshot of src/hamq",
    )
    ap.add_argument(
        "--resummarize",
        metavar="RESULT_JSON",
        help="only recompute the summary of an existing result file and write it again",
    )
    a = ap.parse_args()
    if a.resummarize:
        resummarize(a.resummarize, a.name)
        return 0
    setups = [s.strip() for s in a.setups.split(",") if s.strip()]
    for s in setups:
        if s not in SETUPS:
            ap.error(f"unknown setup {s!r}")
    if not (1 <= a.runs <= 20):
        ap.error("--runs must be 1..20")

    ts = time.strftime("%Y%m%d-%H%M%S")
    logdir = os.path.join(PEERS_DIR, "hamq-logs", ts)
    os.makedirs(logdir, exist_ok=True)
    os.makedirs(RESULTS_DIR, exist_ok=True)
    snap = None
    snap_root = None
    if not a.live_src:
        snap_root = tempfile.mkdtemp(prefix="hamq-cmp-src-")
        snap = snapshot_src(snap_root)
        os.environ["PYTHONPATH"] = snap_root  # inherited by hamq dev, its servers and hamq bench
        log(f"using source snapshot {snap}")
    ver = hamq_version()
    rev = git_rev()
    startup_cpu = measure_startup_cpu()
    info = {
        "tool": "bench/compare_peers.py",
        "server_version": f"{ver} ({rev})" if rev else ver,
        "hamq_version": ver,
        "git": rev,
        "hamq_bin": HAMQ,
        "params": {
            "runs": a.runs,
            "count": a.count,
            "size": a.size,
            "window": a.window,
            "lat_count": a.lat_count,
            "batch": 1,
            "queues": a.queues,
            "warmup": a.warmup,
            "phase_timeout": a.phase_timeout,
            "setups": ",".join(setups),
            "consume_pull_batch": 1024,
        },
        "setup_commands": {
            s: "hamq dev --data <tmpdir> --port-base <free> " + " ".join(SETUPS[s]) for s in setups
        },
        "client_startup_cpu_s_subtracted": startup_cpu,
        "source_snapshot": snap or "live editable install (--live-src)",
        "env": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_at_start": loadavg(),
            "time": time.strftime("%Y-%m-%d %H:%M:%S"),
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "notes": [
            "each run of each setup on a fresh hamq dev cluster (new tmp data dir)",
            "consume = hamq bench consume: pulls of 1024 from every queue concurrently, no per-message "
            "ack (pull consumers track offsets; the bench does not commit them)",
            "CPU: servers = name server + all brokers; client = hamq bench process minus its "
            "startup (approximate)",
        ],
    }
    log(f"hamq {info['server_version']}; setups {setups}; runs {a.runs}; logs {logdir}")

    raw = {s: [] for s in setups}
    t_start = time.monotonic()
    for run in range(1, a.runs + 1):
        for s in setups:
            r = one_run(s, run, a, logdir, startup_cpu)
            raw[s].append(r)
            if "latency" in r:
                log(
                    f"run {run} {s:22s} publish {r['publish']['msgs_per_s']:8,.0f} msg/s "
                    f"(client {r['publish']['client_cpu_pct']:.0f}%, servers {r['publish']['servers_cpu_pct']:.0f}%)"
                    f" | consume {r['consume']['msgs_per_s']:8,.0f} msg/s"
                    f" | sync p50 {r['latency']['p50_ms']:.2f} ms p99 {r['latency']['p99_ms']:.2f} ms"
                    f" | problems {len(r['problems'])}"
                )
            for p in r["problems"]:
                log(f"run {run} {s} problem: {p}")
    info["total_seconds"] = time.monotonic() - t_start
    if snap_root:
        shutil.rmtree(snap_root, ignore_errors=True)

    info["problems"] = {s: [p for x in rs for p in x["problems"]] for s, rs in raw.items()}
    data = {"info": info, "summary": summarize(raw, a.count, a.lat_count), "raw": raw}
    path = write_and_print(data, a.name, ts)
    print(f"\nresults: {path}\n         {os.path.join(RESULTS_DIR, a.name + '-latest.json')}")
    return 1 if any(m["runs_with_problems"] for m in data["summary"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
