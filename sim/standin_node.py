"""STAND-IN for `control-node run`, for developing the simulator/recorder/launch before the real node
existed. Not the node: sensor-clock echo only (one action per valid frame), no real-time features.
Used by the tests only when CONTROL_NODE_STANDIN=1. Same CLI contract as the real node.
"""
import argparse
import json
import os
import signal
import sys
import time


def main(argv=None):
    p = argparse.ArgumentParser(prog="standin-node")
    p.add_argument("--config")
    p.add_argument("--model", default="models/iris.npz")
    p.add_argument("--duration", type=float)
    p.add_argument("--rate", type=float)
    p.add_argument("--clock")
    p.add_argument("--run-dir")
    a = p.parse_args(argv)
    import msgpack
    import numpy as np
    import zmq

    from kernels import Policy
    from sim.endpoints import ensure_ipc_dir, load_endpoints
    eps = load_endpoints(a.config)
    pol = Policy.load(a.model)
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    pa = ctx.socket(zmq.PUB)
    pd = ctx.socket(zmq.PUB)
    for sock, k in ((s, "sensor"), (pa, "action"), (pd, "diagnostics")):
        ensure_ipc_dir(eps[k])
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(eps[k])
    stop = [False]
    signal.signal(signal.SIGINT, lambda *_: stop.__setitem__(0, True))
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    print(f"ready sensor={eps['sensor']} action={eps['action']} diagnostics={eps['diagnostics']}", flush=True)
    t_end = None if a.duration is None else time.monotonic() + a.duration
    cycle = 0
    last = -1
    t_valid = 0.0
    last_diag = time.monotonic()
    while not stop[0] and (t_end is None or time.monotonic() < t_end):
        if s.poll(10):
            d = msgpack.unpackb(s.recv())
            if d["seq"] <= last and time.monotonic() - t_valid < 0.2:  # watchdog, like stale_after
                continue
            last = d["seq"]
            t_valid = time.monotonic()
            act = int(pol.predict_batch(np.asarray([d["x"]], dtype=np.float64))[0])
            pa.send(msgpack.packb({"seq": d["seq"], "t_ns": d["t_ns"], "cycle": cycle, "action": act,
                                   "safe": False}))
            cycle += 1
        if time.monotonic() - last_diag > 0.1:
            last_diag = time.monotonic()
            pd.send(msgpack.packb({"t_ns": time.monotonic_ns(), "cycles": cycle, "deadline_misses": 0}))
    for sock in (s, pa, pd):
        sock.close()
    run_dir = a.run_dir or os.path.join("runs", f"standin-{os.getpid()}")
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump({"role": "node", "standin": True, "cycles": cycle, "deadline_misses": 0,
                   "wake_latency_ns": {"p50": 0, "p99": 0, "max": 0}}, f)
    print(f"run directory: {run_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
