"""Who may talk to the node: CURVE over tcp with an allow-list, private ipc dirs, refused unsafe set-ups.

Real node processes, real sockets: CURVE runs inside libzmq, under the compiled loop's zmq_recv/zmq_send.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

import msgpack
import numpy as np
import pytest
import zmq
import zmq.auth  # a submodule: tests use it directly, whatever ran before them

from support.nodeutil import write_node_config, Robot, assert_answered_or_superseded
from control_node.bench.harness import CHILD_CWD, NodeProcess

from control_node import endpoints, security
from control_node.config import load_config
from control_node.errors import ConfigError, UserError


def make_keys(base):
    """node + robot (allowed) + intruder (not allowed) keypairs; returns a dict of paths."""
    kd = os.path.join(base, "keys")
    for name in ("node", "robot", "intruder"):
        r = subprocess.run([sys.executable, "-m", "control_node", "keys", "--out", kd, "--name", name],
                           cwd=CHILD_CWD, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    allowed = os.path.join(kd, "clients")
    os.makedirs(allowed)
    os.link(os.path.join(kd, "robot.key"), os.path.join(allowed, "robot.key"))
    return {"dir": kd, "allowed": allowed, "node_secret": f"{kd}/node.key_secret", "node_public": f"{kd}/node.key",
            "robot_secret": f"{kd}/robot.key_secret", "intruder_secret": f"{kd}/intruder.key_secret"}


def security_toml(keys, client="robot"):
    return ("[security]\ncurve = true\n"
            f'server_secret_key = "{keys["node_secret"]}"\n'
            f'allowed_clients = "{keys["allowed"]}"\n'
            f'client_secret_key = "{keys[client + "_secret"]}"\n'
            f'server_public_key = "{keys["node_public"]}"\n')


class CurveRobot(Robot):
    """tests' Robot with its two sockets configured by control_node.security before they connect."""

    def __init__(self, endpoints, curve):
        self.ctx = zmq.Context.instance()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        security.configure_client(self.pub, curve)
        self.pub.connect(endpoints["sensor"])
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        security.configure_client(self.sub, curve)
        self.sub.connect(endpoints["action"])
        self.seq = 0


def curve_for(keys, client):
    return {"public": zmq.auth.load_certificate(keys[client + "_secret"])[0],
            "secret": zmq.auth.load_certificate(keys[client + "_secret"])[1],
            "server": zmq.auth.load_certificate(keys["node_public"])[0]}


@pytest.fixture
def curve_node(tmp_path, iris_model_path):
    keys = make_keys(str(tmp_path))
    cfg = tmp_path / "node.toml"
    write_node_config(cfg, tmp_path, "[watchdog]\nstale_after_ms = 2000.0\n" + security_toml(keys), transport="tcp")
    node = NodeProcess(cfg, iris_model_path)
    yield node, keys, cfg
    node.kill()


