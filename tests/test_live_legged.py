"""The live view of a legged node (issue #46), with real parts: a legged node process (torque output at 1 kHz,
a 50 Hz policy, stand -> policy by its sequence), a stand-in robot sending frames in lockstep over ZeroMQ and
publishing each on the sensor tap as a robot or the simulator does, `control-node live` serving them over
the Foxglove WebSocket, the Node.js viewer of tests/foxglove_client (@foxglove/ws-protocol) subscribed to every
channel, and `control-node record` beside it whose recording `control-node export` turns into the same channels.

Three joint orders differ (the policy's FL FR RL RR, the robot's FR FL RR RL, the actuators' RL RR FR FL, each
leg's joints reversed): a joint's position and velocity must equal the frame's value for that joint NAME, and its
torque the node's published command for that actuator. The frames carry known tilts (roll, pitch, yaw) as a
quaternion in ROS's x y z w order: the base's roll/pitch/yaw must be those angles, its projected gravity the
node's own (legged.projected_gravity), and the FrameTransform the normalised quaternion."""
from __future__ import annotations

import json
import math
import time

import msgpack
import numpy as np
import pytest
import zmq

from support.nodeutil import ActionCollector, Robot, cli_popen, start_node
from test_foxglove import finish, needs_client, needs_sdk, viewer, wait_for_line
from test_legged_cycle import QUAD, QUAD_ROBOT, frames, isaaclab_quadruped, mlp
from control_node.bench.harness import free_tcp_ports, run_cli
from control_node.config import client_endpoints, section_toml
from control_node.kernels import save_model
from control_node.live import channels as ch
from control_node.loop import legged as L

EVERY = 5
# the actuators' order: neither the policy's nor the robot's (legs and each leg's joints reversed)
ACTUATORS = [f"{leg}_{p}_joint" for leg in ("RL", "RR", "FR", "FL") for p in ("calf", "thigh", "hip")]
LOOP = "[loop]\nrate_hz = 1000.0\npolicy_rate_hz = 50.0\n[watchdog]\nstale_after_ms = 1000.0\n"


def recipe():
    r = isaaclab_quadruped(history=1, quat="xyzw")
    r["actuator"] = {k: v for k, v in r["actuator"].items() if k not in ("period", "stale_after")}
    r["joints"]["actuators"] = ACTUATORS
    return r


def qmul(a, b):
    """Hamilton product of two (w, x, y, z) quaternions."""
    w1, x1, y1, z1 = a
    w2, x2, y2, z2 = b
    return (w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2, w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
            w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2, w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2)


def tilt(k):
    """Frame k's (roll, pitch, yaw) in degrees and its body -> world quaternion R = Rz(yaw) Ry(pitch) Rx(roll)
    (w, x, y, z), built from the three axis rotations, not from the converter's formula."""
    rpy = (25.0 * math.sin(k / 150.0), -15.0 * math.cos(k / 210.0), 40.0 * math.sin(k / 330.0))
    r, p, y = (math.radians(a) / 2 for a in rpy)
    q = qmul(qmul((math.cos(y), 0, 0, math.sin(y)), (math.cos(p), 0, math.sin(p), 0)), (math.cos(r), math.sin(r), 0, 0))
    return rpy, q


@pytest.fixture(scope="module")
def legged_model(tmp_path_factory):
    op, _ = L.build_plans(recipe())
    spec = mlp(op.out_width, 12, seed=21)
    path = tmp_path_factory.mktemp("live_legged") / "quad.npz"
    save_model(spec, path)
    return str(path), op


