"""bench replay: lockstep replay throughput through the node vs a bare pyzmq msgpack echo, in one run.

Both peers are driven by the same client (sim.engine.ClosedLoop, lockstep: send frame i, wait for its
answer, send the next) over ipc. The echo is bench/peers/echo.py, the same one `bench loop` uses: the
node's socket layout (binding SUB for frames, binding PUB for answers) and its real-time set-up, unpacking
each frame and packing an action map, no policy: the floor of a Python client <-> peer round trip. Holds /tmp/control-node-bench.lock while measuring.
"""
from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
import time

def _measure(eps, frames):
    from control_node.sim.engine import ClosedLoop, percentiles
    from control_node.sim.streams import iris_stream
    loop = ClosedLoop(eps, handshake_timeout=20.0)
    try:
        res = loop.run(iris_stream(frames), lockstep=True, grace=0.5)
    finally:
        loop.close()
    answered = res["rtt_ns"] >= 0
    span = (int(res["t_action_ns"][answered].max()) - int(res["t_send_ns"].min())) / 1e9
    return {"frames": frames, "answered": int(answered.sum()), "seconds": span,
            "frames_per_s": int(answered.sum()) / span if span > 0 else None,
            "round_trip_ns": percentiles(res["rtt_ns"][answered])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="control-node bench replay", description=__doc__)
    ap.add_argument("--frames", type=int, default=5000, help="lockstep frames per peer (default: %(default)s)")
    ap.add_argument("--clock", choices=["sensor", "timer"], default="sensor",
                    help="node clock: sensor answers each frame at once; timer answers on the next 1 kHz tick, "
                         "so lockstep tops out near 1000 frames/s (default: %(default)s)")
    ap.add_argument("--model", default=os.path.join("models", "iris.npz"))
    ap.add_argument("--json", help="write the results here (default: runs/bench-replay-<stamp>.json)")
    a = ap.parse_args(argv)
    from control_node.bench.common import LOCK_FILE, machine_info, print_table, write_json
    from control_node.bench.harness import CHILD_CWD, NodeProcess, child_env, make_endpoint_dir, write_node_config
    lock = open(LOCK_FILE, "a")
    print(f"waiting for {LOCK_FILE} ...", flush=True)
    fcntl.flock(lock, fcntl.LOCK_EX)
    ep = make_endpoint_dir()
    results = {}
    try:
        cfg = os.path.join(ep, "node.toml")
        eps = write_node_config(cfg, ep)
        node = NodeProcess(cfg, os.path.abspath(a.model), "--run-dir", os.path.join(ep, "run"), "--clock", a.clock)
        try:
            results["node"] = _measure(eps, a.frames)
        finally:
            node.stop()
        echo = subprocess.Popen([sys.executable, "-m", "control_node.bench.peers.echo", eps["sensor"], eps["action"], "3600",
                                 "--rt"], cwd=CHILD_CWD, env=child_env(), stdout=subprocess.PIPE, text=True)
        try:
            assert echo.stdout.readline().startswith("ready")
            results["echo"] = _measure(eps, a.frames)
        finally:
            echo.terminate()
            echo.wait(5)
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        shutil.rmtree(ep, ignore_errors=True)
    ratio = results["node"]["frames_per_s"] / results["echo"]["frames_per_s"]
    rows = []
    for name, r in (("node (control-node run, --clock " + a.clock + ")", results["node"]),
                    ("bare pyzmq msgpack echo", results["echo"])):
        rt = r["round_trip_ns"]
        rows.append([name, f"{r['frames_per_s']:,.0f}", f"{r['answered']}/{r['frames']}",
                     f"{rt['p50'] / 1e3:.1f}", f"{rt['p99'] / 1e3:.1f}", f"{rt['max'] / 1e3:.1f}"])
    print_table(f"lockstep replay over ipc, {a.frames} frames",
                ["peer", "frames/s", "answered", "rtt p50 us", "rtt p99 us", "rtt max us"], rows)
    print(f"node / echo throughput ratio: {ratio:.2f}")
    out = a.json or os.path.join("runs", time.strftime("bench-replay-%Y%m%d-%H%M%S.json"))
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    write_json(out, {"bench": "replay", "settings": vars(a), "machine": machine_info(), "results": results,
                     "ratio_node_over_echo": ratio})
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
