"""A separate publisher of valid frames at a fixed rate (nodeutil.start_flood):
python flood.py ENDPOINT RATE_HZ SECONDS SEQ0 XS_JSON. Frames seq0, seq0+1, ...; x cycles through XS; its last
stdout line is a JSON report (sent, send_dropped, first_seq, last_seq, elapsed_s)."""
import json, os, sys, time
import msgpack, numpy as np, zmq
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))     # tests/support
from nodeutil import subscribed_publisher
endpoint, rate, duration, seq0 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
xs = [list(map(float, r)) for r in np.asarray(json.loads(sys.argv[5]))]
# the node's subscription has arrived before the first frame (a fixed 0.3 s sleep lost the first frames
# whenever a loaded host took longer to join)
pub = subscribed_publisher(endpoint, sndhwm=100000, linger_ms=1000)
period = 1.0 / rate
t0 = time.monotonic()
n = 0
dropped = 0
while True:
    now = time.monotonic()
    if now - t0 >= duration:
        break
    due = int((now - t0) / period) + 1           # frames that should have been sent by now
    while n < due:
        seq = seq0 + n
        try:
            pub.send(msgpack.packb({"seq": seq, "t_ns": time.monotonic_ns(), "x": xs[seq % len(xs)]}), zmq.NOBLOCK)
        except zmq.Again:
            dropped += 1
        n += 1
elapsed = time.monotonic() - t0
pub.close(linger=1000)
print(json.dumps({"sent": n, "send_dropped": dropped, "first_seq": seq0, "last_seq": seq0 + n - 1,
                  "elapsed_s": elapsed}), flush=True)
