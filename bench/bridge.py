"""control-node bench bridge: a ROS 2 robot's round trip through `bridge ros2` + the node, against a plain rclpy
echo node, side by side in one run.

Every ROS 2 process runs in a private network namespace with only `lo` (created here: needs root and
`ip netns`), ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST and a private ROS_DOMAIN_ID. The node runs outside
it (it never speaks ROS 2; ipc sockets are files). Cases, each --pings ping-pongs at --rate Hz
(`bench/peers/ros2.py ping`: publish a JointState, wait for the command, next at the next slot):

  echo            a plain rclpy node: JointState in, Float64MultiArray out from its callback (the floor), with
                  rclpy.spin's default executor (the ratios' base) and with the EventsExecutor the bridge uses
  bridge sensor   bridge + node, `[loop] clock = "sensor"` (the node answers each frame when it arrives)
  bridge timer    bridge + node, 1 kHz timer clock (the answer waits for the next tick: +0.5 ms on average)
  zmq timer       no ROS 2: the same node and policy, pinged over its own ZeroMQ protocol (node misses
                  without the bridge; round trip of the node alone)

Reported: round trip p50 / p99 / p99.9 / max and the ratios to echo, the bridge's CPU share (process CPU
time over its run), the node's deadline misses (timer cases). The pendulum recipe of
configs/pendulum_ros2.toml and a random 3 -> 64 -> 64 -> 1 policy (the pendulum policy's shape).

Run it alone: ``flock /tmp/control-node-bench.lock control-node bench bridge``.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

from control_node.bench.common import machine_info, machine_lines, save_raw, write_json
from control_node.bench.harness import CHILD_CWD, NodeProcess, child_env, write_node_config
from control_node.bench.switch import why_late_brief


def ros2_section():
    import tomllib

    from control_node.endpoints import default_config
    text = open(default_config("pendulum_ros2.toml")).read()
    start = text.index("\n[ros2]\n") + 1
    end = text.index("\n[children.record]")
    tomllib.loads(text[start:end])                 # the packaged recipe, as a user runs it
    return text[start:end]


class Netns:
    def __init__(self):
        self.name = f"cn-bench-{os.getpid()}"
        self.domain = str(100 + os.getpid() % 100)

    def __enter__(self):
        if os.geteuid() != 0:
            raise SystemExit("bench bridge: needs root for a private network namespace (ip netns add)")
        r = subprocess.run(["ip", "netns", "add", self.name], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"bench bridge: ip netns add failed: {r.stderr.strip()}")
        subprocess.run(["ip", "netns", "exec", self.name, "ip", "link", "set", "lo", "up"], check=True)
        return self

    def popen(self, *cmd, cpus=None, **kw):
        env = {**child_env(), "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST", "ROS_DOMAIN_ID": self.domain}
        pre = ["taskset", "-c", ",".join(map(str, sorted(cpus)))] if cpus else []
        return subprocess.Popen(["ip", "netns", "exec", self.name, *pre, *cmd], cwd=CHILD_CWD, env=env, text=True, **kw)

    def __exit__(self, *exc):
        for p in subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True).stdout.split():
            try:
                os.kill(int(p), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


def wait_line(p, prefix, timeout=60.0):
    deadline = time.monotonic() + timeout
    lines = []
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            raise RuntimeError(f"exited before '{prefix}':\n" + "".join(lines))
        lines.append(line)
        if line.startswith(prefix):
            return line
    raise RuntimeError(f"no '{prefix}' within {timeout:g} s:\n" + "".join(lines))


def ping(ns, tmp, tag, n, rate, cpus):
    out = os.path.join(tmp, f"{tag}.npz")
    p = ns.popen(sys.executable, "-m", "control_node.bench.peers.ros2", "ping", str(n), str(rate), out, cpus=cpus,
                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    txt, _ = p.communicate(timeout=120 + 3 * n / rate)
    if p.returncode:
        raise RuntimeError(f"ping ({tag}) failed:\n{txt}")
    return np.load(out)["rtt_ns"]


def rtt_row(rtt):
    v = rtt[rtt >= 0].astype(np.float64)
    if not v.size:
        return {"p50": None, "p99": None, "p999": None, "max": None, "n": 0, "lost": int(rtt.size)}
    q = np.percentile(v, [50, 99, 99.9])
    return {"p50": q[0] / 1e3, "p99": q[1] / 1e3, "p999": q[2] / 1e3, "max": v.max() / 1e3, "n": int(v.size),
            "lost": int((rtt < 0).sum())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="control-node bench bridge", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pings", type=int, default=3000, help="round trips per case (default: %(default)s)")
    ap.add_argument("--rate", type=float, default=1000.0, help="ping slots per second (default: %(default)s)")
    ap.add_argument("--miss-rounds", type=int, default=3, metavar="R",
                    help="then R alternating timer-clock runs with and without the bridge, for the node's deadline "
                         "misses and their why-late causes (default: %(default)s)")
    ap.add_argument("--out", default=os.path.join("bench", "results", "bridge.json"), help="JSON results")
    args = ap.parse_args(argv)
    import importlib.util
    if importlib.util.find_spec("rclpy") is None:         # the ROS 2 processes are children; this one never imports it
        from control_node.bridge.recipe import INSTALL
        print(f"bench bridge: rclpy is missing. Install: {INSTALL}", file=sys.stderr)
        return 2
    from control_node.bench.policy import make_spec
    from control_node.kernels import Policy, save_model
    from control_node.launch import cores_off_loop
    info = machine_info()
    for line in machine_lines(info):
        print(line)
    rows, raw = {}, {}
    with tempfile.TemporaryDirectory(prefix="cn-bench-bridge-") as tmp, Netns() as ns:
        os.chmod(tmp, 0o700)
        model = os.path.join(tmp, "pendulum-shape.npz")
        save_model(make_spec(dict(sizes=[3, 64, 64, 1], act="tanh", norm=True, squash=True, dtype="float32"),
                             "float32", seed=0), model)
        Policy.load(model)
        others = set(os.sched_getaffinity(0))

        # echo: the floor, no node; with rclpy.spin's default executor and with the bridge's EventsExecutor
        for tag, name, extra in (("echo", "echo (rclpy)", []), ("echo_events", "echo (rclpy, EventsExecutor)",
                                                                 ["events"])):
            echo = ns.popen(sys.executable, "-m", "control_node.bench.peers.ros2", "echo", *extra,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            wait_line(echo, "ready echo")
            raw[tag] = ping(ns, tmp, tag, args.pings, args.rate, None)
            echo.send_signal(signal.SIGINT)
            echo.communicate(timeout=20)
            rows[name] = {**rtt_row(raw[tag]), "cpu": None, "misses": None}
            print(f"{name}: p50 {rows[name]['p50']:.0f} us", flush=True)

        def bridge_case(clock, tag):
            d = os.path.join(tmp, tag)
            os.makedirs(d, mode=0o700)
            cfg = os.path.join(d, "node.toml")
            write_node_config(cfg, d, f'[loop]\nclock = "{clock}"\n[watchdog]\nstale_after_ms = 100.0\n'
                              '[diagnostics]\nattribution = true\n' + ros2_section())
            node = NodeProcess(cfg, model, "--quiet", "--run-dir", os.path.join(d, "run"), ready_timeout=60)
            off = cores_off_loop(node.ready_line)
            cpus = off[1] if off else others
            br = ns.popen(sys.executable, "-m", "control_node", "bridge", "ros2", "--config", cfg, "--model", model,
                          "--run-dir", os.path.join(d, "bridge"), cpus=cpus, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)
            wait_line(br, "ready bridge")
            try:
                rtt = ping(ns, tmp, tag, args.pings, args.rate, cpus)
            finally:
                br.send_signal(signal.SIGINT)
                br.communicate(timeout=30)
                _, _, _, run_dir = node.stop()
            with open(os.path.join(d, "bridge", "summary.json")) as f:
                bs = json.load(f)
            with open(os.path.join(run_dir, "summary.json")) as f:
                nsum = json.load(f)
            return rtt, {**rtt_row(rtt), "cpu": bs["cpu_share"],
                         "misses": nsum.get("deadline_misses") if clock == "timer" else None,
                         "why_late": why_late_brief(nsum) if clock == "timer" else None,
                         "callback_p99_us": (bs.get("callback_latency_ns") or {}).get("p99", 0) / 1e3}

        def zmq_case(tag):
            """The node alone over ZeroMQ, timer clock: misses without the bridge."""
            d = os.path.join(tmp, tag)
            os.makedirs(d, mode=0o700)
            cfg = os.path.join(d, "node.toml")
            write_node_config(cfg, d, '[loop]\nclock = "timer"\n[watchdog]\nstale_after_ms = 100.0\n'
                              '[diagnostics]\nattribution = true\n')
            node = NodeProcess(cfg, model, "--quiet", "--run-dir", os.path.join(d, "run"), ready_timeout=60)
            try:
                rtt = _zmq_ping(node.endpoints, args.pings, args.rate)
            finally:
                _, _, _, run_dir = node.stop()
            with open(os.path.join(run_dir, "summary.json")) as f:
                nsum = json.load(f)
            return rtt, {**rtt_row(rtt), "cpu": None, "misses": nsum.get("deadline_misses"),
                         "why_late": why_late_brief(nsum)}

        for clock in ("sensor", "timer"):
            raw[f"bridge_{clock}"], rows[f"bridge + node, {clock} clock"] = bridge_case(clock, f"bridge-{clock}")
            print(f"bridge {clock}: p50 {rows[f'bridge + node, {clock} clock']['p50']:.0f} us", flush=True)
        raw["zmq_timer"], rows["zmq client + node, timer clock (no ROS 2)"] = zmq_case("zmq")
        # misses with and without the bridge, alternating (a host stall lands in either)
        rounds = []
        for k in range(args.miss_rounds):
            _, with_b = bridge_case("timer", f"miss-bridge-{k}")
            _, without = zmq_case(f"miss-zmq-{k}")
            rounds.append({"with_bridge": {"misses": with_b["misses"], "why_late": with_b["why_late"]},
                           "without": {"misses": without["misses"], "why_late": without["why_late"]}})
            print(f"misses round {k + 1}: with the bridge {with_b['misses']}, without {without['misses']}", flush=True)
    e = rows["echo (rclpy)"]
    print(f"\nround trip JointState -> command, {args.pings} ping-pongs at {args.rate:g} Hz slots "
          "(us; ratio = / echo)")
    print(f"{'case':44s} {'p50':>7s} {'p99':>7s} {'p99.9':>7s} {'max':>8s} {'lost':>5s} {'x p50':>6s} {'x p99':>6s} "
          f"{'bridge CPU':>10s} {'misses':>6s}")
    for name, r in rows.items():
        if r["p50"] is None:
            print(f"{name:44s} no answers")
            continue
        cpu = "" if r["cpu"] is None else f"{100 * r['cpu']:.0f} %"
        mis = "" if r["misses"] is None else str(r["misses"])
        print(f"{name:44s} {r['p50']:7.0f} {r['p99']:7.0f} {r['p999']:7.0f} {r['max']:8.0f} {r['lost']:5d} "
              f"{r['p50'] / e['p50']:6.2f} {r['p99'] / e['p99']:6.2f} {cpu:>10s} {mis:>6s}")
    for name, r in rows.items():
        if r.get("why_late") and r["why_late"].get("text"):
            print(f"why late ({name}): {r['why_late']['text']}")
    if rounds:
        print(f"\nnode deadline misses, timer clock, {args.pings} pings per run, alternating runs:")
        for k, r in enumerate(rounds):
            for side in ("with_bridge", "without"):
                wl = (r[side]["why_late"] or {}).get("text") or ""
                print(f"  round {k + 1} {side.replace('_', ' '):12s} {r[side]['misses']:3d}  {wl}")
        tot = {side: sum(r[side]["misses"] or 0 for r in rounds) for side in ("with_bridge", "without")}
        print(f"  total: with the bridge {tot['with_bridge']}, without {tot['without']}")
    payload = {"benchmark": "bridge", "machine": info, "settings": vars(args), "rows": rows, "miss_rounds": rounds,
               "raw": save_raw("bridge", raw)}
    write_json(args.out, payload)
    print(f"results: {args.out}")
    return 0


def _zmq_ping(endpoints, n, rate):
    import msgpack
    import zmq
    ctx = zmq.Context.instance()
    pub, sub = ctx.socket(zmq.PUB), ctx.socket(zmq.SUB)
    pub.connect(endpoints["sensor"])
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoints["action"])
    seq = 0

    def one(timeout_ms=100):
        nonlocal seq
        seq += 1
        t0 = time.monotonic_ns()
        pub.send(msgpack.packb({"seq": seq, "t_ns": t0, "x": [1.0, 0.0, 0.0]}))
        deadline = t0 + timeout_ms * 1_000_000
        while True:
            left = (deadline - time.monotonic_ns()) // 1_000_000
            if left < 0 or not sub.poll(max(1, left)):
                return -1
            a = msgpack.unpackb(sub.recv())
            if a["seq"] == seq and not a["safe"]:
                return time.monotonic_ns() - t0

    deadline = time.monotonic() + 30
    while one(200) < 0 and time.monotonic() < deadline:
        pass
    rtt = np.full(n + 200, -1, dtype=np.int64)
    period = 1e9 / rate
    t_next = time.monotonic_ns()
    for k in range(n + 200):
        t_next += period
        rtt[k] = one()
        left = t_next - time.monotonic_ns()
        if left > 0:
            time.sleep(left / 1e9)
        else:
            t_next = time.monotonic_ns()
    pub.close(0)
    sub.close(0)
    return rtt[200:]


if __name__ == "__main__":
    sys.exit(main())
