"""A legged node at 1 kHz with a 50 Hz policy fed through ROS 2 (issue 45): a real rclpy robot peer publishes JointState (by name, in an
order of its own, with a joint the recipe does not use), Imu and Twist; `control-node bridge ros2` builds the
node's frame of raw signals from the config's [legged] recipe alone ([ros2.legged]: nothing written twice);
the node runs the recipe, the policy and the PD, and every torque the peer receives equals the numpy
reference of the whole deploy path (legged.DeployReference) for what the peer published.

Every ROS 2 process runs in a private network namespace holding only ``lo`` with a private ROS_DOMAIN_ID
(tests/test_ros2_bridge.py's fixtures)."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("rclpy", reason="rclpy is missing: pip install -e '.[ros2]' (the ROS 2 wheels)")

from support.nodeutil import load_run, start_node  # noqa: E402
from test_ros2_bridge import netns, peer_result, run_peer, start_bridge, stop_bridge  # noqa: E402,F401
from control_node.config import section_toml  # noqa: E402
from control_node.kernels import ModelSpec, save_model  # noqa: E402
from control_node.loop import legged as L  # noqa: E402

POLICY = ["hip", "thigh", "knee"]
ROBOT = ["knee", "hip", "thigh"]
RECIPE = {"joints": {"policy": POLICY, "robot": ROBOT}, "default_pos": [0.0, 0.7, -1.4], "policy_dt": 0.02,
          "observation": {"terms": [{"kind": "gyro", "scale": 0.25}, {"kind": "projected_gravity"},
                                    {"kind": "command"}, {"kind": "joint_pos_rel"}, {"kind": "joint_vel", "scale": 0.05},
                                    {"kind": "last_action"}],
                          "quat_order": "xyzw", "n_commands": 3},
          "action": {"scale": 0.25},
          "actuator": {"kp": 20.0, "kd": 0.5, "tau_max": 100.0},
          "modes": {"policy_without_stand": True}}


def _frame_msgs(rng, k):
    """The k-th robot state: JointState in the peer's own order (plus an unused joint), Imu, Twist."""
    q = {"hip": 0.1 * rng.normal(), "thigh": 0.7 + 0.1 * rng.normal(), "knee": -1.4 + 0.1 * rng.normal()}
    qd = {j: rng.normal() for j in POLICY}
    quat = rng.normal(0, 0.05, 4) + [0, 0, 0, 1.0]
    quat /= np.linalg.norm(quat)
    gyro, acc = rng.normal(0, 0.3, 3), rng.normal(0, 1, 3) + [0, 0, 9.81]
    cmd = [0.4, 0.05 * k % 0.2, -0.1]
    names = ["thigh", "wheel", "knee", "hip"]
    js = {"publish": "/joint_states", "type": "sensor_msgs/msg/JointState",
          "msg": {"name": names, "position": [q.get(n, 3.0) for n in names],
                  "velocity": [qd.get(n, 9.0) for n in names]}}
    imu = {"publish": "/imu/data", "type": "sensor_msgs/msg/Imu", "expect": "none", "timeout_s": 0.05,
           "msg": {"orientation": dict(zip("xyzw", quat.tolist())),
                   "angular_velocity": dict(zip("xyz", gyro.tolist())),
                   "linear_acceleration": dict(zip("xyz", acc.tolist()))}}
    tw = {"publish": "/cmd_vel", "type": "geometry_msgs/msg/Twist", "expect": "none", "timeout_s": 0.05,
          "msg": {"linear": {"x": cmd[0], "y": cmd[1]}, "angular": {"z": cmd[2]}}}
    frame = np.r_[[q[j] for j in ROBOT], [qd[j] for j in ROBOT], quat, gyro, acc, cmd]
    return imu, tw, js, frame


