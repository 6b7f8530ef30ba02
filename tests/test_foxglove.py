"""The live view (control_node.live, `launch --foxglove`) with real processes: a running `launch pendulum
--foxglove`, a Node.js viewer on @foxglove/ws-protocol (tests/foxglove_client), the values it receives
compared with what the run directory records for the same cycles, frames and physics steps; a viewer
that never reads; bad addresses; the layouts against the channels' schemas; the export's channels."""
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from control_node import rundir
from control_node.bench.harness import CHILD_CWD, child_env, free_tcp_ports, make_endpoint_dir, run_cli
from control_node.live import channels as ch
from support.netns import Namespace
from support.nodeutil import quiet_node_toml

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT_DIR = os.path.join(HERE, "foxglove_client")
LAYOUTS = os.path.join(os.path.dirname(HERE), "configs", "foxglove")
# min / default / max bytes of a TCP socket's buffers, inside the never-reading viewer's namespace
SMALL_TCP_BUFFERS = {"net.ipv4.tcp_rmem": "4096 16384 65536", "net.ipv4.tcp_wmem": "4096 16384 65536"}


def _sdk():
    try:
        import foxglove  # noqa: F401
        return True
    except ImportError:
        return False


needs_sdk = pytest.mark.skipif(not _sdk(), reason="foxglove-sdk is not installed (pip install -e '.[foxglove]')")
needs_client = pytest.mark.skipif(
    shutil.which("node") is None or not os.path.isdir(os.path.join(CLIENT_DIR, "node_modules", "@foxglove")),
    reason="the Node.js viewer needs node and `npm ci` in tests/foxglove_client (@foxglove/ws-protocol)")


def write_config(path, ep_dir, model, duration, foxglove_args=(), listen=None):
    args = ", ".join(f'"{a}"' for a in foxglove_args)
    # no spin, no why-late recorder: CPU a test of the live view does not need
    path.write_text(quiet_node_toml(f"""
[node]
model = "{model}"
run_root = "{ep_dir}/runs"

[endpoints]
sensor = "ipc://{ep_dir}/sensor"
action = "ipc://{ep_dir}/action"
diagnostics = "ipc://{ep_dir}/diagnostics"

[loop]
rate_hz = 1000.0
phase_lock = true

[watchdog]
stale_after_ms = 20.0
safe_action = "offset"

[launch]
duration = {duration}

[children.sim]
args = ["pendulum"]

[children.foxglove]
args = [{args}]

[children.record]
sensor_tap = "ipc://{ep_dir}/sensor_tap"
""" + (f'\n[foxglove]\nlisten = "{listen}"\n' if listen else "")))
    return path


def start_launch(cfg, run_dir, *extra, ns=None):
    cmd = [sys.executable, "-m", "control_node", "launch", str(cfg), "--run-dir", str(run_dir), *extra]
    if ns is not None:
        return ns.popen(*cmd, cwd=CHILD_CWD, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=1,
                        start_new_session=True)
    return subprocess.Popen(cmd, cwd=CHILD_CWD, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1, start_new_session=True)


def wait_for_line(proc, prefix, timeout=120):
    """Lines of ``proc`` up to the first containing ``prefix`` (raises with the output if it ends first)."""
    lines = []
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        lines.append(line)
        if prefix in line:
            return lines
        assert time.monotonic() < deadline, "".join(lines)
    raise AssertionError(f"no {prefix!r} line:\n" + "".join(lines))


