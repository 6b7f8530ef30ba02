"""rosbag2 export and replay (control_node/bridge/rosbag2.py) against independent readers and a real node:
export of a real recording read back by rclpy's deserialize_message and Foxglove's mcap-ros2-support decoder
(values, not bytes), and replay of a bag written by rosbags with shuffled / extra / missing joints and NaN."""
from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time

import msgpack
import numpy as np
import pytest

from control_node.bench.harness import CHILD_CWD, NodeProcess, child_env, make_endpoint_dir, run_cli as cn
from support.nodeutil import write_node_config

pytest.importorskip("rosbags")
JOINT_STATE_HASH = "RIHS01_a13ee3a330e346c9d87b5aa18d24e11690752bd33a0350f11c5882bc9179260e"
N_FRAMES = 1500


def ros2_section():
    """The [ros2] section of configs/pendulum_ros2.toml, as the packaged example writes it."""
    from control_node.endpoints import default_config
    text = open(default_config("pendulum_ros2.toml")).read()
    start = text.index("\n[ros2]\n") + 1
    end = text.index("\n[children.record]", start)
    return text[start:end]


def pendulum_stream(n=N_FRAMES, rate_hz=1000.0):
    """Frames of the real pendulum dynamics under the expert controller (cos theta, sin theta, theta_dot)."""
    from control_node.sim.pendulum import expert_torque, observe, rk4_step
    from control_node.sim.streams import Stream, fixed_rate_offsets
    state = np.array([math.pi - 0.2, 0.0])
    X = np.empty((n, 3))
    for k in range(n):
        X[k] = observe(state)
        state = rk4_step(state, expert_torque(X[k]), 1.0 / rate_hz)
    return Stream(X=X, truth=np.full(n, -1, dtype=np.int16), offsets_ns=fixed_rate_offsets(n, rate_hz),
                  drop=np.zeros(n, dtype=bool), settings={"kind": "pendulum-frames"})