def check_joint_states(msgs, sent, actions_by_cycle, first_cycle_of):
    """Each joint state: the frame's position and velocity by the robot's joint names, the node's command for
    the cycle it names by the actuators' names, of the frame it answered. Returns how many were in policy."""
    in_policy = 0
    for m in msgs:
        assert m["seq"] % EVERY == 0 and m["output"] == "torque", m
        x = sent[m["seq"]]
        assert list(m["joints"]) == QUAD_ROBOT, list(m["joints"])
        for i, name in enumerate(QUAD_ROBOT):
            assert (m["joints"][name]["position"], m["joints"][name]["velocity"]) == (x[i], x[12 + i]), (name, m)
        a = actions_by_cycle.get(m["cycle"])
        if a is None:               # a command the test's own subscriber missed (ZeroMQ's slow joiner)
            continue
        assert a["seq"] == m["seq"] and m["cycle"] == first_cycle_of[m["seq"]], (m["cycle"], a["seq"], m["seq"])
        assert {n: m["joints"][n]["torque"] for n in ACTUATORS} == dict(zip(ACTUATORS, a["u"])), m
        in_policy += not a["safe"] and any(a["u"])
    return in_policy


def check_base(msgs, tfs, sent, op):
    """``msgs``: [(log time, base message)]; ``tfs``: [(log time, FrameTransform)], each matched to its frame
    by the log time it shares with that frame's base message."""
    lay = {s: (o, w) for s, o, w in L.frame_layout(op)}
    seq_at = {lt: m["seq"] for lt, m in msgs}
    for _, m in msgs:
        x = sent[m["seq"]]
        rpy, q = tilt(m["seq"])
        assert m["quat_order"] == "xyzw"
        got = (m["rpy_deg"]["roll"], m["rpy_deg"]["pitch"], m["rpy_deg"]["yaw"])
        np.testing.assert_allclose(got, rpy, rtol=0, atol=1e-9, err_msg=str(m))
        np.testing.assert_allclose([m["orientation"][k] for k in "wxyz"], q, rtol=0, atol=1e-12)
        oq = lay["imu_quat"][0]
        g = L.projected_gravity(x[oq:oq + 4], "xyzw")                 # the node's own projected gravity
        np.testing.assert_allclose([m["projected_gravity"][k] for k in "xyz"], g, rtol=0, atol=1e-12)
        for signal, key in (("imu_gyro", "gyro"), ("imu_acc", "acc")):
            o = lay[signal][0]
            assert [m[key][k] for k in "xyz"] == x[o:o + 3], (key, m)
        o = lay["command"][0]
        assert m["command"] == {"vx": x[o], "vy": x[o + 1], "yaw_rate": x[o + 2]}
    assert len([lt for lt, _ in tfs if lt in seq_at]) > 0.9 * len(msgs), (len(tfs), len(msgs))
    for log_time, t in tfs:
        if log_time not in seq_at:
            continue            # its base message came before the viewer subscribed to the base
        _, q = tilt(seq_at[log_time])
        assert (t["parent_frame_id"], t["child_frame_id"]) == ("world", "base")
        np.testing.assert_allclose([t["rotation"][k] for k in "wxyz"], q, rtol=0, atol=1e-12)
        assert t["timestamp"]["sec"] * 1_000_000_000 + t["timestamp"]["nsec"] == log_time


