"""``control-node launch``: start the node, then the simulator (or a replay) and optionally the recorder.

Like ``ros2 launch``: each child is ``sys.executable -m control_node VERB ...`` in its own process group,
its output forwarded with a ``[name]`` prefix. The node goes first and the others start once it printed
its ``ready`` line. Everything stops after the duration or on Ctrl-C: SIGINT to each child's group, then
SIGTERM, then SIGKILL after timeouts; stale ipc socket files are removed. A child that dies unexpectedly
is reported (exit code or signal) and the others are stopped, unless it has ``restart = true``.

The children started after the node run on every allowed core but the one its loop is pinned to (the
``loop_cpu`` of its ready line; ``[launch] keep_off_loop_core = false`` turns this off): a simulator
preempted by the loop's spin sends its frames late, and the phase lock then puts every tick later.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

STOP_TIMEOUTS = (5.0, 3.0, 2.0)  # after SIGINT, after SIGTERM, after SIGKILL
MAX_RESTARTS = 3

_print_lock = threading.Lock()


def say(msg, name="launch"):
    with _print_lock:
        print(f"[{name}] {msg}", flush=True)


def describe_exit(rc):
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return f"killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


class Child:
    def __init__(self, name, cmd, restart=False, ready_prefix=None, env=None):
        self.name, self.cmd, self.restart = name, cmd, restart
        self.ready_prefix = ready_prefix
        self.env = env
        self.proc = None
        self.thread = None
        self.ready = threading.Event()
        self.stopping = False
        self.restarts = 0
        self.last_lines = []
        self.pids = []
        self.ready_line = None
        self.cpus = None            # cores this child may run on (None: inherit launch's)

    def start(self):
        self.ready.clear()
        self.stopping = False
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     bufsize=1, start_new_session=True, env=self.env)
        self.pids.append(self.proc.pid)
        if self.cpus:
            _set_affinity(self.proc.pid, self.cpus, self.name)
        self.thread = threading.Thread(target=self._pump, name=f"log-{self.name}", daemon=True)
        self.thread.start()
        if self.ready_prefix is None:
            self.ready.set()

    def _pump(self):
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.last_lines = (self.last_lines + [line])[-20:]
            own = f"[{self.name}] "       # children that prefix their own lines: don't say it twice
            say(line[len(own):] if line.startswith(own) else line, self.name)
            if self.ready_prefix and line.startswith(self.ready_prefix):
                self.ready_line = line
                self.ready.set()

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal_group(self, sig):
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self):
        """SIGINT, then SIGTERM, then SIGKILL (whole process group); returns the exit code."""
        if self.proc is None:
            return None
        self.stopping = True
        for sig, timeout in zip((signal.SIGINT, signal.SIGTERM, signal.SIGKILL), STOP_TIMEOUTS):
            if self.proc.poll() is not None:
                break
            if sig != signal.SIGINT:
                say(f"{self.name} did not stop; sending {sig.name}")
            self.signal_group(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        # nothing of the group may outlive it
        self.signal_group(signal.SIGKILL)
        if self.thread is not None:
            self.thread.join(5.0)
        return self.proc.poll()


def _set_affinity(pid, cpus, name):
    """Move a just-started child onto ``cpus``: its main thread first (threads it starts later, the ZMQ I/O
    threads among them, inherit the mask), then any thread it already has."""
    try:
        os.sched_setaffinity(pid, cpus)
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
    except (ProcessLookupError, FileNotFoundError):
        return                      # it already exited: the launch loop reports that
    except OSError as e:
        say(f"could not keep {name} on cores {_cores(cpus)}: {e}")
        return
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass                    # that thread has ended


def _cores(cpus):
    return ",".join(map(str, sorted(cpus)))


def cores_off_loop(ready_line):
    """The cores a child beside the node should use: every core launch may use but the node's loop core
    (``loop_cpu=N`` in the node's ready line). None when the loop is not pinned, the line does not say,
    or no other core is left."""
    fields = dict(f.split("=", 1) for f in (ready_line or "").split() if "=" in f)
    try:
        cpu = int(fields.get("loop_cpu", ""))
    except ValueError:
        return None
    rest = set(os.sched_getaffinity(0)) - {cpu}
    return (cpu, rest) if rest else None


def read_launch_config(path):
    import tomllib

    from control_node.errors import UserError
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise UserError(f"launch config {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"launch config {path}: not valid TOML ({e})") from None


def _load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def summary_lines(run_dir, driver):
    lines = []
    node = _load_json(os.path.join(run_dir, "node", "summary.json"))
    if node:
        w = node.get("wake_latency_ns") or {}
        us = lambda v: "n/a" if v is None else f"{v / 1e3:.1f} us"  # noqa: E731
        lines.append(f"node: {node.get('cycles', '?')} cycles, wake-up latency p50 {us(w.get('p50'))} "
                     f"p99 {us(w.get('p99'))} max {us(w.get('max'))}, deadline misses "
                     f"{node.get('deadline_misses', '?')}")
    else:
        lines.append("node: no summary.json")
    sim = _load_json(os.path.join(run_dir, driver, "summary.json"))
    if sim:
        rt = sim.get("round_trip_ns") or {}
        ms = lambda v: "n/a" if v is None else f"{v / 1e6:.3f} ms"  # noqa: E731
        acc = sim.get("accuracy")
        held = (f"answered with a held action {sim['frames_held']}, " if sim.get("frames_held") else "")
        lines.append(f"{driver}: {sim.get('frames_sent')} frames, accuracy "
                     f"{'n/a' if acc is None else f'{acc:.4f}'}, lost {sim.get('actions_lost')}, {held}"
                     f"round trip p50 {ms(rt.get('p50'))} p99 {ms(rt.get('p99'))}")
        if isinstance(sim.get("control"), dict) and sim["control"].get("line"):
            lines.append(f"{driver}: {sim['control']['line']}")          # the closed loop's score
    elif driver != "robot":
        lines.append(f"{driver}: no summary.json")
    br = _load_json(os.path.join(run_dir, "bridge", "summary.json"))
    if br:
        wh = ", ".join(f"{k} {v}" for k, v in (br.get("frames_withheld") or {}).items()) or "none"
        p99 = (br.get("callback_latency_ns") or {}).get("p99")
        p99 = "n/a" if p99 is None else f"{p99 / 1e3:.0f} us"
        lines.append(f"bridge: frames sent {br.get('frames_sent')}, withheld {wh}, actions published "
                     f"{br.get('actions_published')}, callback p99 {p99}, CPU {100 * br.get('cpu_share', 0):.0f} %")
    return lines


def remove_stale_sockets(endpoints):
    """Socket files our children left (a killed node cannot unlink its own); a file another process listens
    on is someone else's node, and stays."""
    from control_node.endpoints import ipc_listened, ipc_path
    for ep in endpoints.values():
        p = ipc_path(ep)
        if p and os.path.exists(p) and not ipc_listened(p):
            try:
                os.unlink(p)
                say(f"removed stale socket file {p}")
            except OSError:
                pass


def _continuous(model) -> bool:
    """True when the model file holds a continuous policy (read without building the kernel)."""
    from control_node.kernels import ModelFileError, load_model
    try:
        return load_model(model).head == "continuous"
    except (OSError, ModelFileError):
        return False        # the node refuses a bad model itself, naming the field


DEFAULT_FOXGLOVE = "127.0.0.1:8765"


def foxglove_listen(config, flag=None):
    """Where the live view listens, as (value, key naming it), or None for no live view: ``flag`` (the
    ``--foxglove`` value; "" when given without one: the config's [foxglove] listen, else the default),
    else the config's ``[foxglove] listen`` ("" or absent: off). A malformed address is refused here,
    before anything starts, naming the key."""
    from control_node.config import listen_problem
    from control_node.errors import UserError
    raw = read_launch_config(config) if config else {}
    listen = (raw.get("foxglove") or {}).get("listen", "")
    if flag is not None and flag != "":
        value, key = flag, "--foxglove"
    elif listen:
        value, key = listen, "[foxglove] listen"
    elif flag == "":
        value, key = DEFAULT_FOXGLOVE, "--foxglove"
    else:
        return None
    problem = listen_problem(value)
    if problem:
        raise UserError(f"{key} = {value!r}: {problem}. Fix: an address and port such as \"{DEFAULT_FOXGLOVE}\"")
    return value, key


def launch(config=None, duration=None, record=None, run_dir=None, ensure_model=None, foxglove=None):
    """Run node + driver (+ recorder) from a launch config (default: the packaged demo.toml).

    ``ensure_model(path, task)``: called with the node's model path and ``[launch] train`` (the task that
    makes the model: "iris" or "pendulum", default "iris") before the node starts, when the config
    does not give the node's own command (the CLI passes one that trains the iris policy if missing).

    ``foxglove``: (HOST:PORT, the key that named it) from :func:`foxglove_listen`: the live view
    (``control-node live``) starts after the node, off its loop core, and the simulator publishes its
    sensor tap and state stream for it."""
    from control_node.errors import UserError
    from control_node.config import client_endpoints as load_endpoints
    from control_node.endpoints import PACKAGE_SCHEME, default_config
    config = config or default_config("demo.toml")
    raw = read_launch_config(config)
    lc = raw.get("launch", {}) or {}
    ch = raw.get("children", {}) or {}
    duration = float(duration if duration is not None else lc.get("duration", 10.0))
    model = (raw.get("node", {}) or {}).get("model", os.path.join("models", "iris.npz"))
    if isinstance(model, str) and model.startswith(PACKAGE_SCHEME):
        from control_node.endpoints import packaged_file
        try:
            model = packaged_file(model)        # shipped: never trained here
        except FileNotFoundError as e:
            raise UserError(f"{config}: [node] model: {e}. Fix: reinstall control-node, or name a model file") from None
    node_cfg = ch.get("node", {}) or {}
    sim_cfg = ch.get("sim", {}) or {}
    rep_cfg = ch.get("replay", {}) or {}
    rec_cfg = ch.get("record", {}) or {}
    use_replay = bool(rep_cfg.get("enabled", False))
    use_record = bool(rec_cfg.get("enabled", False)) if record is None else record
    keep_off = lc.get("keep_off_loop_core", True)
    if not isinstance(keep_off, bool):
        raise UserError(f"{config}: [launch] keep_off_loop_core must be true or false, not {keep_off!r}")
    eps = load_endpoints(config)
    if "command" not in node_cfg and ensure_model is not None:
        ensure_model(model, str(lc.get("train", "iris")))
    run_root = lc.get("run_root", "runs")
    run_dir = run_dir or os.path.join(run_root, time.strftime("%Y%m%d-%H%M%S") + f"-launch-{os.getpid()}")
    os.makedirs(run_dir, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    py = [sys.executable, "-m", "control_node"]

    node_cmd = list(node_cfg.get("command") or (py + ["run", "--config", config]))
    node_cmd += ["--run-dir", os.path.join(run_dir, "node"), *map(str, node_cfg.get("args", []))]
    children = [Child("node", node_cmd, bool(node_cfg.get("restart", False)), ready_prefix="ready ", env=env)]
    if foxglove is not None:
        fx_cmd = py + ["live", "--config", config, "--listen", str(foxglove[0]), f"--key={foxglove[1]}",
                       "--model", os.path.abspath(model), *map(str, (ch.get("foxglove", {}) or {}).get("args", []))]
        children.append(Child("foxglove", fx_cmd, False, ready_prefix="foxglove listening", env=env))
    if use_record:
        rc_cmd = py + ["record", "--config", config, "--out", os.path.join(run_dir, "record", "recording.mcap"),
                       *map(str, rec_cfg.get("args", []))]
        children.append(Child("record", rc_cmd, bool(rec_cfg.get("restart", False)),
                              ready_prefix="recording to ", env=env))
    bridge = lc.get("bridge")
    if bridge is not None:
        if bridge != "ros2":
            raise UserError(f"{config}: [launch] bridge = {bridge!r}: the bridge that exists is \"ros2\" "
                            "(or drop the key)")
        br_cfg = ch.get("bridge", {}) or {}
        br_cmd = py + ["bridge", "ros2", "--config", config, "--run-dir", os.path.join(run_dir, "bridge"),
                       *map(str, br_cfg.get("args", []))]
        children.append(Child("bridge", br_cmd, bool(br_cfg.get("restart", False)), ready_prefix="ready bridge",
                              env=env))
    driver = "replay" if use_replay else "sim"
    # a real robot instead of the simulator ([children.sim] enabled = false, with [launch] bridge): no
    # driver child; the run lasts `duration`
    no_driver = sim_cfg.get("enabled", True) is False and not use_replay
    if no_driver and bridge is None:
        raise UserError(f"{config}: [children.sim] enabled = false leaves nothing to drive the node: add "
                        "[launch] bridge = \"ros2\" (a real robot) or enable the sim")
    if no_driver:
        driver = None
    elif use_replay:
        if not rep_cfg.get("file"):
            raise UserError(f"{config}: [children.replay] needs file = \"recording.mcap\"")
        d_cmd = py + ["replay", str(rep_cfg["file"]), "--config", config, "--run-dir", os.path.join(run_dir, driver),
                      *map(str, rep_cfg.get("args", []))]
        d_restart = bool(rep_cfg.get("restart", False))
    elif not no_driver:
        sim_args = [str(a) for a in sim_cfg.get("args", [])]
        d_cmd = py + ["sim", *sim_args, "--config", config,
                      "--run-dir", os.path.join(run_dir, driver), "--duration", f"{duration:g}"]
        if "command" not in node_cfg and not {"--model", "--features"} & set(sim_args) and sim_args[:1] != \
                ["mujoco"] and _continuous(model):
            # a continuous policy: the sim streams its observation width and checks its actions
            d_cmd += ["--model", os.path.abspath(model)]
        d_restart = bool(sim_cfg.get("restart", False))
    if (use_record or foxglove is not None) and driver:
        d_cmd.append("--tap")
    if (use_record or foxglove is not None) and driver == "sim" and sim_cfg.get("args", [None])[:1] == ["pendulum"]:
        d_cmd.append("--state")             # the pendulum's angle, velocity and torque: /sim/pendulum
    if driver:
        children.append(Child(driver, d_cmd, d_restart, env=env))

    stop = threading.Event()
    old = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    rc = 0
    started = []
    try:
        say(f"config {config}; run directory {run_dir}; duration {duration:g} s")
        for c in children:
            say(f"starting {c.name}: {' '.join(c.cmd)}")
            c.start()
            say(f"started {c.name} (pid {c.proc.pid})")
            started.append(c)
            while not c.ready.wait(0.05):
                if stop.is_set():
                    break
                if not c.alive():
                    c.thread.join(2.0)
                    say(f"{c.name} exited before it was ready ({describe_exit(c.proc.poll())})")
                    rc = 1
                    break
            if stop.is_set() or rc:
                break
            if c.name == "node" and keep_off:
                off = cores_off_loop(c.ready_line)
                if off:
                    say(f"the node's loop runs on core {off[0]}: "
                        f"{', '.join(o.name for o in children[1:])} on cores {_cores(off[1])}")
                    for o in children[1:]:
                        o.cpus = off[1]
        # the driver stops itself after `duration` (+15 s is a backstop); without one, `duration` is the run
        t_end = time.monotonic() + duration + (15.0 if driver else 0.0)
        while not stop.is_set() and not rc:
            if time.monotonic() >= t_end:
                if driver:
                    say(f"{driver} still running after {duration:g} s + 15 s: stopping everything")
                break
            drv = children[-1] if driver else None
            if drv is not None and drv.proc is not None and drv.proc.poll() == 0:
                break  # normal end
            for c in started:
                code = c.proc.poll()
                if code is None or (c is drv and code == 0):
                    continue
                c.thread.join(2.0)
                if c.restart and c.restarts < MAX_RESTARTS:
                    c.restarts += 1
                    say(f"{c.name} died ({describe_exit(code)}); restarting ({c.restarts}/{MAX_RESTARTS})")
                    c.start()
                    say(f"started {c.name} (pid {c.proc.pid})")
                    continue
                say(f"{c.name} died unexpectedly ({describe_exit(code)}); stopping the others")
                rc = 1
                break
            time.sleep(0.05)
        if stop.is_set():
            say("interrupted: stopping everything")
            rc = rc or 130
    finally:
        for c in reversed(started):  # driver first, then the recorder, then the node
            if c.alive():
                say(f"stopping {c.name}")
            code = c.stop()
            if c.stopping and code not in (0, None, -signal.SIGINT, 130) and rc == 0 and c.name != "node":
                say(f"{c.name} ended with {describe_exit(code)}")
        remove_stale_sockets(eps)
        for s, h in old.items():
            signal.signal(s, h)
    for line in summary_lines(run_dir, driver or "robot"):
        say(line)
    if use_record:
        say(f"recording: {os.path.join(run_dir, 'record', 'recording.mcap')}")
    _point_latest(run_dir)
    print(f"run directory: {run_dir}", flush=True)
    return rc


def _point_latest(run_dir):
    """<run_root>/latest -> this run, so `control-node report runs/latest` finds it."""
    latest = os.path.join(os.path.dirname(os.path.abspath(run_dir)), "latest")
    try:
        if os.path.islink(latest):
            os.unlink(latest)
        if not os.path.exists(latest):
            os.symlink(os.path.basename(os.path.normpath(run_dir)), latest)
    except OSError:
        pass
