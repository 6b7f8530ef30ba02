"""A periodic sender for the phase-lock process test: python phase_sender.py ENDPOINT PERIOD_NS SECONDS PHASE_NS.

The sender's frames are due on its own absolute schedule (period, phase); each is stamped when sent. It sleeps
(50-80 us late at most), never spins: a spinning sender on a 2-CPU machine keeps the node's ZeroMQ I/O thread
(which runs off the loop's core) from delivering its frames for most of a period.
"""
import os, sys, time, msgpack
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))     # tests/support
from nodeutil import subscribed_publisher
endpoint, period_ns, duration, phase_ns = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
pub = subscribed_publisher(endpoint, linger_ms=1000)     # the node has subscribed: no frame is lost to the join
t0 = time.monotonic_ns() + phase_ns
n = 0
end = t0 + int(duration * 1e9)
while True:
    due = t0 + int(n * period_ns)
    if due >= end:
        break
    dt = due - time.monotonic_ns()
    if dt > 0:
        time.sleep(dt / 1e9)        # no busy wait: on 2 CPUs it would starve the node's ZeroMQ I/O thread
    n += 1
    pub.send(msgpack.packb({"seq": n, "t_ns": time.monotonic_ns(), "x": [5.1, 3.5, 1.4, 0.2]}))
pub.close(linger=1000)
print(n)
