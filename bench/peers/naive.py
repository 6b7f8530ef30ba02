"""The loop a user would write first: time.sleep to the next tick, drain pyzmq, msgpack, numpy MLP, send.

python -m bench.peers.naive MODEL SENSOR_EP ACTION_EP SECONDS OUT.npz
Writes its wake-up latencies (ns) to OUT.npz. No real-time set-up at all.
"""
import sys
import time

import msgpack
import numpy as np
import zmq

from control_node.kernels.model_file import load_model


def main():
    model, sensor, action, seconds, out = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
    spec = load_model(model)
    (W1, b1), (W2, b2) = spec.layers
    ctx = zmq.Context.instance()
    sub, pub = ctx.socket(zmq.SUB), ctx.socket(zmq.PUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.bind(sensor)
    pub.bind(action)
    print("ready", flush=True)
    period = 1e-3
    lat = []
    t_next = time.monotonic() + period
    end = t_next + seconds
    cycle = 0
    frame = None
    while t_next < end:
        d = t_next - time.monotonic()
        if d > 0:
            time.sleep(d)
        lat.append(time.monotonic() - t_next)
        while True:
            try:
                frame = msgpack.unpackb(sub.recv(zmq.NOBLOCK))
            except zmq.Again:
                break
        if frame is not None:
            x = (np.array(frame["x"]) - spec.mean) / spec.scale
            a = int(np.argmax(np.maximum(0, x @ W1 + b1) @ W2 + b2))
            pub.send(msgpack.packb({"seq": frame["seq"], "t_ns": frame["t_ns"], "cycle": cycle, "action": a,
                                    "safe": False}))
            frame = None
        cycle += 1
        t_next += period
    np.savez(out, wake_latency_ns=(np.array(lat) * 1e9).astype(np.int64))


if __name__ == "__main__":
    main()
