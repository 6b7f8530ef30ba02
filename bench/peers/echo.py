"""A bare pyzmq + msgpack echo bound like the node (SUB in, PUB out): the floor for a round trip.

python -m bench.peers.echo SENSOR_EP ACTION_EP SECONDS [--rt]
With --rt it gets the node's real-time set-up (same core, SCHED_FIFO, mlock), so the
comparison with the node differs only in what happens between receive and send.
"""
import sys
import time

import msgpack
import zmq


def main():
    sensor, action, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    ctx = zmq.Context.instance()
    sub, pub = ctx.socket(zmq.SUB), ctx.socket(zmq.PUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.bind(sensor)
    pub.bind(action)
    if "--rt" in sys.argv:
        from control_node.config import defaults
        from control_node.loop.realtime import setup_realtime
        setup_realtime(defaults()["realtime"])
    print("ready", flush=True)
    end = time.monotonic() + seconds
    packer = msgpack.Packer()
    cycle = 0
    while time.monotonic() < end:
        if not sub.poll(100):
            continue
        f = msgpack.unpackb(sub.recv())
        pub.send(packer.pack({"seq": f["seq"], "t_ns": f["t_ns"], "cycle": cycle, "action": 0, "safe": False}))
        cycle += 1


if __name__ == "__main__":
    main()