@needs_sdk
@needs_client
@pytest.mark.slow                       # a node, live, record and the viewer for 4.5 s: spread among the slow tests
def test_a_viewer_sees_a_legged_robots_joints_base_and_mode_by_name(tmp_path, legged_model):
    model, op = legged_model
    extra = LOOP + section_toml("legged", {**recipe(), "output": "torque",
                                           "sequence": [[0.05, "stand"], [0.1, "policy"]]})
    node, cfg = start_node(tmp_path, model, extra=extra)
    (port,) = free_tcp_ports(1)
    lay = {s: (o, w) for s, o, w in L.frame_layout(op)}
    q0_robot = np.asarray(recipe()["default_pos"])[[QUAD.index(n) for n in QUAD_ROBOT]]
    base = frames(op, 2, seed=22, q0_robot=q0_robot)[1]
    ctx = zmq.Context.instance()
    tap = ctx.socket(zmq.PUB)           # the robot's sensor tap: what the live view and the recorder read
    tap.setsockopt(zmq.LINGER, 0)
    tap.bind(client_endpoints(cfg)["sensor_tap"])
    live = cli_popen("live", "--config", cfg, "--listen", f"127.0.0.1:{port}", "--every", EVERY, "--state", "none")
    rec_path = tmp_path / "rec.mcap"
    rec = cli_popen("record", "--config", cfg, "--out", rec_path)
    collector = ActionCollector(node.endpoints["action"])
    robot = Robot(node.endpoints)
    sent = {}
    try:
        head = wait_for_line(live, "foxglove listening", timeout=60)
        wait_for_line(rec, "recording to", timeout=60)
        robot.connect(base)             # ZeroMQ's slow joiner: the node's subscription is up before frames count
        v = viewer(port, tmp_path / "viewer.json", 4.5)
        t_end = time.monotonic() + 4.0
        rng = np.random.default_rng(23)
        x = base.copy()
        while time.monotonic() < t_end:
            seq = robot.seq + 1
            x = x.copy()
            x[:24] += rng.normal(0, 0.005, 24)
            x[lay["imu_gyro"][0]:lay["imu_gyro"][0] + 6] = rng.normal(0, 0.3, 6) + [0, 0, 0, 0, 0, 9.81]
            rpy, (w, qx, qy, qz) = tilt(seq)
            x[lay["imu_quat"][0]:lay["imu_quat"][0] + 4] = [qx, qy, qz, w]      # ROS order
            # every other frame with x as a bin (8 bytes a value, docs/protocol.md), as sim mujoco sends them
            xv = x.astype("<f8").tobytes() if seq % 2 else x.tolist()
            data = msgpack.packb({"seq": seq, "t_ns": time.monotonic_ns(), "x": xv})
            robot.seq = seq
            robot.send_raw(data)
            tap.send(data)
            sent[seq] = x.tolist()
            assert robot.wait_answer(seq, timeout=5.0) is not None, f"no command answered frame {seq}"
        v_out = finish(v, 60)
        time.sleep(0.2)
    finally:
        robot.close()
        tap.close(linger=0)
        live.send_signal(2)
        rec.send_signal(2)
        rc, out, err, run_dir = node.stop()
        actions = collector.close()
    live_out = "".join(head) + finish(live, 30)
    rec_out = finish(rec, 30)
    assert rc == 0, err
    assert v.returncode == 0, v_out
    got = json.loads((tmp_path / "viewer.json").read_text())
    assert not got["errors"], got["errors"]
    adv = {c["topic"]: c for c in got["channels"]}
    assert set(ch.LEGGED_TOPICS) <= set(adv), (sorted(adv), live_out)
    assert adv[ch.TF]["schemaName"] == "foxglove.FrameTransform" and adv[ch.TF]["encoding"] == "json"
    js_schema = json.loads(adv[ch.JOINT_STATES]["schema"])
    assert list(js_schema["properties"]["joints"]["properties"]) == QUAD_ROBOT
    msgs = {t: [m["msg"] for m in got["messages"].get(t, [])] for t in ch.LEGGED_TOPICS}
    actions_by_cycle = {a["cycle"]: a for a in actions}
    first_cycle_of = {}
    for a in sorted(actions, key=lambda a: a["cycle"]):
        first_cycle_of.setdefault(a["seq"], a["cycle"])
    # thinned as the observation is: every kept frame (seq a multiple of EVERY) the viewer saw, once
    obs = {m["msg"]["seq"] for m in got["messages"].get(ch.OBSERVATION, [])}
    js = [m["seq"] for m in msgs[ch.JOINT_STATES]]
    assert len(js) == len(set(js)) > 200 and len(set(js) & obs) > 0.9 * len(js), (len(js), len(obs), live_out)
    assert sum(s % 2 for s in js) > 0.3 * len(js)          # frames sent as a bin are read too
    in_policy = check_joint_states(msgs[ch.JOINT_STATES], sent, actions_by_cycle, first_cycle_of)
    assert in_policy > 100, in_policy
    assert len(msgs[ch.BASE]) > 200
    check_base([(int(m["log_time"]), m["msg"]) for m in got["messages"][ch.BASE]],
               [(int(m["log_time"]), m["msg"]) for m in got["messages"][ch.TF]], sent, op)
    # /control_node/action: the published command named by the actuators (its order), not the policy's names
    named = [m["msg"] for m in got["messages"][ch.ACTION] if list(m["msg"]["u"]) == ACTUATORS]
    assert len(named) > 0.9 * len(got["messages"][ch.ACTION]) > 100, len(named)
    for m in named:
        if m["cycle"] in actions_by_cycle:
            assert list(m["u"].values()) == actions_by_cycle[m["cycle"]]["u"], m
    modes = [m["mode"] for m in msgs[ch.MODE]]
    assert "policy" in modes and all(m["output"] == "torque" for m in msgs[ch.MODE]), modes

    # the recording, exported: the same channels, the same values (every frame the tap carried, thinned alike)
    assert "recorded" in rec_out, rec_out
    r = run_cli("export", rec_path, "--out", tmp_path / "out.mcap", "--every", EVERY)
    assert r.returncode == 0, r.stdout + r.stderr
    from mcap.reader import make_reader
    seen = {}
    with open(tmp_path / "out.mcap", "rb") as f:
        for schema, channel, msg in make_reader(f).iter_messages():
            if channel.topic in ch.LEGGED_TOPICS:
                seen.setdefault(channel.topic, (schema.name, [], []))
                seen[channel.topic][1].append(json.loads(msg.data))
                seen[channel.topic][2].append(msg.log_time)
    assert set(ch.LEGGED_TOPICS) <= set(seen), sorted(seen)
    with open(tmp_path / "out.mcap", "rb") as f:       # the recorded /action's u_by_name: by actuator too
        raw_acts = [json.loads(msg.data) for _, _, msg in make_reader(f).iter_messages(topics=["/action"])]
    assert raw_acts and all(list(a["u_by_name"]) == ACTUATORS and list(a["u_by_name"].values()) == a["u"]
                            for a in raw_acts)
    assert seen[ch.TF][0] == "foxglove.FrameTransform"
    exported = seen[ch.JOINT_STATES][1]
    assert len(exported) >= 0.9 * len([s for s in sent if s % EVERY == 0]), (len(exported), len(sent))
    assert check_joint_states(exported, sent, actions_by_cycle, first_cycle_of) > 100
    # the viewer's joint states are the exported ones for the same frames
    by_seq = {m["seq"]: m for m in exported}
    assert all(by_seq[m["seq"]] == m for m in msgs[ch.JOINT_STATES] if m["seq"] in by_seq)
    check_base(list(zip(seen[ch.BASE][2], seen[ch.BASE][1])), list(zip(seen[ch.TF][2], seen[ch.TF][1])), sent, op)


