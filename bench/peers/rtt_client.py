"""Round-trip client: one frame per millisecond, wait for the action with that seq, record send -> receive.

python -m bench.peers.rtt_client SENSOR_EP ACTION_EP N OUT.npy
"""
import sys
import time

import msgpack
import numpy as np
import zmq


def main():
    sensor, action, n, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    ctx = zmq.Context.instance()
    pub, sub = ctx.socket(zmq.PUB), ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    pub.connect(sensor)
    sub.connect(action)
    packer = msgpack.Packer()
    x = [5.1, 3.5, 1.4, 0.2]
    seq = 0
    # slow joiner: until one frame is answered (reading everything, safe actions included)
    answered = False
    while not answered:
        seq += 1
        pub.send(packer.pack({"seq": seq, "t_ns": time.monotonic_ns(), "x": x}))
        end = time.monotonic() + 0.1
        while not answered and sub.poll(max(1, int((end - time.monotonic()) * 1000))):
            answered = msgpack.unpackb(sub.recv())["seq"] == seq
    end = time.monotonic() + 0.05      # drop what is queued (a watchdog may keep publishing)
    while time.monotonic() < end and sub.poll(10):
        sub.recv()
    rtt = np.full(n, -1, dtype=np.int64)
    t_next = time.monotonic() + 0.001
    for i in range(n):
        d = t_next - time.monotonic()
        if d > 0:
            time.sleep(d)
        t_next += 0.001
        seq += 1
        t0 = time.monotonic_ns()
        pub.send(packer.pack({"seq": seq, "t_ns": t0, "x": x}))
        while sub.poll(100):
            a = msgpack.unpackb(sub.recv())
            if a["seq"] == seq:
                rtt[i] = time.monotonic_ns() - t0
                break
    np.save(out, rtt)


if __name__ == "__main__":
    main()
