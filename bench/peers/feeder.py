"""Publish frames at a fixed rate to a sensor endpoint: python -m bench.peers.feeder EP RATE SECONDS [N].

Iris-like 4-feature frames, or N features (a pattern that changes with seq, so a policy's answers do)."""
import sys
import time

import msgpack
import zmq


def main():
    ep, rate, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.connect(ep)
    packer = msgpack.Packer()
    period = 1.0 / rate
    t = time.monotonic()
    end = t + seconds
    seq = 0
    while t < end:
        t += period
        d = t - time.monotonic()
        if d > 0:
            time.sleep(d)
        seq += 1
        x = [5.1, 3.5, 1.4, 0.2] if n == 0 else [((seq * 7 + 3 * i) % 17) / 8.0 - 1.0 for i in range(n)]
        pub.send(packer.pack({"seq": seq, "t_ns": time.monotonic_ns(), "x": x}))


if __name__ == "__main__":
    main()