@pytest.fixture(scope="module")
def setup(tmp_path_factory, make_continuous_spec):
    from control_node.config import client_endpoints
    from control_node.kernels import Policy, save_model
    from control_node.sim import engine
    d = tmp_path_factory.mktemp("rosbag2")
    model = d / "pendulum3.npz"
    save_model(make_continuous_spec("float64", seed=2, sizes=(3, 16, 1)), model)
    Policy.load(model)
    ep = make_endpoint_dir()
    cfg = d / "node.toml"
    write_node_config(cfg, ep, extra="\n" + ros2_section())
    node = NodeProcess(cfg, model, "--run-dir", d / "node")
    try:                                    # a failed setup must not leave the node spinning
        rec = subprocess.Popen([sys.executable, "-m", "control_node", "record", "--config", str(cfg), "--out",
                                str(d / "rec.mcap")], cwd=CHILD_CWD, env=child_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        assert rec.stdout.readline().startswith("recording to ")
        eps = client_endpoints(str(cfg))
        loop = engine.ClosedLoop(eps, tap=eps["sensor_tap"])
        try:
            time.sleep(0.5)                     # the recorder's SUB joins the freshly bound tap
            res = loop.run(pendulum_stream(), lockstep=True)    # every frame answered, whatever the host's load
        finally:
            loop.close()
        time.sleep(0.3)
        rec.send_signal(signal.SIGINT)
        out, _ = rec.communicate(timeout=10)
        assert rec.returncode == 0, out
        assert (res["rtt_ns"] >= 0).sum() >= N_FRAMES - 5
        yield {"dir": d, "cfg": cfg, "model": model, "mcap": d / "rec.mcap", "node": node}
    finally:
        node.stop()


def recorded(path):
    """(frames [(log_time, x)], actions the bridge would publish [(log_time, u)]) read straight from the MCAP."""
    from control_node.recording.reader import read_recording
    rec = read_recording(path, ["/sensor", "/action"])
    frames = [(lt, msgpack.unpackb(raw)["x"]) for raw, lt in rec["/sensor"]]
    actions, last = [], None
    for raw, lt in rec["/action"]:
        a = msgpack.unpackb(raw)
        if (a["seq"], a["safe"]) != last:
            last = (a["seq"], a["safe"])
            actions.append((lt, a["u"]))
    return frames, actions


def test_export_read_back_by_rclpy_and_mcap_ros2(setup, tmp_path):
    import yaml
    from mcap.reader import make_reader
    from mcap_ros2.decoder import DecoderFactory
    from rclpy.serialization import deserialize_message
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray
    bag = tmp_path / "bag"
    r = cn("export", setup["mcap"], "--to", "rosbag2", "--out", bag, "--config", setup["cfg"])
    assert r.returncode == 0, r.stdout + r.stderr
    frames, actions = recorded(setup["mcap"])
    assert len(frames) > N_FRAMES * 0.9 and len(actions) > N_FRAMES * 0.9

    meta = yaml.safe_load((bag / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    assert meta["version"] == 9 and meta["storage_identifier"] == "mcap"
    topics = {t["topic_metadata"]["name"]: t for t in meta["topics_with_message_count"]}
    assert set(topics) == {"/joint_states", "/pendulum_controller/commands", "/diagnostics"}, topics
    js = topics["/joint_states"]["topic_metadata"]
    assert js["type"] == "sensor_msgs/msg/JointState" and js["type_description_hash"] == JOINT_STATE_HASH
    assert js["serialization_format"] == "cdr"
    assert js["offered_qos_profiles"] and js["offered_qos_profiles"][0]["reliability"] == "best_effort"
    for t in topics.values():
        assert t["topic_metadata"]["type_description_hash"].startswith("RIHS01_")
        assert t["topic_metadata"]["offered_qos_profiles"], t
    assert topics["/pendulum_controller/commands"]["topic_metadata"]["type"] == "std_msgs/msg/Float64MultiArray"
    assert topics["/diagnostics"]["topic_metadata"]["type"] == "diagnostic_msgs/msg/DiagnosticArray"
    assert topics["/joint_states"]["message_count"] == len(frames)
    assert topics["/pendulum_controller/commands"]["message_count"] == len(actions)
    assert topics["/diagnostics"]["message_count"] >= 1

    (mcap_file,) = bag.glob("*.mcap")
    # rclpy, the real ROS 2 deserialiser (no rclpy.init: no DDS)
    got_js, got_u = [], []
    with open(mcap_file, "rb") as f:
        for _s, ch, m in make_reader(f).iter_messages(log_time_order=True):
            if ch.topic == "/joint_states":
                got_js.append((m.log_time, deserialize_message(m.data, JointState)))
            elif ch.topic == "/pendulum_controller/commands":
                got_u.append((m.log_time, deserialize_message(m.data, Float64MultiArray)))
    assert len(got_js) == len(frames) and len(got_u) == len(actions)
    for (lt, x), (mlt, msg) in zip(frames, got_js):
        assert mlt == lt and msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec == lt
        assert list(msg.name) == ["theta"]
        assert msg.position[0] == pytest.approx(math.atan2(x[1], x[0]), abs=1e-12)
        assert msg.velocity[0] == x[2] and len(msg.effort) == 0
    for (lt, u), (mlt, msg) in zip(actions, got_u):
        assert mlt == lt and list(msg.data) == u
    # Foxglove's decoder, from the schemas the bag carries
    n_js = n_diag = 0
    with open(mcap_file, "rb") as f:
        for _s, ch, _m, dec in make_reader(f, decoder_factories=[DecoderFactory()]).iter_decoded_messages():
            if ch.topic == "/joint_states":
                lt, x = frames[n_js]
                assert dec.position[0] == pytest.approx(math.atan2(x[1], x[0]), abs=1e-12) and dec.velocity[0] == x[2]
                n_js += 1
            elif ch.topic == "/diagnostics":
                st = dec.status[0]
                assert st.name == "control_node"
                keys = {kv.key: kv.value for kv in st.values}
                assert int(keys["cycles"]) > 0
                n_diag += 1
    assert n_js == len(frames) and n_diag >= 1


def write_bag(path, storage, n=400):
    """A JointState bag as a robot's might be: joints in a changing order plus an extra one; every 50th
    message lacks theta, every 37th has a NaN velocity. Returns (expected frames X, withheld by reason)."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore
    ts = get_typestore(Stores.ROS2_KILTED)
    JS, Header, Time = (ts.types[k] for k in ("sensor_msgs/msg/JointState", "std_msgs/msg/Header",
                                                "builtin_interfaces/msg/Time"))
    rng = np.random.default_rng(5)
    t0 = 1_700_000_000 * 10**9
    X, withheld = [], {}
    with Writer(path, version=9, storage_plugin=getattr(StoragePlugin, storage.upper())) as w:
        conn = w.add_connection("/joint_states", "sensor_msgs/msg/JointState", typestore=ts)
        other = w.add_connection("/tf_ignored", "std_msgs/msg/Float64", typestore=ts)
        for k in range(n):
            theta, omega = rng.uniform(-math.pi, math.pi), rng.normal(0.0, 2.0)
            joints = {"theta": (theta, omega), "extra": (1.0, 2.0), "wheel": (-3.0, 0.5)}
            if k % 50 == 0:
                del joints["theta"]
                withheld["missing_joint"] = withheld.get("missing_joint", 0) + 1
            elif k % 37 == 0:
                joints["theta"] = (theta, float("nan"))
                withheld["non_finite"] = withheld.get("non_finite", 0) + 1
            else:
                X.append([math.cos(theta), math.sin(theta), omega])
            names = list(joints)
            rng.shuffle(names)
            t = t0 + k * 1_000_000
            msg = JS(header=Header(stamp=Time(sec=t // 10**9, nanosec=t % 10**9), frame_id=""), name=names,
                     position=np.array([joints[j][0] for j in names]), velocity=np.array([joints[j][1] for j in names]),
                     effort=np.zeros(0))
            w.write(conn, t, ts.serialize_cdr(msg, "sensor_msgs/msg/JointState"))
            if k % 10 == 0:
                w.write(other, t, ts.serialize_cdr(ts.types["std_msgs/msg/Float64"](data=1.0), "std_msgs/msg/Float64"))
    return np.asarray(X), withheld


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_replay_rosbag2_lockstep_verify(setup, tmp_path, storage):
    from control_node.kernels import Policy
    bag = tmp_path / "robot_bag"
    X, withheld = write_bag(bag, storage)
    rp = tmp_path / "rp"
    r = cn("replay", "--rosbag2", bag, "--config", setup["cfg"], "--verify", "--model", setup["model"],
           "--run-dir", rp, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    wh = ", ".join(f"{k} {v}" for k, v in withheld.items())
    assert f"withheld {wh}" in r.stdout, r.stdout
    s = json.loads((rp / "summary.json").read_text())
    assert s["frames_sent"] == len(X) and s["frames_answered"] == len(X)
    assert s["verify"]["compared"] == len(X) and s["verify"]["mismatches"] == 0, s["verify"]
    assert s["stream"]["bag"]["frames_withheld"] == withheld
    assert s["stream"]["storage"] == storage
    # the frames were the bag's, joint picked by name: the node's answers are the policy's on them
    u = np.load(rp / "roundtrip.npz")["u"]
    np.testing.assert_allclose(u, Policy.load(setup["model"]).act_batch(X), rtol=1e-9, atol=1e-12)


def test_export_without_recipe_and_replay_of_the_export(setup, tmp_path):
    """No --config: Float64MultiArray on /control_node/*; and an exported bag replays through the recipe."""
    import yaml
    bag = tmp_path / "plain"
    r = cn("export", setup["mcap"], "--to", "rosbag2", "--out", bag)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "/control_node/observation" in r.stdout
    meta = yaml.safe_load((bag / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    names = {t["topic_metadata"]["name"] for t in meta["topics_with_message_count"]}
    assert names == {"/control_node/observation", "/control_node/action", "/diagnostics"}
    bag2 = tmp_path / "js"
    assert cn("export", setup["mcap"], "--to", "rosbag2", "--out", bag2, "--config", setup["cfg"]).returncode == 0
    rp = tmp_path / "rp"
    r = cn("replay", "--rosbag2", bag2, "--config", setup["cfg"], "--verify", "--model", setup["model"],
           "--run-dir", rp, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    frames, _ = recorded(setup["mcap"])
    s = json.loads((rp / "summary.json").read_text())
    assert s["frames_sent"] == len(frames) and s["verify"]["mismatches"] == 0


def test_export_scaled_recipe_jointstate_action_and_gravity_fallback(setup, tmp_path):
    """scale / offset are undone; a JointState action carries the model's joint names; a projected_gravity
    term cannot be inverted: Float64MultiArray on /control_node/observation, said so."""
    from mcap.reader import make_reader
    from rclpy.serialization import deserialize_message
    from sensor_msgs.msg import JointState
    cfg = tmp_path / "scaled.toml"
    cfg.write_text(ros2_section().replace('field = "velocity"\njoints = ["theta"]',
                                          'field = "velocity"\njoints = ["theta"]\nscale = 2.0\noffset = 0.5')
                   .replace('topic = "/pendulum_controller/commands"\ntype = "std_msgs/msg/Float64MultiArray"',
                            'topic = "/cmd"\ntype = "sensor_msgs/msg/JointState"\nfield = "effort"'))
    bag = tmp_path / "scaled"
    r = cn("export", setup["mcap"], "--to", "rosbag2", "--out", bag, "--config", cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    frames, actions = recorded(setup["mcap"])
    (mcap_file,) = bag.glob("*.mcap")
    js, cmd = [], []
    with open(mcap_file, "rb") as f:
        for _s, ch, m in make_reader(f).iter_messages(log_time_order=True):
            if ch.topic in ("/joint_states", "/cmd"):
                (js if ch.topic == "/joint_states" else cmd).append(deserialize_message(m.data, JointState))
    assert len(js) == len(frames) and len(cmd) == len(actions)
    for (_lt, x), msg in zip(frames, js):
        assert msg.velocity[0] == pytest.approx(x[2] / 2.0 + 0.5, abs=1e-12)
    for (_lt, u), msg in zip(actions, cmd):
        assert list(msg.name) == ["j0"] and list(msg.effort) == u and len(msg.position) == 0
    grav = tmp_path / "gravity.toml"
    grav.write_text('[ros2]\n[[ros2.observation]]\ntopic = "/imu"\ntype = "sensor_msgs/msg/Imu"\n'
                    'field = "projected_gravity"\n')
    bag2 = tmp_path / "gravity"
    r = cn("export", setup["mcap"], "--to", "rosbag2", "--out", bag2, "--config", grav)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "projected_gravity" in r.stdout and "/control_node/observation" in r.stdout
    from mcap_ros2.decoder import DecoderFactory
    with open(next(bag2.glob("*.mcap")), "rb") as f:
        obs = [list(dec.data) for _s, ch, _m, dec in
               make_reader(f, decoder_factories=[DecoderFactory()]).iter_decoded_messages(
                   topics=["/control_node/observation"])]
    assert obs == [list(x) for _lt, x in frames]
