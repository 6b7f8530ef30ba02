"""control-node bench live: the pendulum launch demo with the live view (`launch --foxglove`) and 0, 1 and 4
connected viewers, beside the demo without a live view, side by side: deadline misses, cycle time p99,
wake-up latency p99 and the live view's CPU.

The viewers are the Node.js client of the tests (tests/foxglove_client: @foxglove/ws-protocol, subscribed
to every channel; `npm ci` there first). Rounds alternate the settings so a slow hour of the host falls
on all of them. Target: no extra miss and cycle-time p99 within noise of the run without a viewer.

Run it alone: ``flock /tmp/control-node-bench.lock control-node bench live``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from control_node.bench.common import machine_info, machine_lines, write_json
from control_node.bench.harness import CHILD_CWD, child_env, free_tcp_ports

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = (("no live view", None), ("0 viewers", 0), ("1 viewer", 1), ("4 viewers", 4))


def demo_config(tmp, model):
    from control_node.endpoints import default_config
    with open(default_config("pendulum.toml")) as f:
        text = f.read()
    text = text.replace('model = "models/pendulum.npz"', f'model = "{model}"')
    eps = os.path.join(tmp, "ep")
    os.makedirs(eps, mode=0o700, exist_ok=True)
    for k in ("sensor", "action", "diagnostics", "sensor_tap"):
        text = text.replace(f'ipc://{{runtime_dir}}/{k}"', f'ipc://{eps}/{k}"')
    path = os.path.join(tmp, "pendulum.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def one_run(cfg, duration, run_dir, viewers, client_dir):
    """One launch; returns the row of figures."""
    import psutil
    cmd = [sys.executable, "-m", "control_node", "launch", cfg, "--duration", str(duration), "--run-dir", run_dir]
    port = None
    if viewers is not None:
        (port,) = free_tcp_ports(1)
        cmd += ["--foxglove", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(cmd, cwd=CHILD_CWD, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1)
    lines, live_pid, clients, cpu = [], None, [], None
    for line in proc.stdout:
        lines.append(line)
        m = re.search(r"started foxglove \(pid (\d+)\)", line)
        if m:
            live_pid = int(m.group(1))
        if "started sim" in line:
            break
    for i in range(viewers or 0):
        clients.append(subprocess.Popen(["node", os.path.join(client_dir, "client.cjs"), f"ws://127.0.0.1:{port}",
                                         os.path.join(run_dir + f"-viewer{i}.json"), str(duration)],
                                        cwd=client_dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    if live_pid is not None:
        p = psutil.Process(live_pid)
        t0 = time.monotonic()
        while proc.poll() is None:
            try:
                ct = p.cpu_times()
                cpu = (ct.user + ct.system, time.monotonic() - t0)
            except psutil.NoSuchProcess:
                break
            time.sleep(0.25)
    rest, _ = proc.communicate(timeout=duration + 120)
    for c in clients:
        c.wait(30)
    if proc.returncode != 0:
        raise SystemExit("launch failed:\n" + "".join(lines) + rest)
    with open(os.path.join(run_dir, "node", "summary.json")) as f:
        s = json.load(f)
    a = np.load(os.path.join(run_dir, "node", "cycles.npz"))
    ct = a["cycle_time_ns"][a["cycle_time_ns"] >= 0]
    wake = a["wake_latency_ns"][a["wake_latency_ns"] >= 0]
    received = 0
    for i in range(viewers or 0):
        try:
            with open(run_dir + f"-viewer{i}.json") as f:
                received += sum(len(v) for v in json.load(f)["messages"].values())
        except (OSError, ValueError):
            pass
    return {"deadline_misses": int(s["deadline_misses"]), "cycles": int(s["cycles"]),
            "cycle_time_p99_us": float(np.percentile(ct, 99)) / 1e3,
            "wake_latency_p99_us": float(np.percentile(wake, 99)) / 1e3,
            "server_cpu_share": (cpu[0] / cpu[1]) if cpu and cpu[1] > 0 else None,
            "viewer_messages": received if viewers is not None else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="control-node bench live", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per run (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of every setting (default: %(default)s)")
    ap.add_argument("--client", default=os.path.join(REPO, "tests", "foxglove_client"),
                    help="the Node.js viewer's directory, `npm ci` done (default: %(default)s)")
    ap.add_argument("--json", metavar="FILE", help="write figures, settings and machine here")
    args = ap.parse_args(argv)
    if shutil.which("node") is None or not os.path.isdir(os.path.join(args.client, "node_modules", "@foxglove")):
        raise SystemExit(f"bench live needs node and `npm ci` in {args.client} (@foxglove/ws-protocol)")
    import importlib.util
    if importlib.util.find_spec("foxglove") is None:
        raise SystemExit("bench live needs the foxglove extra: pip install 'control-node[foxglove]'")
    info = machine_info()
    tmp = tempfile.mkdtemp(prefix="cn-bench-live-")
    os.chmod(tmp, 0o700)
    model = os.path.join(tmp, "pendulum.npz")
    subprocess.run([sys.executable, "-m", "control_node", "train", "--task", "pendulum", "--out", model],
                   cwd=CHILD_CWD, check=True, capture_output=True)
    cfg = demo_config(tmp, model)
    rows = {name: [] for name, _ in SETTINGS}
    for r in range(args.rounds):
        for name, viewers in SETTINGS:
            print(f"round {r + 1}/{args.rounds}: pendulum demo, {name}, {args.duration:g} s ...", flush=True)
            rows[name].append(one_run(cfg, args.duration, os.path.join(tmp, f"{r}-{viewers}"), viewers, args.client))
    for line in machine_lines(info):
        print(line)
    print(f"settings: the pendulum launch demo (1 kHz, phase lock) for {args.duration:g} s per run, {args.rounds} "
          "rounds; the live view thins to 100 messages/s per channel (--every 10)")
    print("\n                       misses  cycle time p99  wake-up p99  live view CPU  messages to viewers")
    for name, _ in SETTINGS:
        for i, x in enumerate(rows[name]):
            cpu = "-" if x["server_cpu_share"] is None else f"{100 * x['server_cpu_share']:.1f} %"
            got = "-" if x["viewer_messages"] is None else str(x["viewer_messages"])
            print(f"  {name + f' {i + 1}':<20} {x['deadline_misses']:>6} {x['cycle_time_p99_us']:>12.1f} us "
                  f"{x['wake_latency_p99_us']:>9.1f} us {cpu:>13}  {got:>19}")
    if args.json:
        write_json(args.json, {"machine": info, "settings": vars(args), "runs": rows})
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