@pytest.mark.slow
def test_a_legged_node_through_the_ros2_bridge_publishes_the_reference_torques(netns, tmp_path):  # noqa: F811
    # the node's actuator: its period (1 / rate_hz) and its stale limit ([watchdog] stale_after_ms) are the node's
    op, ap = L.build_plans({**RECIPE, "actuator": {**RECIPE["actuator"], "period": 0.001, "stale_after": 20.0}})
    rng = np.random.default_rng(21)
    W = rng.normal(0, 0.3, (op.out_width, 3))
    spec = ModelSpec(layers=[(W, np.zeros(3))], mean=0.0, scale=1.0, classes=[], head="continuous",
                     feature_names=[f"o{i}" for i in range(op.out_width)], activations=["identity"],
                     action_names=POLICY)
    model = tmp_path / "legged.npz"
    save_model(spec, model)
    extra = ("[loop]\nrate_hz = 1000.0\npolicy_rate_hz = 50.0\n[watchdog]\nstale_after_ms = 20000\n"
             + section_toml("legged", {**RECIPE, "output": "torque", "sequence": [[0.0, "policy"]]})
             + "[ros2]\ntrigger = \"/joint_states\"\nmax_age_ms = 5000\n[ros2.legged]\n"
             + "[ros2.action]\ntopic = \"/cmd\"\ntype = \"std_msgs/msg/Float64MultiArray\"\n")
    node, cfg = start_node(tmp_path, str(model), extra=extra)
    bridge = start_bridge(netns, cfg, model, tmp_path / "bridge")
    msgs = [_frame_msgs(rng, k) for k in range(16)]
    hs = msgs[0]
    steps = [{"until_command": [hs[0], hs[1], hs[2]], "gap_s": 0.05, "every_s": 0.3, "timeout_s": 30,
              "settle_s": 0.3}]
    for imu, tw, js, _ in msgs[1:]:
        steps += [imu, tw, js]
    # a mode asked on the bridge's mode topic goes to the node's control endpoint, taken at the loop's next cycle;
    # the next frame's command is damping's
    last = _frame_msgs(rng, len(msgs))
    msgs.append(last)
    steps += [{"publish": "/control_node/mode", "type": "std_msgs/msg/String", "msg": {"data": "damping"},
               "expect": "none", "timeout_s": 0.3}, last[0], last[1], last[2]]
    peer, out = run_peer(netns, tmp_path, steps)
    res = peer_result(peer, out)
    br, bout = stop_bridge(bridge, tmp_path / "bridge")
    rc, nout, nerr, run_dir = node.stop()
    assert rc == 0, nerr
    summary, arrays = load_run(run_dir)
    n_hs = summary["frames_valid"] - (len(msgs) - 1)           # the handshake's frames (all of msgs[0])
    assert n_hs >= 1 and br["frames_sent"] == summary["frames_valid"], (n_hs, br, summary["frames_valid"])
    # replay on the node's record (1 kHz, the policy at 50 Hz): the frames in the order the node took them
    ref = L.DeployReference(op, ap, spec, "torque", [(0, "policy")])
    seqs, flags = arrays["seq"].astype(np.int64), arrays["flags"]
    t = arrays["t_tick_ns"] + arrays["wake_latency_ns"]
    damp = summary["legged"]["transitions"][-1]["cycle"]
    order, first_cycle, want = sorted({int(x) for x, f in zip(seqs, flags) if not f & 32}), {}, {}
    for i, c in enumerate(arrays["cycle"].tolist()):
        s = int(seqs[i])
        frame = None
        if not flags[i] & 32 and s not in first_cycle:
            first_cycle[s] = c
            k = order.index(s) - n_hs + 1           # the handshake's frames are msgs[0]
            frame = msgs[max(k, 0)][3]
        want[c] = ref.cycle(c, int(t[i]), frame, bool(flags[i] & 64), request="damping" if c == damp else None)[0]
    st = res["steps"]
    assert first_cycle[order[-2]] < damp <= first_cycle[order[-1]]     # asked between the last two frames
    for k in range(1, len(msgs)):
        got = st[3 * k + (1 if k == len(msgs) - 1 else 0)]["commands"]    # frame k's JointState step
        assert len(got) == 1, (k, st[3 * k])
        # the bridge publishes a command once per frame: the one of the cycle that took it
        c_k = first_cycle[order[n_hs + k - 1]]
        np.testing.assert_allclose(got[0], want[c_k], rtol=1e-9, atol=1e-9, err_msg=f"frame {k} (cycle {c_k})")
    tr = [(t["from"], t["to"], t["reason"]) for t in summary["legged"]["transitions"]]
    assert tr == [("passive", "policy", "request"), ("policy", "damping", "request")], (tr, bout)
    assert br["mode_requests"] == {"ok": 1}, br["mode_requests"]
    assert br["frames_withheld"] == {} or set(br["frames_withheld"]) <= {"never_received"}, br["frames_withheld"]
    print(json.dumps({"frames": summary["frames_valid"], "handshake": n_hs}))