def test_a_known_tilt_and_a_position_output_in_the_converter():
    """The converter alone on a legged layout: a pure 30 degree roll read in either quaternion order; an unstated
    order gives no orientation (never guessed); a position output's targets by actuator name, and in passive mode
    (the node sends no command) the joint state at once with a null target."""
    frame = [{"signal": s, "offset": o, "width": w} for s, o, w in
             (("joint_pos", 0, 2), ("joint_vel", 2, 2), ("imu_quat", 4, 4), ("imu_gyro", 8, 3), ("imu_acc", 11, 3),
              ("command", 14, 3))]
    h = math.radians(30.0) / 2
    for order, quat in (("wxyz", [math.cos(h), math.sin(h), 0, 0]), ("xyzw", [math.sin(h), 0, 0, math.cos(h)]),
                        (None, [math.cos(h), math.sin(h), 0, 0])):
        lg = {"mode": "policy", "output": "position", "quat_order": order, "frame": frame,
              "joints": {"robot": ["knee", "hip"], "actuators": ["hip", "knee"], "policy": ["hip", "knee"]}}
        conv = ch.Converter(0, every=1)
        conv.diagnostics({"t_ns": 0, "legged": lg})
        x = [0.1, 0.2, 1.0, 2.0, *quat, 0, 0, 0, 0, 0, 9.81, 0.5, 0.0, 0.1]
        out = conv.action({"seq": 7, "cycle": 70, "t_ns": 1, "safe": False, "u": [-0.5, 0.25]})
        out += conv.sensor({"seq": 7, "t_ns": 2, "x": x})
        by = {t: m for t, m, _ in out}
        if order is None:
            assert by[ch.BASE]["orientation"] is None and by[ch.BASE]["rpy_deg"] is None and ch.TF not in by
        else:
            roll, pitch, yaw = (by[ch.BASE]["rpy_deg"][k] for k in ("roll", "pitch", "yaw"))
            assert abs(roll - 30.0) < 1e-9 and abs(pitch) < 1e-9 and abs(yaw) < 1e-9, (order, by[ch.BASE])
            # gravity seen from a base rolled +30 degrees about x: in its y-z plane, toward -z and -y
            g = by[ch.BASE]["projected_gravity"]
            assert abs(g["y"] + 0.5) < 1e-12 and abs(g["z"] + math.cos(math.radians(30))) < 1e-12
        assert by[ch.JOINT_STATES]["joints"] == {"knee": {"position": 0.1, "velocity": 1.0, "target": 0.25},
                                                 "hip": {"position": 0.2, "velocity": 2.0, "target": -0.5}}
    conv.diagnostics({"t_ns": 0, "legged": {**lg, "mode": "passive"}})
    out = conv.sensor({"seq": 8, "t_ns": 3, "x": x})
    js = [m for t, m, _ in out if t == ch.JOINT_STATES]
    assert js and js[0]["joints"]["hip"] == {"position": 0.2, "velocity": 2.0, "target": None}


