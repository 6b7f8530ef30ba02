"""A real rclpy process standing in for a robot: publishes scripted messages, records the commands it gets.

    python ros2_peer.py SCRIPT.json OUT.json

SCRIPT: {"command_topic": "/cmd", "steps": [...]}; each step one of
  {"publish": "/joint_states", "type": "sensor_msgs/msg/JointState", "msg": {"name": [...], "position": [...]},
   "expect": "command" | "none", "timeout_s": 2.0}
  {"sleep_s": 0.4}
  {"wait_file": "PATH", "timeout_s": 30}      (another process's go-ahead, e.g. after a restart)
  {"until_command": [publish steps], "every_s": 0.05, "timeout_s": 20}   (republish until a command comes)
Before the first step it waits until every topic it publishes has a subscriber and the command topic a
publisher (DDS discovery), so no scripted message is lost to it.
"expect": "command" waits for the next command (lockstep); "none" waits timeout_s and records any that came.
OUT.progress holds the number of steps done so far.
OUT: {"steps": [{"i": k, "commands": [[...data...], ...], "waited_s": ...}, ...]}. Floats as JSON (NaN allowed).
Run it in a private network namespace with ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST and a private ROS_DOMAIN_ID.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import time


def msg_class(type_name):
    pkg, _, name = type_name.split("/")
    return getattr(importlib.import_module(f"{pkg}.msg"), name)


def fill(msg, values):
    for k, v in values.items():
        if isinstance(v, dict):
            fill(getattr(msg, k), v)
        else:
            setattr(msg, k, v)
    return msg


def main(script_path, out_path):
    import rclpy
    from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
    from std_msgs.msg import Float64MultiArray
    with open(script_path) as f:
        script = json.load(f)
    rclpy.init()
    node = rclpy.create_node("test_peer")
    got, cv = [], threading.Condition()

    def on_command(m):
        with cv:
            got.append([float(v) for v in m.data])
            cv.notify_all()

    node.create_subscription(Float64MultiArray, script.get("command_topic", "/cmd"), on_command,
                             QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
    pubs = {}

    def publish(step):
        pubs[step["publish"]].publish(fill(msg_class(step["type"])(), step.get("msg", {})))

    def each(step):                      # a step's messages: one publish step, or an until_command's list
        inner = step.get("until_command")
        return [step] if "publish" in step else (inner if isinstance(inner, list) else [inner] if inner else [])

    for step in script["steps"]:         # every publisher exists before the first step
        for m in each(step):
            if m["publish"] not in pubs:
                pubs[m["publish"]] = node.create_publisher(msg_class(m["type"]), m["publish"], qos_profile_sensor_data)

    stop = threading.Event()

    def spin():
        while not stop.is_set() and rclpy.ok():
            rclpy.spin_once(node, timeout_sec=0.02)

    th = threading.Thread(target=spin, daemon=True)
    th.start()
    # DDS discovery: publish nothing before every topic has its subscriber (the bridge) and the command
    # topic its publisher, so no scripted message is lost to discovery
    t0 = time.monotonic()
    while time.monotonic() - t0 < script.get("discovery_timeout_s", 30.0):
        if (all(p.get_subscription_count() > 0 for p in pubs.values())
                and node.count_publishers(script.get("command_topic", "/cmd")) > 0):
            break
        time.sleep(0.02)
    else:
        print("peer: discovery timed out", file=sys.stderr)
    time.sleep(0.1)
    out = []
    for i, step in enumerate(script["steps"]):
        t0 = time.monotonic()
        with cv:
            n0 = len(got)
        rec = {"i": i}
        if "sleep_s" in step:
            time.sleep(step["sleep_s"])
        elif "wait_file" in step:
            while not os.path.exists(step["wait_file"]) and time.monotonic() - t0 < step.get("timeout_s", 30):
                time.sleep(0.05)
            rec["found"] = os.path.exists(step["wait_file"])
        elif "until_command" in step:
            every, timeout = step.get("every_s", 0.05), step.get("timeout_s", 20.0)
            while time.monotonic() - t0 < timeout:
                for m in each(step):
                    publish(m)
                    time.sleep(step.get("gap_s", 0.0))   # rclpy serves ready topics in creation order
                with cv:
                    if cv.wait_for(lambda: len(got) > n0, every):
                        break
            time.sleep(step.get("settle_s", 0.2))     # answers to the last publishes still on their way
        else:
            publish(step)
            timeout = step.get("timeout_s", 2.0)
            with cv:
                if step.get("expect", "command") == "command":
                    cv.wait_for(lambda: len(got) > n0, timeout)
                else:
                    cv.wait_for(lambda: False, timeout)
        with cv:
            rec["commands"] = got[n0:]
        rec["waited_s"] = time.monotonic() - t0
        out.append(rec)
        with open(out_path + ".progress", "w") as f:     # steps done, for a test that acts between steps
            f.write(str(i + 1))
    stop.set()
    th.join(2.0)
    with open(out_path, "w") as f:
        json.dump({"steps": out, "all_commands": got}, f)
    node.destroy_node()
    rclpy.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
