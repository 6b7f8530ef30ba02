"""ROS 2 peers for `control-node bench bridge` (real rclpy processes; run them in a private network namespace).

    python -m control_node.bench.peers.ros2 echo [events]
        a plain rclpy echo node (rclpy.spin's default executor, or the EventsExecutor the bridge uses): JointState on /joint_states in, Float64MultiArray [position...] out on
        /pendulum_controller/commands, from the subscription callback (the floor a bridge is compared with)
    python -m control_node.bench.peers.ros2 ping N RATE_HZ OUT.npz
        ping-pong: publish a JointState (joint "theta"), wait for the next command, record the round trip
        (CLOCK_MONOTONIC, publish to callback), then the next at the next 1/RATE slot; N pings after a
        discovery handshake and 200 warm-up pings. OUT holds rtt_ns (-1: no command within 100 ms).
"""
from __future__ import annotations

import math
import sys
import threading
import time

import numpy as np

STATE, COMMAND = "/joint_states", "/pendulum_controller/commands"


def _qos():
    from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
    return qos_profile_sensor_data, QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)


def echo(executor="default"):
    import rclpy
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray
    rclpy.init()
    node = rclpy.create_node("bench_echo")
    sensor, reliable = _qos()
    pub = node.create_publisher(Float64MultiArray, COMMAND, reliable)

    def cb(m):
        out = Float64MultiArray()
        out.data = [float(v) for v in m.position]
        pub.publish(out)

    node.create_subscription(JointState, STATE, cb, sensor)
    print("ready echo", flush=True)
    if executor == "events":
        from rclpy.experimental import EventsExecutor
        ex = EventsExecutor()
    else:
        from rclpy.executors import SingleThreadedExecutor
        ex = SingleThreadedExecutor()
    ex.add_node(node)
    try:
        while rclpy.ok():                 # as the bridge spins
            ex.spin_once(timeout_sec=0.05)
    except KeyboardInterrupt:
        pass


def ping(n, rate_hz, out_path):
    import rclpy
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray
    rclpy.init()
    node = rclpy.create_node("bench_ping")
    sensor, reliable = _qos()
    pub = node.create_publisher(JointState, STATE, sensor)
    cv = threading.Condition()
    got = [0, 0]                                  # commands received, arrival ns of the last

    def cb(_m):
        t = time.monotonic_ns()
        with cv:
            got[0] += 1
            got[1] = t
            cv.notify_all()

    node.create_subscription(Float64MultiArray, COMMAND, cb, reliable)
    stop = threading.Event()
    th = threading.Thread(target=lambda: [rclpy.spin_once(node, timeout_sec=0.02) for _ in iter(stop.is_set, True)],
                          daemon=True)
    th.start()
    msg = JointState()
    msg.name = ["theta"]

    def one(k, timeout=0.1):
        msg.position = [math.pi * math.sin(k * 0.01)]
        msg.velocity = [0.0]
        msg.effort = [0.0]
        with cv:
            n0 = got[0]
        t0 = time.monotonic_ns()
        pub.publish(msg)
        with cv:
            if not cv.wait_for(lambda: got[0] > n0, timeout):
                return -1
            return got[1] - t0

    deadline = time.monotonic() + 30
    while one(0, 0.2) < 0:
        if time.monotonic() > deadline:
            raise SystemExit("ping: no command within 30 s (is the bridge or echo running?)")
    period = 1e9 / rate_hz
    rtt = np.full(n + 200, -1, dtype=np.int64)
    t_next = time.monotonic_ns()
    for k in range(n + 200):
        t_next += period
        rtt[k] = one(k)
        left = t_next - time.monotonic_ns()
        if left > 0:
            time.sleep(left / 1e9)
        else:
            t_next = time.monotonic_ns()
    stop.set()
    th.join(1.0)
    np.savez(out_path, rtt_ns=rtt[200:])
    print(f"ping done: {int((rtt[200:] >= 0).sum())} of {n} answered", flush=True)
    node.destroy_node()
    rclpy.shutdown()


if __name__ == "__main__":
    if sys.argv[1] == "echo":
        echo(*sys.argv[2:3])
    else:
        ping(int(sys.argv[2]), float(sys.argv[3]), sys.argv[4])