def viewer(port, out, seconds, *flags, ns=None):
    cmd = ["node", os.path.join(CLIENT_DIR, "client.cjs"), f"ws://127.0.0.1:{port}", str(out), str(seconds), *flags]
    if ns is not None:
        return ns.popen(*cmd, cwd=CLIENT_DIR, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return subprocess.Popen(cmd, cwd=CLIENT_DIR, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc, timeout=120):
    out, _ = proc.communicate(timeout=timeout)
    return out


def interrupt(proc, timeout=120):
    """Ctrl-C a launch (it stops its children and writes every summary, exit code 130): the tests end it once
    their viewer is done rather than after a duration a loaded host's start-up could eat into."""
    proc.send_signal(signal.SIGINT)
    return finish(proc, timeout)


@needs_sdk
@needs_client
@pytest.mark.slow
def test_a_viewer_receives_every_channel_with_the_values_the_run_recorded(tmp_path, pendulum_model):
    ep_dir = make_endpoint_dir()
    (port,) = free_tcp_ports(1)
    cfg = write_config(tmp_path / "pendulum.toml", ep_dir, pendulum_model, duration=120)
    run_dir = tmp_path / "run"
    proc = start_launch(cfg, run_dir, "--foxglove", f"127.0.0.1:{port}")
    head = wait_for_line(proc, "foxglove listening")
    wait_for_line(proc, "started sim")
    out_json = tmp_path / "viewer.json"
    v = viewer(port, out_json, 5)
    v_out = finish(v, 60)
    rest = interrupt(proc)
    log = "".join(head) + rest
    assert proc.returncode == 130, log
    assert v.returncode == 0, v_out
    got = json.loads(out_json.read_text())
    assert got["subprotocol"] == "foxglove.sdk.v1" and not got["errors"], got["errors"]
    adv = {c["topic"]: c for c in got["channels"]}
    assert set(ch.TOPICS) <= set(adv), sorted(adv)
    for topic in ch.TOPICS:
        assert adv[topic]["encoding"] == "json" and adv[topic]["schemaEncoding"] == "jsonschema"
    msgs = {t: [m["msg"] for m in got["messages"].get(t, [])] for t in ch.TOPICS}
    for topic in (ch.OBSERVATION, ch.ACTION, ch.CYCLE, ch.SIM_PENDULUM):
        # one fresh-clone run got 0 actions (about 490 of each other topic) though the action channel was
        # advertised (foxglove-sdk can refuse a fast subscribe as unknown: client.cjs subscribes again); the
        # message names what the server converted (its "foxglove: messages" line), the channels' ids and the
        # server's status messages, so a repeat says which side lost them
        assert len(msgs[topic]) > 50, (f"{topic}: {len(msgs[topic])} messages; got "
                                       f"{ {t: len(m) for t, m in msgs.items()} }; channels "
                                       f"{[(c['id'], c['topic']) for c in got['channels']]}; statuses "
                                       f"{got.get('statuses')}; subscribed again {got.get('resubscribed')}\n{log}")

    summary, cyc = rundir.read_node_run(run_dir / "node")
    acts = rundir.read_node_actions(run_dir / "node")
    by_cycle = {int(c): i for i, c in enumerate(cyc["cycle"])}
    # /control_node/cycle: min, max and last of each figure over the window's cycles, exactly
    for m in msgs[ch.CYCLE]:
        idx = [by_cycle[c] for c in range(m["cycle_first"], m["cycle_last"] + 1)]
        assert len(idx) == m["cycles"] == ch.DEFAULT_EVERY, m
        for f in ch.CYCLE_FIGURES:
            v = cyc[f][idx]
            v = v[v >= 0]
            want = {"min": int(v.min()), "max": int(v.max()), "last": int(v[-1])} if v.size else None
            assert m[f] == want, (f, m, want)
        flags = cyc["flags"][idx]
        assert m["misses"] == int(((flags & rundir.FLAG_MISS) != 0).sum())
        assert m["safe"] == int(((flags & rundir.FLAG_SAFE) != 0).sum())
        assert m["phase_shifts"] == int(((flags & rundir.FLAG_PHASE_SHIFT) != 0).sum())
    # /control_node/action: the action the cycle published; actions.npz holds it as float32, so equal there
    first_act = int(acts["cycle"][0])
    for m in msgs[ch.ACTION]:
        assert m["seq"] % ch.DEFAULT_EVERY == 0
        i = by_cycle[m["cycle"]]
        assert int(cyc["seq"][i]) == m["seq"]                   # the cycle acted on that frame
        assert m["safe"] == bool(cyc["flags"][i] & rundir.FLAG_SAFE)
        assert set(m["u"]) == {"torque"}
        assert np.float32(m["u"]["torque"]) == acts["u"][m["cycle"] - first_act][0], m
    # /control_node/observation: the frame the simulator sent, from its recorded physics (no noise)
    sim = np.load(run_dir / "sim" / "control.npz")
    sim_sum = json.loads((run_dir / "sim" / "summary.json").read_text())
    base = int(sim_sum["seq_base"])
    acted = set(int(s) for s in cyc["seq"][(cyc["flags"] & rundir.FLAG_NEW_FRAME) != 0])
    for m in msgs[ch.OBSERVATION]:
        k = m["seq"] - base                                     # one frame per physics step at 1 kHz
        th = float(sim["theta"][k])
        assert m["x"] == {"cos_theta": math.cos(th), "sin_theta": math.sin(th),
                          "theta_dot": float(sim["omega"][k])}, (m, k)
    observed = set(m["seq"] for m in msgs[ch.OBSERVATION])
    answered = set(m["seq"] for m in msgs[ch.ACTION])
    assert observed & answered & acted                      # frames seen, acted on and answered, side by side
    # /sim/pendulum: the physics state of that step, exactly
    for m in msgs[ch.SIM_PENDULUM]:
        k = m["step"]
        assert (m["angle"], m["velocity"], m["torque"]) == (
            float(sim["theta"][k]), float(sim["omega"][k]), float(sim["u"][k])), m
    # /control_node/events: every miss of the streamed cycles, by cycle number; safe actions counted. From
    # the second window on: the first may close on a snapshot after the one that carried its first cycles'
    # events, sent before the viewer subscribed
    lo = sorted(m["cycle_first"] for m in msgs[ch.CYCLE])[1]
    hi = max(m["cycle_last"] for m in msgs[ch.CYCLE])
    span = (cyc["cycle"] >= lo) & (cyc["cycle"] <= hi)
    missed = set(int(c) for c in cyc["cycle"][span & ((cyc["flags"] & rundir.FLAG_MISS) != 0)])
    ev_missed = set(e["cycle"] for e in msgs[ch.EVENTS] if e["kind"] == "miss" and lo <= e["cycle"] <= hi)
    assert ev_missed == missed
    for e in msgs[ch.EVENTS]:
        if e["kind"] == "miss":
            i = by_cycle[e["cycle"]]
            assert (e["wake_latency_ns"], e["cycle_time_ns"]) == (int(cyc["wake_latency_ns"][i]),
                                                                    int(cyc["cycle_time_ns"][i]))
        if e["kind"] == "safe":
            i = by_cycle[e["cycle"]]
            assert all(cyc["flags"][i:i + e["count"]] & rundir.FLAG_SAFE), e
    # one wall-clock offset for the run: log time - monotonic send time is the same for every message
    offsets = {int(m["log_time"]) - m["msg"]["t_ns"] for t in (ch.OBSERVATION, ch.ACTION, ch.SIM_PENDULUM)
               for m in got["messages"][t]}
    assert len(offsets) == 1, sorted(offsets)[:3]
    assert abs(offsets.pop() - (time.time_ns() - time.monotonic_ns())) < 5e9


def _running(pid):
    """The process exists and is not a zombie (exited, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kernel_queued(port, pid):
    """Bytes the kernel holds on the loopback TCP connections of ``port`` (send and receive queues, both
    ends), from the /proc/net/tcp of ``pid``'s network namespace."""
    total = 0
    with open(f"/proc/{pid}/net/tcp") as f:
        next(f)
        for line in f:
            cols = line.split()
            local, remote, queues = cols[1], cols[2], cols[4]
            if int(local.split(":")[1], 16) == port or int(remote.split(":")[1], 16) == port:
                tx, rx = queues.split(":")
                total += int(tx, 16) + int(rx, 16)
    return total


@needs_sdk
@needs_client
@pytest.mark.slow
def test_a_viewer_that_never_reads_is_dropped_for_and_costs_the_node_nothing(tmp_path, pendulum_model):
    """The viewer subscribes to everything, every message (--every 1), stops reading for 6 s, then reads again.
    By rule, not by a time or memory bound: the observations the live view owed it in the stall (the simulator's
    frames sent then) are more than what the server's queue (BACKLOG messages) and the kernel's socket buffers
    can hold, yet after the stall no more than those hold arrived: the rest was dropped, nothing was kept for it
    (a server keeping everything would deliver every owed frame then, and as many actions and steps); then the
    viewer gets fresh messages again, or the server has closed it (both were seen: foxglove-sdk closes a viewer
    when its control queue fills too). The live view converted the frames sent until the resume (it never
    stalled, so nothing backed up towards the node), and the node's action sends never failed. The launch and the viewer run in a
    network namespace of their own whose TCP buffers are capped at 64 KiB (the host's hold ~4 MB).
    It replaced a rule on the live view's memory (grew < half of what it owed), which failed in CI on a loaded
    host: the live view's own ZeroMQ queues grew while it lagged, 3.7 MB, with nothing kept for the viewer."""
    from control_node.live.server import BACKLOG
    ep_dir = make_endpoint_dir()
    port = 8765
    cfg = write_config(tmp_path / "pendulum.toml", ep_dir, pendulum_model, duration=120,
                       foxglove_args=("--every", "1"))
    run_dir = tmp_path / "run"
    ns = Namespace("foxglove", sysctls=SMALL_TCP_BUFFERS).up()
    try:
        proc = start_launch(cfg, run_dir, "--foxglove", f"127.0.0.1:{port}", ns=ns)
        head = "".join(wait_for_line(proc, "foxglove listening"))
        live_pid = int(re.search(r"started foxglove \(pid (\d+)\)", head).group(1))
        head += "".join(wait_for_line(proc, "started sim"))
        v = viewer(port, tmp_path / "stalled.json", 8.5, "--stall-for", "6", ns=ns)
        queued = 0
        while v.poll() is None:
            try:
                queued = max(queued, kernel_queued(port, live_pid))
            except OSError:         # the live view has exited (not yet reaped): its /proc/PID/net is gone
                break
            time.sleep(0.1)
        vout, _ = v.communicate(timeout=60)
        live_outlived_viewer = _running(live_pid)       # a close seen then was not the live view's exit
        rest = interrupt(proc)
    finally:
        ns.close()
    log = head + rest
    assert proc.returncode == 130 and v.returncode == 0, log + vout
    got = json.loads((tmp_path / "stalled.json").read_text())
    paused, resumed = int(got["paused_ns"]), int(got["resumed_ns"])
    msgs = [m for topic in got["messages"].values() for m in topic]
    # the simulator's frames whose log time (send time + the live view's one wall-clock offset) fell in the stall
    timed = [m for t in (ch.OBSERVATION, ch.ACTION, ch.SIM_PENDULUM) for m in got["messages"].get(t, [])]
    assert timed, "the viewer received no observation, action or /sim/pendulum message at all"
    offset = int(timed[0]["log_time"]) - timed[0]["msg"]["t_ns"]
    sent = np.load(run_dir / "sim" / "roundtrip.npz")["t_send_ns"]
    sent = sent[sent >= 0] + offset                       # -1: a frame not sent (the run was stopped first)
    owed = int(((sent >= paused) & (sent < resumed)).sum())
    late = [m for m in msgs if m["after_resume"] and int(m["log_time"]) < resumed]
    fresh = [m for m in msgs if int(m["log_time"]) >= resumed]
    # what the server's queue and the kernel's buffers (both ends, sampled) can hold, in messages
    hold = BACKLOG + math.ceil(queued / min(m["bytes"] for m in msgs))
    print(f"stalled 6 s: owed {owed} observations; {len(late)} messages from before the resume arrived after it, "
          f"{len(fresh)} fresh; queue {BACKLOG} + kernel {queued} B hold {hold}; closed by the server: "
          f"{got['closed']}")
    # the stall overflowed both for real: keeping everything, the server would deliver all the owed observations
    # after the resume, and as many actions and /sim/pendulum steps beside them
    assert owed > hold, (owed, hold)
    assert len(late) <= hold, (len(late), hold)           # the rest was dropped, not kept
    # afterwards the viewer is served fresh messages again, or the server closed it (it never closed itself)
    assert fresh or (got["closed"] is not None and live_outlived_viewer), got["closed"]
    observed = int(re.search(r"/control_node/observation (\d+)", log).group(1))
    # it kept converting through the stall: at least the frames sent until the resume (compared with all the
    # frames sent, a loaded host's lag when Ctrl-C stops it counted: 10874 of 11539 in one run)
    assert observed >= 0.99 * int((sent < resumed).sum()), (observed, int((sent < resumed).sum()))
    summary, _ = rundir.read_node_run(run_dir / "node")
    assert summary["send_failures"] == 0 and summary["cycles"] > 0


@needs_sdk
def test_a_bad_address_is_refused_at_start_naming_the_key(tmp_path, pendulum_model):
    ep_dir = make_endpoint_dir()
    cfg = write_config(tmp_path / "p.toml", ep_dir, pendulum_model, duration=1)
    r = run_cli("launch", cfg, "--run-dir", tmp_path / "r1", "--foxglove", "127.0.0.1:99999", timeout=60)
    assert r.returncode == 2 and "--foxglove = '127.0.0.1:99999': port 99999 is not in 1-65535" in r.stderr, r
    assert "started node" not in r.stdout                   # refused before anything started
    r = run_cli("launch", cfg, "--run-dir", tmp_path / "r2", "--foxglove", "robot:8765", timeout=60)
    assert r.returncode == 2 and "--foxglove = 'robot:8765'" in r.stderr and "not an IP address" in r.stderr, r
    bad = write_config(tmp_path / "bad.toml", ep_dir, pendulum_model, duration=1, listen="8765")
    r = run_cli("launch", bad, "--run-dir", tmp_path / "r3", timeout=60)
    assert r.returncode == 2 and "[foxglove] listen = '8765': '8765' is not HOST:PORT" in r.stderr, r
    r = run_cli("run", "--config", bad, "--model", pendulum_model, "--duration", "1", timeout=60)
    assert r.returncode == 2 and "field 'foxglove.listen'" in r.stderr, r
    # a port already taken: the live view cannot listen; launch stops, naming the key
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        r = run_cli("launch", cfg, "--run-dir", tmp_path / "r4", "--foxglove", f"127.0.0.1:{taken}", timeout=120)
    assert r.returncode != 0 and f'--foxglove = "127.0.0.1:{taken}": cannot listen there' in r.stdout, r.stdout


def test_without_the_extra_the_error_names_the_install_command(tmp_path):
    """foxglove-sdk hidden from the live view's process: a clear error with the install command."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "foxglove.py").write_text("raise ImportError('foxglove-sdk hidden by the test')\n")
    env = {"PYTHONPATH": str(hide) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = run_cli("live", "--listen", "127.0.0.1:1", "--duration", "0", env=env)
    assert r.returncode == 2, r
    assert "pip install 'control-node[foxglove]'" in r.stderr and "Traceback" not in r.stderr, r.stderr


def _paths(layout):
    for cfg in layout["configById"].values():
        for p in cfg.get("paths", []):
            yield p["value"]
        if "topicPath" in cfg:
            yield cfg["topicPath"]


def _resolves(path, names, legged=None):
    topic = next((t for t in ch.TOPICS + ch.LEGGED_TOPICS if path == t or path.startswith(t + ".")), None)
    if topic is None:
        return False
    node = ch.schema(topic, *names, legged=legged)
    for part in path[len(topic):].split(".")[1:]:
        node = (node.get("properties") or {}).get(part)
        if node is None:
            return False
    return True


def test_the_packaged_layouts_plot_fields_the_channels_have():
    from importlib import resources
    pendulum = (["cos_theta", "sin_theta", "theta_dot"], ["torque"])
    iris = (["sepal length (cm)", "sepal width (cm)", "petal length (cm)", "petal width (cm)"], [])
    for name, names in (("pendulum", pendulum), ("iris", iris)):
        ref = resources.files("control_node.configs") / "foxglove" / f"{name}.json"
        layout = json.loads(ref.read_text())
        paths = list(_paths(layout))
        assert len(paths) >= 8
        assert [p for p in paths if not _resolves(p, names)] == [], name
    assert not _resolves("/control_node/cycle.no_such_field", pendulum)     # the check can fail


def _quadruped_legged():
    """The legged names and frame layout `launch quadruped`'s node announces (node.legged_layout), from its
    packaged config."""
    import tomllib
    from importlib import resources

    from control_node.deploy import NODE_KEYS
    from control_node.loop import legged as L
    raw = tomllib.loads((resources.files("control_node.configs") / "quadruped.toml").read_text())["legged"]
    op = L.build_obs_plan({k: v for k, v in raw.items() if k not in NODE_KEYS})
    robot = raw["joints"]["robot"]
    return {"output": raw["output"], "quat_order": raw["observation"]["quat_order"],
            "joints": {"robot": robot, "actuators": raw["joints"].get("actuators", robot)},
            "frame": [{"signal": s, "offset": o, "width": w} for s, o, w in L.frame_layout(op)]}


def test_the_legged_layout_plots_joints_by_name_and_shows_the_mode():
    from importlib import resources
    legged = _quadruped_legged()
    layout = json.loads((resources.files("control_node.configs") / "foxglove" / "quadruped.json").read_text())
    paths = list(_paths(layout))
    assert [p for p in paths if not _resolves(p, ((), ()), legged)] == []
    for n in legged["joints"]["robot"]:                     # every joint's position and torque is plotted
        assert {f"{ch.JOINT_STATES}.joints.{n}.position", f"{ch.JOINT_STATES}.joints.{n}.torque"} <= set(paths)
    assert f"{ch.MODE}.mode" in paths and f"{ch.BASE}.rpy_deg.pitch" in paths
    assert any(k.startswith("3D!") for k in layout["configById"])      # the base tilting, from /control_node/tf
    assert not _resolves(f"{ch.JOINT_STATES}.joints.no_such_joint.position", ((), ()), legged)
    assert not _resolves(f"{ch.JOINT_STATES}.joints.FL_hip_joint.target", ((), ()), legged)   # torque output


def test_cycle_windows_keep_a_spike_and_events_name_misses():
    conv = ch.Converter(offset_ns=1000, every=10)
    ring = {"cycle": list(range(0, 25)), "t_tick_ns": [100 * c for c in range(25)],
            "wake_latency_ns": [5] * 25, "cycle_time_ns": [7] * 25, "input_age_ns": [-1] * 25,
            "flags": [0] * 25, "seq": list(range(25))}
    ring["wake_latency_ns"][13] = 900_000
    ring["flags"][13] = rundir.FLAG_MISS
    ring["flags"][20] = ring["flags"][21] = rundir.FLAG_SAFE | rundir.FLAG_STALE
    out = conv.diagnostics({"t_ns": 0, "ring": ring, "rejected": {"malformed": 0}})
    cyc = [m for t, m, _ in out if t == ch.CYCLE]
    assert [(m["cycle_first"], m["cycle_last"]) for m in cyc] == [(0, 9), (10, 19)]     # 20-24 still open
    assert cyc[1]["wake_latency_ns"] == {"min": 5, "max": 900_000, "last": 5} and cyc[1]["misses"] == 1
    assert cyc[0]["input_age_ns"] is None
    ev = [m for t, m, _ in out if t == ch.EVENTS]
    assert [(e["kind"], e["cycle"], e["count"]) for e in ev] == [("miss", 13, 1), ("safe", 20, 2)]
    assert ev[1]["stale"] == 2
    out = conv.diagnostics({"t_ns": 0, "ring": {k: [] for k in ring}, "rejected": {"malformed": 3}})
    assert [(m["kind"], m["reason"], m["count"]) for t, m, _ in out] == [("rejected", "malformed", 3)]


@pytest.mark.slow
@needs_sdk
def test_export_writes_the_live_channels_for_the_layouts(tmp_path, pendulum_model):
    """A recorded launch exported to JSON MCAP carries the live view's topics and schemas."""
    from mcap.reader import make_reader
    ep_dir = make_endpoint_dir()
    cfg = write_config(tmp_path / "p.toml", ep_dir, pendulum_model, duration=3)
    r = run_cli("launch", cfg, "--run-dir", tmp_path / "run", "--record", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    rec = tmp_path / "run" / "record" / "recording.mcap"
    r = run_cli("export", rec, "--out", tmp_path / "out.mcap", "--every", "10")
    assert r.returncode == 0, r.stdout + r.stderr
    seen = {}
    with open(tmp_path / "out.mcap", "rb") as f:
        for schema, channel, msg in make_reader(f).iter_messages():
            if channel.topic in ch.TOPICS:
                seen.setdefault(channel.topic, (json.loads(schema.data), []))[1].append(json.loads(msg.data))
    assert {ch.OBSERVATION, ch.ACTION, ch.CYCLE, ch.SIM_PENDULUM} <= set(seen), sorted(seen)
    assert seen[ch.OBSERVATION][0] == ch.schema(ch.OBSERVATION, ["cos_theta", "sin_theta", "theta_dot"], ["torque"])
    assert seen[ch.ACTION][0] == ch.schema(ch.ACTION, ["cos_theta", "sin_theta", "theta_dot"], ["torque"])
    assert set(seen[ch.OBSERVATION][1][0]["x"]) == {"cos_theta", "sin_theta", "theta_dot"}
    assert set(seen[ch.ACTION][1][0]["u"]) == {"torque"}
    _, cyc = rundir.read_node_run(tmp_path / "run" / "node")
    by_cycle = {int(c): i for i, c in enumerate(cyc["cycle"])}
    for m in seen[ch.CYCLE][1]:
        idx = [by_cycle[c] for c in range(m["cycle_first"], m["cycle_last"] + 1)]
        assert m["cycle_time_ns"]["max"] == int(cyc["cycle_time_ns"][idx].max())
    sim = np.load(tmp_path / "run" / "sim" / "control.npz")          # the recorded physics state, exactly
    for m in seen[ch.SIM_PENDULUM][1]:
        assert m["step"] % 10 == 0
        assert (m["angle"], m["velocity"], m["torque"]) == (
            float(sim["theta"][m["step"]]), float(sim["omega"][m["step"]]), float(sim["u"][m["step"]]))
