"""The design alternative: the same cycle written as a Python loop calling the compiled kernel.

python -m bench.peers.pyloop MODEL SENSOR_EP ACTION_EP SECONDS OUT.npz
Same real-time set-up as the node (pinned, SCHED_FIFO, mlockall, gc frozen, cpu_dma_latency 0),
same sleep-then-spin wait, pyzmq + msgpack for I/O, Policy.predict_bound for inference.
Writes wake-up latency and cycle time, and the Python memory its last 1000 cycles allocated.
"""
import sys
import time
import tracemalloc

import msgpack
import numpy as np
import zmq

from control_node.config import defaults
from control_node.loop.realtime import setup_realtime
from control_node.kernels import Policy


def main():
    model, sensor, action, seconds, out = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
    policy = Policy.load(model)
    x = np.zeros(policy.n_features)
    policy.bind_input(x)
    ctx = zmq.Context.instance()
    sub, pub = ctx.socket(zmq.SUB), ctx.socket(zmq.PUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.bind(sensor)
    pub.bind(action)
    n = int(seconds * 1000)
    wake = np.zeros(n, np.int64)
    cycle_time = np.zeros(n, np.int64)
    packer = msgpack.Packer()
    setup_realtime(defaults()["realtime"])
    print("ready", flush=True)
    mono = time.monotonic_ns
    period, spin = 1_000_000, 150_000
    t0 = mono() + period
    traced_from = max(0, n - 1000)     # tracemalloc slows every allocation: only the last 1000 cycles
    last = None
    for k in range(n):
        if k == traced_from:
            tracemalloc.start()
            blocks = tracemalloc.get_traced_memory()
        tick = t0 + k * period
        d = tick - spin - mono()
        if d > 0:
            time.sleep(d / 1e9)
        t = mono()
        while t < tick:
            t = mono()
        wake[k] = t - tick
        while True:
            try:
                last = msgpack.unpackb(sub.recv(zmq.NOBLOCK))
            except zmq.Again:
                break
        if last is not None:
            x[:] = last["x"]
            a = policy.predict_bound()
            pub.send(packer.pack({"seq": last["seq"], "t_ns": last["t_ns"], "cycle": k, "action": a, "safe": False}))
            last = None
        cycle_time[k] = mono() - t
    peak = tracemalloc.get_traced_memory()[1] - blocks[0]
    tracemalloc.stop()
    np.savez(out, wake_latency_ns=wake[:traced_from], cycle_time_ns=cycle_time[:traced_from], traced_peak_bytes=peak)


if __name__ == "__main__":
    main()
