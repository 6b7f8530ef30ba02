"""Node and simulator on two "hosts": two network namespaces joined by a veth pair, tcp + CURVE.

The link is then made worse (5 ms delay, 5% loss on the robot -> node direction) and the test shows
what changes: the node keeps its rate, the watchdog covers the gaps, the simulator's round trip grows by
about the added delay. The commands are the ones docs/deployment.md gives.

Impairment: `tc qdisc ... netem delay 5ms loss 5%` when the kernel has sch_netem; otherwise (some
container kernels lack it) loss comes from an iptables `statistic` DROP rule on the same interface and
the delay from a small userspace relay in the robot's namespace that holds robot -> node bytes for 5 ms.
Either way the traffic crosses the veth pair between the namespaces.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from control_node.bench.harness import CHILD_CWD
from support.nodeutil import assert_answered_or_superseded, quiet_node_toml

from test_security import make_keys, security_toml

RATE = 1000.0
SIM_RATE = 500.0
PHASE_S = 3.0
DELAY_MS = 5.0


def sh(*cmd, check=True):
    r = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def need_tools():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add)")
    if not shutil.which("ip") or not shutil.which("tc"):
        subprocess.run(["apt-get", "install", "-y", "iproute2"], capture_output=True, timeout=300)
    missing = [t for t in ("ip", "tc") if not shutil.which(t)]
    if missing:
        pytest.skip(f"missing {', '.join(missing)} (apt-get install iproute2 failed)")


class Link:
    """Two namespaces and a veth pair; everything removed in close(), whatever happened."""

    def __init__(self):
        tag = f"{os.getpid() % 100000}"
        self.ns_node, self.ns_robot = f"cn-node-{tag}", f"cn-robot-{tag}"
        self.if_node, self.if_robot = f"cnn{tag}", f"cnr{tag}"
        octet = os.getpid() % 250 + 1
        self.ip_node, self.ip_robot = f"10.200.{octet}.1", f"10.200.{octet}.2"
        self.created = []

    def up(self):
        for ns in (self.ns_node, self.ns_robot):
            r = sh("ip", "netns", "add", ns, check=False)
            if r.returncode != 0:
                self.close()
                pytest.skip(f"cannot create a network namespace (ip netns add: {r.stderr.strip()})")
            self.created.append(ns)
        sh("ip", "link", "add", self.if_node, "type", "veth", "peer", "name", self.if_robot)
        self.created.append("veth")
        sh("ip", "link", "set", self.if_node, "netns", self.ns_node)
        sh("ip", "link", "set", self.if_robot, "netns", self.ns_robot)
        for ns, dev, ip in ((self.ns_node, self.if_node, self.ip_node), (self.ns_robot, self.if_robot, self.ip_robot)):
            sh("ip", "-n", ns, "addr", "add", f"{ip}/30", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        return self

    def exec(self, ns, *cmd):
        return ["ip", "netns", "exec", ns, *cmd]

    def has_netem(self):
        r = sh(*self.exec(self.ns_robot, "tc", "qdisc", "add", "dev", self.if_robot, "root", "netem", "delay", "0ms"),
               check=False)
        if r.returncode == 0:
            sh(*self.exec(self.ns_robot, "tc", "qdisc", "del", "dev", self.if_robot, "root"))
            return True
        return False

    def close(self):
        for ns in (self.ns_node, self.ns_robot):
            if ns in self.created:
                subprocess.run(["ip", "netns", "pids", ns], capture_output=True)
                out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
                for pid in out:                                  # our processes only: they live in our namespaces
                    try:
                        os.kill(int(pid), 9)
                    except (ProcessLookupError, ValueError):
                        pass
                sh("ip", "netns", "del", ns, check=False)       # deleting a namespace deletes its veth end
        if "veth" in self.created:
            sh("ip", "link", "del", self.if_node, check=False)  # only if it never left the root namespace
        self.created = []


RELAY = textwrap.dedent('''
    """Userspace stand-in for netem delay: forwards tcp, holding client -> server bytes DELAY ms (file)."""
    import collections, socket, sys, threading, time
    delay_file, pairs = sys.argv[1], sys.argv[2:]
    delay = [0.0]
    def watch():
        while True:
            try:
                delay[0] = float(open(delay_file).read().strip() or 0) / 1000.0
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
    def pump(src, dst, delayed):
        q, cv = collections.deque(), threading.Condition()
        def writer():
            while True:
                with cv:
                    while not q:
                        cv.wait()
                    due, data = q.popleft()
                if data is None:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                try:
                    dst.sendall(data)
                except OSError:
                    break
            dst.close()
        threading.Thread(target=writer, daemon=True).start()
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            with cv:
                q.append((time.monotonic() + (delay[0] if delayed else 0.0), data or None))
                cv.notify()
            if not data:
                return
    def serve(lport, host, port):
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", lport))
        ls.listen(8)
        while True:
            c, _ = ls.accept()
            u = socket.create_connection((host, port))
            for s in (c, u):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=pump, args=(c, u, True), daemon=True).start()
            threading.Thread(target=pump, args=(u, c, False), daemon=True).start()
    threading.Thread(target=watch, daemon=True).start()
    for p in pairs:
        lport, host, port = p.split(":")
        threading.Thread(target=serve, args=(int(lport), host, int(port)), daemon=True).start()
    print("relay ready", flush=True)
    threading.Event().wait()
''')


@pytest.fixture
def link():
    need_tools()
    lk = Link()
    try:
        yield lk.up()
    finally:
        lk.close()


def summary(path):
    with open(os.path.join(path, "summary.json")) as f:
        return json.load(f)


@pytest.mark.slow
def test_node_and_robot_in_two_namespaces_over_curve(link, tmp_path, iris_model_path):
    keys = make_keys(str(tmp_path))
    ports = {"sensor": 5601, "action": 5602, "diagnostics": 5603}
    node_eps = {k: f"tcp://{link.ip_node}:{p}" for k, p in ports.items()}
    netem = link.has_netem()
    if netem:
        robot_eps = dict(node_eps)
    else:                                                    # robot connects through the delay relay
        robot_eps = {k: f"tcp://127.0.0.1:{p + 1000}" for k, p in ports.items()}
    # no spin, no why-late recorder: CPU a test of answers over a link does not need
    common = quiet_node_toml(f'[node]\nrun_root = "{tmp_path}/runs"\n[loop]\nrate_hz = {RATE}\n'
                             "[watchdog]\nstale_after_ms = 5.0\n" + security_toml(keys))
    node_cfg, robot_cfg = tmp_path / "node.toml", tmp_path / "robot.toml"
    node_cfg.write_text("[endpoints]\n" + "".join(f'{k} = "{v}"\n' for k, v in node_eps.items()) + common)
    robot_cfg.write_text("[endpoints]\n" + "".join(f'{k} = "{v}"\n' for k, v in robot_eps.items()) + common)

    procs = []
    try:
        if not netem:
            delay_file = tmp_path / "delay_ms"
            delay_file.write_text("0")
            relay_py = tmp_path / "relay.py"
            relay_py.write_text(RELAY)
            relay = subprocess.Popen(link.exec(link.ns_robot, sys.executable, str(relay_py), str(delay_file),
                                               *[f"{p + 1000}:{link.ip_node}:{p}" for p in ports.values()]),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            procs.append(relay)
            assert relay.stdout.readline().strip() == "relay ready", relay.stderr.read()

        node_duration = 120.0                                # a cap: SIGTERM ends it after the second sim run
        node_run = tmp_path / "node_run"
        node = subprocess.Popen(link.exec(link.ns_node, sys.executable, "-m", "control_node", "run",
                                          "--config", str(node_cfg), "--model", str(iris_model_path),
                                          "--duration", str(node_duration), "--run-dir", str(node_run)),
                                cwd=CHILD_CWD, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(node)
        line = node.stdout.readline()
        assert line.startswith("ready "), (line, node.stderr.read() if node.poll() is not None else "")
        assert f"sensor=tcp://{link.ip_node}:5601" in line

        def sim(name):
            r = subprocess.run(link.exec(link.ns_robot, sys.executable, "-m", "control_node", "sim",
                                         "--config", str(robot_cfg), "--rate", str(SIM_RATE),
                                         "--duration", str(PHASE_S), "--run-dir", str(tmp_path / name),
                                         # the lossy link can drop a SYN or handshake segment (1-3 s
                                         # tcp retransmit each) and host stalls add more: 10 s was short
                                         "--timeout", "30"),
                               cwd=CHILD_CWD, capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stdout + r.stderr
            return summary(tmp_path / name)

        clean = sim("sim_clean")
        if netem:
            sh(*link.exec(link.ns_robot, "tc", "qdisc", "add", "dev", link.if_robot, "root", "netem",
                          "delay", f"{DELAY_MS:g}ms", "loss", "5%"))
        else:
            ipt = shutil.which("iptables") or shutil.which("iptables-legacy")
            if ipt is None:
                subprocess.run(["apt-get", "install", "-y", "iptables"], capture_output=True, timeout=300)
                ipt = shutil.which("iptables")
            if ipt is None:
                pytest.skip("no sch_netem in this kernel and no iptables for the loss fallback")
            sh(*link.exec(link.ns_robot, ipt, "-A", "OUTPUT", "-o", link.if_robot, "-m", "statistic",
                          "--mode", "random", "--probability", "0.05", "-j", "DROP"))
            delay_file.write_text(f"{DELAY_MS:g}")
            time.sleep(0.2)
        lossy = sim("sim_lossy")
        time.sleep(0.5)                                      # idle cycles after the run (stale, safe actions)
        node.send_signal(signal.SIGTERM)                     # ip netns exec execs the node: same pid
        out, err = node.communicate(timeout=30)
        assert node.returncode == 0, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()

    s = summary(node_run)
    print(f"\nimpairment: {'netem' if netem else 'iptables loss + userspace delay relay'}")
    print(f"node: cycles {s['cycles']} in {s['duration_s']:.2f} s ({s['achieved_rate_hz']:.1f} Hz), "
          f"frames_valid {s['frames_valid']}, stale {s['stale_cycles']}, safe {s['safe_actions']}, "
          f"superseded {s['superseded']}, misses {s['deadline_misses']}")
    for name, r in (("clean", clean), ("lossy", lossy)):
        rt = r["round_trip_ns"]
        print(f"sim {name}: sent {r['frames_sent']} answered {r['frames_answered']} safe actions "
              f"{r['safe_actions']} round trip p50 {rt['p50'] / 1e6:.2f} ms p99 {rt['p99'] / 1e6:.2f} ms")

    # the node kept its rate: one cycle per period over the whole run
    # every tick is a cycle or a tick skipped after a host stall (the node counts both)
    # (the rule, not the host's speed: series run 9 of 73b13d6 achieved 749 Hz on a loaded host, every tick
    # it did not run counted as skipped; a bound on achieved_rate_hz tested the host)
    assert abs(s["cycles"] + s["skipped_ticks"] - s["duration_s"] * RATE) <= 0.01 * s["duration_s"] * RATE
    assert s["rejected_total"] == 0
    # CURVE over the veth: the robot's frames were accepted and answered in both phases
    # frames superseded during a host stall of the loop are in the node's own count (both phases)
    # tcp delivers every frame despite the loss (retransmitted, late, bunched: then superseded), so the
    # node accepted nearly all frames of both phases, and answered or superseded them (the node counts
    # superseded frames over the whole run: one bound for both phases)
    both = {k: clean[k] + lossy[k] for k in ("frames_sent", "frames_answered")}
    assert s["frames_valid"] >= 0.98 * both["frames_sent"], (s["frames_valid"], both)
    assert_answered_or_superseded(both, s, share=0.9)
    # the clean phase on its own was served (how many answers came back inside the simulator's answer window
    # depends on the host's speed; the bound above holds them to the node's own counts)
    assert clean["frames_answered"] > 0, clean
    # the link's effect: round trip grows by about the added delay
    grow_ms = (lossy["round_trip_ns"]["p50"] - clean["round_trip_ns"]["p50"]) / 1e6
    assert 0.6 * DELAY_MS <= grow_ms <= 4 * DELAY_MS, grow_ms
    # the node's side of the story, per phase, from its per-cycle ring (same host clock: input age is valid)
    for k, (name, r) in enumerate((("clean", clean), ("lossy", lossy))):
        w = phase_window(node_run, r, k)
        r["node"] = w
        print(f"node during sim {name}: {w['cycles']} cycles, new frames {w['new_frames']}, "
              f"longest gap without a frame {w['max_gap_ms']:.1f} ms, stale cycles {w['stale']}, input age p50 {w['age_p50_ms']:.2f} ms")
    assert 0.6 * DELAY_MS <= lossy["node"]["age_p50_ms"] - clean["node"]["age_p50_ms"] <= 4 * DELAY_MS
    # the watchdog covers exactly the gaps longer than stale_after (5 ms): loss makes tcp retransmit, and
    # frames held back meanwhile arrive bunched (superseded); a gap > stale_after means safe actions
    for r in (clean, lossy):
        w = r["node"]
        if w["max_gap_ms"] > 5.0 + 2.0:
            assert w["stale"] > 0, w
        if w["max_gap_ms"] < 5.0 - 1.0:
            assert w["stale"] == 0, w
    # (the loss itself is not told apart by the node's gaps: tcp retransmits within a few ms, and on a slow
    # host the clean phase has as many: 46 gaps over 3 ms clean, 58 lossy, longest 7.0 / 5.0 ms, in one run)
    assert s["stale_cycles"] > 0 and s["safe_actions"] > 0      # at least between and after the sim runs


def phase_window(run_dir, sim_summary, k):
    """Node cycles from the first to the last frame of the k-th sim run: stale cycles, gaps, input age.

    Every sim run starts again from seq 0 (the node accepts it once the watchdog has tripped), so runs
    are told apart by the idle second between them."""
    import numpy as np
    from control_node.rundir import FLAG_NEW_FRAME, FLAG_STALE
    with np.load(os.path.join(run_dir, "cycles.npz")) as z:
        seq, flags, tick, age = z["seq"], z["flags"], z["t_tick_ns"], z["input_age_ns"]
        z_wake = z["wake_latency_ns"]
    base, n = sim_summary["seq_base"], sim_summary["frames_sent"]
    ours = np.flatnonzero((seq >= base) & (seq < base + n) & (flags & FLAG_NEW_FRAME > 0))
    runs = np.split(ours, np.flatnonzero(np.diff(tick[ours]) > 500e6) + 1)
    assert len(runs) == 2, [len(r) for r in runs]
    ours = runs[k]
    lo, hi = ours[0], ours[-1] + 1
    new = ours
    # gaps without a frame as the watchdog sees them: from the wake-up of a cycle that got a new frame to
    # the wake-up of the last cycle before the next one (the watchdog compares those clocks). A host stall
    # of the loop while frames keep coming is no gap: the first cycle after it finds them waiting; measured
    # tick to tick it would look like one, with no stale cycle
    wake = tick + np.maximum(z_wake, 0)
    gaps = (wake[new[1:] - 1] - wake[new[:-1]]) / 1e6 if len(new) > 1 else np.array([0.0])
    a = age[lo:hi][(age[lo:hi] >= 0) & (flags[lo:hi] & FLAG_NEW_FRAME > 0)]
    return {"cycles": int(hi - lo), "new_frames": int(len(new)), "max_gap_ms": float(gaps.max()),
            "stale": int(((flags[lo:hi] & FLAG_STALE) > 0).sum()),
            "age_p50_ms": float(np.percentile(a, 50) / 1e6) if a.size else float("nan")}