def test_a_frame_the_node_never_acted_on_gets_its_joint_state_with_a_null_command():
    """The node acts on the newest frame: a kept frame still waiting when a command for a newer one arrives was
    superseded (its joint state at once, torque null), also when the tap delivers it after that command; a
    command that arrives before its frame waits for it (either socket may be first)."""
    frame = [{"signal": s, "offset": o, "width": w} for s, o, w in
             (("joint_pos", 0, 1), ("joint_vel", 1, 1), ("imu_quat", 2, 4), ("imu_gyro", 6, 3), ("imu_acc", 9, 3),
              ("command", 12, 0))]
    conv = ch.Converter(0, every=2, legged={"output": "torque", "quat_order": "wxyz", "frame": frame,
                                            "joints": {"robot": ["knee"], "actuators": ["knee"]}})

    def x(v):
        return [v, -v, 1, 0, 0, 0, 0, 0, 0, 0, 0, 9.81]

    def js(items):
        return [(m["seq"], m["joints"]["knee"]["torque"], m["cycle"]) for t, m, _ in items if t == ch.JOINT_STATES]
    assert js(conv.sensor({"seq": 2, "t_ns": 1, "x": x(0.2)})) == []                  # waits for its command
    assert js(conv.action({"seq": 3, "cycle": 9, "t_ns": 2, "safe": False, "u": [3.0]})) == [(2, None, None)]
    assert js(conv.sensor({"seq": 3, "t_ns": 3, "x": x(0.3)})) == []                  # not kept (every 2)
    assert js(conv.action({"seq": 4, "cycle": 10, "t_ns": 4, "safe": False, "u": [4.0]})) == []   # before its frame
    assert js(conv.sensor({"seq": 4, "t_ns": 5, "x": x(0.4)})) == [(4, 4.0, 10)]
    assert js(conv.action({"seq": 4, "cycle": 11, "t_ns": 6, "safe": False, "u": [4.5]})) == []   # the same frame
    assert js(conv.action({"seq": 7, "cycle": 12, "t_ns": 7, "safe": False, "u": [7.0]})) == []
    assert js(conv.sensor({"seq": 6, "t_ns": 8, "x": x(0.6)})) == [(6, None, None)]   # the tap was late
    assert conv.superseded == 2 and conv.unpaired == 0
