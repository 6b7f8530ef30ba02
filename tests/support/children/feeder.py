"""Frames for the in-process loop tests (nodeutil.FedSockets, start_feeder): python feeder.py ENDPOINT SECONDS X_JSON.
Sends {"seq", "t_ns", "x"} with the same X every ~100 us (about 10 kHz) until SECONDS have passed."""
import json
import sys
import time

import msgpack
import zmq

pub = zmq.Context().socket(zmq.PUB)
pub.connect(sys.argv[1])
end = time.monotonic() + float(sys.argv[2])
x = [float(v) for v in json.loads(sys.argv[3])]
seq = 0
while time.monotonic() < end:
    seq += 1
    pub.send(msgpack.packb({"seq": seq, "t_ns": time.monotonic_ns(), "x": x}))
    time.sleep(0.0001)