def summary_of(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def test_allowed_client_is_answered_and_oversized_is_rejected(curve_node, iris_model_path):
    """An allow-listed CURVE client gets the policy's answers through the compiled loop; caps still apply."""
    from control_node.kernels import Policy
    node, keys, cfg = curve_node
    policy = Policy.load(iris_model_path)
    robot = CurveRobot(node.endpoints, security.client_curve(load_config(str(cfg))))
    try:
        X = policy.spec.check_X
        robot.connect(X[0])
        for i, x in enumerate(X[:40]):
            seq = robot.send(x)
            a = robot.wait_answer(seq)
            assert a is not None and a["safe"] is False, f"frame {seq} not answered"
            assert a["action"] == policy.predict(np.ascontiguousarray(x))
        robot.send_raw(msgpack.packb({"seq": 10 ** 6, "t_ns": 1, "x": [0.0] * 4, "pad": b"\0" * 5000}))
        # a frame after it on the same connection is answered only once the oversized one was read
        assert robot.wait_answer(robot.send(X[1])) is not None
    finally:
        robot.close()
        rc, out, err, run_dir = node.stop()
    assert rc == 0, err
    s = summary_of(run_dir)
    assert s["frames_valid"] >= 40
    assert s["rejected"]["oversized"] == 1
    assert s["config"]["security"]["curve"] is True


def test_unauthenticated_and_unknown_clients_get_nothing_and_inject_nothing(curve_node):
    """A plaintext client and a CURVE client whose key is not allow-listed: no actions, no frames accepted."""
    node, keys, cfg = curve_node
    plain = Robot(node.endpoints)                               # no CURVE at all
    unknown = CurveRobot(node.endpoints, curve_for(keys, "intruder"))
    wrong_server = CurveRobot(node.endpoints, dict(curve_for(keys, "robot"),
                                                   server=zmq.curve_keypair()[0]))   # right key, wrong server
    watcher = CurveRobot(node.endpoints, curve_for(keys, "robot"))  # allowed: only listens
    got = {"plain": [], "unknown": [], "wrong_server": []}
    x = [5.1, 3.5, 1.4, 0.2]
    try:
        t_end = time.monotonic() + 2.0
        seq = 1000
        while time.monotonic() < t_end:
            seq += 1
            for name, r in (("plain", plain), ("unknown", unknown), ("wrong_server", wrong_server)):
                r.send(x, seq=seq)
                got[name] += r.actions(timeout=0.005)
        watched = watcher.actions(timeout=0.3)
    finally:
        for r in (plain, unknown, wrong_server, watcher):
            r.close()
        rc, out, err, run_dir = node.stop()
    assert rc == 0, err
    assert got == {"plain": [], "unknown": [], "wrong_server": []}
    assert watched, "the allowed watcher should receive the node's (safe) actions"
    assert all(a["safe"] and a["seq"] == -1 for a in watched), "an intruder's frame was answered"
    s = summary_of(run_dir)
    assert s["frames_valid"] == 0 and s["rejected_total"] == 0
    assert s["cycles"] > 0


def test_sim_with_curve_keys(curve_node, tmp_path):
    """`control-node sim --config` reads [security] client keys and closes the loop over CURVE."""
    node, keys, cfg = curve_node
    r = subprocess.run([sys.executable, "-m", "control_node", "sim", "--config", str(cfg), "--duration", "1",
                        "--rate", "200", "--run-dir", str(tmp_path / "sim")], cwd=CHILD_CWD, capture_output=True,
                       text=True, timeout=60)
    rc, out, err, run_dir = node.stop()
    assert r.returncode == 0, r.stdout + r.stderr
    sim = summary_of(tmp_path / "sim")
    node_s = summary_of(run_dir)
    # the loop closes over CURVE: frames answered, or superseded by a newer one after a host stall (which
    # once left 88 of 200 unanswered), every answer from a CURVE-accepted frame
    assert_answered_or_superseded(sim, node_s)
    assert sim["accuracy"] is not None, sim
    assert node_s["frames_valid"] >= sim["frames_answered"] and node_s["rejected_total"] == 0


def run_node_expect_refusal(cfg, model, timeout=60):
    r = subprocess.run([sys.executable, "-m", "control_node", "run", "--config", str(cfg), "--model", str(model),
                        "--duration", "1"], cwd=CHILD_CWD, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "ready" not in r.stdout
    return r.stderr


@pytest.mark.parametrize("mode", [0o644, 0o640])
def test_readable_server_secret_refused(tmp_path, iris_model_path, mode):
    keys = make_keys(str(tmp_path))
    os.chmod(keys["node_secret"], mode)
    cfg = tmp_path / "node.toml"
    write_node_config(cfg, tmp_path, security_toml(keys), transport="tcp")
    err = run_node_expect_refusal(cfg, iris_model_path)
    assert keys["node_secret"] in err and f"chmod 600 {keys['node_secret']}" in err
    assert "security.server_secret_key" in err


def test_readable_client_secret_refused(tmp_path):
    keys = make_keys(str(tmp_path))
    os.chmod(keys["robot_secret"], 0o644)
    cfg = tmp_path / "node.toml"
    write_node_config(cfg, tmp_path, security_toml(keys), transport="tcp")
    with pytest.raises(UserError, match="chmod 600"):
        security.client_curve(load_config(str(cfg)))
    r = subprocess.run([sys.executable, "-m", "control_node", "sim", "--config", str(cfg), "--duration", "0.1"],
                       cwd=CHILD_CWD, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and keys["robot_secret"] in r.stderr and "chmod 600" in r.stderr


def test_writable_allow_list_and_empty_allow_list_refused(tmp_path, iris_model_path):
    keys = make_keys(str(tmp_path))
    cfg = tmp_path / "node.toml"
    write_node_config(cfg, tmp_path, security_toml(keys), transport="tcp")
    os.chmod(keys["allowed"], 0o777)
    assert "chmod 755" in run_node_expect_refusal(cfg, iris_model_path)
    os.chmod(keys["allowed"], 0o700)
    os.unlink(os.path.join(keys["allowed"], "robot.key"))
    assert "holds no public key files" in run_node_expect_refusal(cfg, iris_model_path)


def test_curve_needs_key_paths(tmp_path):
    cfg = tmp_path / "node.toml"
    write_node_config(cfg, tmp_path, "[security]\ncurve = true\n", transport="tcp")
    with pytest.raises(ConfigError) as e:
        load_config(str(cfg))
    assert e.value.field == "security.server_secret_key" and "control-node keys" in str(e.value)


def test_non_loopback_plaintext_tcp_refused(tmp_path, iris_model_path):
    cfg = tmp_path / "node.toml"
    eps = write_node_config(cfg, tmp_path, transport="tcp")
    text = cfg.read_text().replace(eps["action"], "tcp://0.0.0.0:" + eps["action"].rsplit(":", 1)[1])
    cfg.write_text(text)
    err = run_node_expect_refusal(cfg, iris_model_path)
    assert "endpoints.action" in err and "security.allow_plaintext_remote" in err and "0.0.0.0" in err
    cfg.write_text(text + "[security]\nallow_plaintext_remote = true\n")   # explicit opt-in: accepted
    assert load_config(str(cfg))["security"]["allow_plaintext_remote"] is True
    for ep, ok in (("tcp://127.0.0.1:5555", True), ("tcp://localhost:1", True), ("tcp://[::1]:1", True),
                   ("tcp://*:5555", False), ("tcp://10.200.0.1:5555", False), ("tcp://eth0:5555", False)):
        assert endpoints.is_loopback_host(endpoints.tcp_host(ep)) is ok, ep


def test_wide_ipc_dir_refused(tmp_path, iris_model_path):
    ep_dir = tmp_path / "eps"
    ep_dir.mkdir()
    os.chmod(ep_dir, 0o755)
    cfg = tmp_path / "node.toml"
    write_node_config(cfg, ep_dir)
    err = run_node_expect_refusal(cfg, iris_model_path)
    assert str(ep_dir) in err and f"chmod 700 {ep_dir}" in err
    assert not any(p.is_socket() for p in ep_dir.iterdir())


def test_default_runtime_dir_is_tightened(tmp_path):
    d = tmp_path / "rt"
    d.mkdir()
    os.chmod(d, 0o755)
    security.check_runtime_dir(str(d / "sensor"), "ipc://x", "sensor", default_dir=str(d))
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    new = tmp_path / "new" / "sub"
    security.check_runtime_dir(str(new / "sensor"), "ipc://x", "sensor")
    assert stat.S_IMODE(os.stat(new).st_mode) == 0o700


def test_every_socket_has_a_size_cap(tmp_path):
    from control_node.sockets import NodeSockets
    d = tmp_path / "eps"
    eps = {k: f"ipc://{d}/{k}" for k in ("sensor", "action", "diagnostics", "control")}
    socks = NodeSockets(eps, 4096)
    try:
        assert socks.sensor.getsockopt(zmq.MAXMSGSIZE) == 16 * 4096
        for s in (socks.action, socks.diagnostics):
            assert 0 < s.getsockopt(zmq.MAXMSGSIZE) <= 1024
        assert 0 < socks.control.getsockopt(zmq.MAXMSGSIZE) <= 64 * 1024
    finally:
        socks.close()


def test_a_second_node_on_the_same_ipc_endpoints_is_refused_and_the_first_keeps_its_frames(tmp_path):
    """libzmq's ipc bind replaces an existing socket file without a word, so a second node started with the same
    [endpoints] took the first one's frames, and launch removed the files at its end, cutting a running node
    off (a fresh-clone run: two tests' launches on the default {runtime_dir}; the ROS 2 one's node got no frame
    of 1688). The second node is refused, naming the endpoint; the first keeps receiving; a stale file (nobody
    listening) is bound over, and launch's clean-up removes only stale files."""
    import socket

    from control_node.launch import remove_stale_sockets
    from control_node.sockets import NodeSockets
    d = tmp_path / "eps"
    eps = {k: f"ipc://{d}/{k}" for k in ("sensor", "action", "diagnostics", "control")}
    first = NodeSockets(eps, 4096)
    try:
        with pytest.raises(UserError) as e:
            NodeSockets(eps, 4096)
        assert f"the sensor endpoint ipc://{d}/sensor: another process listens there" in str(e.value)
        remove_stale_sockets(eps)
        assert (d / "sensor").is_socket()
        ctx = zmq.Context.instance()
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.connect(eps["sensor"])
        try:
            for _ in range(200):             # PUB/SUB's slow joiner: send until the first node hears one
                pub.send(b"frame")
                if first.sensor.poll(10):
                    break
            assert first.sensor.recv(zmq.NOBLOCK) == b"frame"
        finally:
            pub.close()
    finally:
        first.close()
    def leave_stale_file():         # a killed node's: a socket file nobody listens on
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
            stale.bind(str(d / "sensor"))
    leave_stale_file()
    assert (d / "sensor").is_socket() and not endpoints.ipc_listened(str(d / "sensor"))
    NodeSockets(eps, 4096).close()
    leave_stale_file()
    remove_stale_sockets(eps)
    assert not (d / "sensor").exists()


def test_keys_verb_modes_and_no_overwrite(tmp_path):
    out = tmp_path / "k"
    run = lambda *a: subprocess.run([sys.executable, "-m", "control_node", "keys", "--out", str(out), *a],
                                    cwd=CHILD_CWD, capture_output=True, text=True)
    assert run("--name", "robot1").returncode == 0
    assert stat.S_IMODE(os.stat(out / "robot1.key_secret").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(out / "robot1.key").st_mode) == 0o644
    pub, sec = zmq.auth.load_certificate(str(out / "robot1.key_secret"))
    assert sec and pub == zmq.auth.load_certificate(str(out / "robot1.key"))[0]
    r = run("--name", "robot1")
    assert r.returncode == 2 and "--force" in r.stderr
    assert run("--name", "../x").returncode == 2


def test_control_endpoint_answers_only_allowed_clients(curve_node, iris_model_path):
    """On tcp with CURVE, the control endpoint is silent to a plaintext client and to a key not in the
    allow-list (their load never happens); an allowed client sees the start-up policy alone."""
    from control_node.lifecycle import PolicyClient
    node, keys, cfg = curve_node
    ep = node.endpoints["control"]
    assert ep.startswith("tcp://127.0.0.1:")
    for curve in (None, curve_for(keys, "intruder")):
        with PolicyClient(ep, curve, timeout=1.5) as client:
            with pytest.raises(UserError, match="no reply"):
                client.request({"op": "load", "name": "intruder", "path": str(iris_model_path)})
    with PolicyClient(ep, curve_for(keys, "robot"), timeout=10.0) as client:
        rep = client.request({"op": "status"})
    assert rep["ok"] and rep["status"]["active"] == "iris"
    assert [p["name"] for p in rep["status"]["policies"]] == ["iris"]
    p = subprocess.run([sys.executable, "-m", "control_node", "policy", "status", "--config", str(cfg), "--json"],
                       cwd=CHILD_CWD, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["status"]["active"] == "iris"
