"""control-node run: the node itself."""


def register(sub):
    p = sub.add_parser("run", help="run the node: fixed-rate loop over ZeroMQ with the compiled policy",
                       description="Load and verify the model, bind the sensor/action/diagnostics sockets, set the "
                                   "process up for real time, and run the control loop until SIGINT/SIGTERM or "
                                   "--duration. Prints `ready ...` once cycles run, and the run directory at exit. "
                                   "An argmax policy publishes class actions (protocol v1, `action`), a continuous "
                                   "one action vectors (v2, `u`: docs/protocol.md). [watchdog] safe_action "
                                   "defaults to \"auto\": class 0 for an argmax policy, \"offset\" (the head's "
                                   "action_offset) for a continuous one; also a class index, a list of floats "
                                   "(one per action) or \"hold\".")
    p.add_argument("--config", default=None, help="TOML config (default: the packaged node.toml)")
    p.add_argument("--model", default=None, help="model file (default: [node].model, models/iris.npz)")
    p.add_argument("--duration", type=float, default=None, metavar="S", help="seconds to run (default: until a signal)")
    p.add_argument("--rate", type=float, default=None, metavar="HZ", help="loop rate (default: [loop].rate_hz, 1000)")
    p.add_argument("--clock", choices=["timer", "sensor"], default=None,
                   help="timer: fixed rate; sensor: one cycle per frame arrival (default: [loop].clock)")
    p.add_argument("--cpu", default=None, help='core to pin the loop to: a number, "last" or "none"')
    p.add_argument("--run-dir", default=None, metavar="DIR", help="write the run directory here (default: runs/<id>/)")
    p.add_argument("--quiet", action="store_true", help="no start-up line on stderr")
    p.add_argument("--foxglove", nargs="?", const="", default=None, metavar="HOST:PORT",
                   help="also serve the live view to Foxglove / Lichtblick over WebSocket: a `control-node live` "
                        "process beside the node, off its loop core (the foxglove extra); here, else at [foxglove] "
                        "listen, else 127.0.0.1:8765. [foxglove] listen in the config turns it on without the flag")
    return p


def start_live(args, cfg, listen):
    """The `control-node live` helper process for ``run --foxglove``, started and listening (or a UserError
    with its own message when it could not start)."""
    import os
    import subprocess
    import sys
    import threading

    from control_node.errors import UserError
    from control_node.loop.realtime import choose_cpu
    cmd = [sys.executable, "-m", "control_node", "live", "--listen", listen[0], f"--key={listen[1]}",
           "--model", os.path.abspath(args.model or cfg["node"]["model"])]
    if args.config:
        cmd += ["--config", args.config]
    cpu = choose_cpu(cfg["realtime"]["cpu"])
    if cpu is not None:
        cmd += ["--avoid-cpu", str(cpu)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        print(f"[foxglove] {lines[-1]}", file=sys.stderr, flush=True)
        if line.startswith("foxglove listening"):
            break
    else:
        proc.wait()
        last = next((x for x in reversed(lines) if x.strip()), "")
        raise UserError(last.split("error: ", 1)[-1] if "error: " in last else
                        f"the live view did not start (exit code {proc.returncode})")

    def pump():
        for line in proc.stdout:
            print(f"[foxglove] {line.rstrip()}", file=sys.stderr, flush=True)
    threading.Thread(target=pump, name="foxglove-log", daemon=True).start()
    return proc


def stop_live(proc):
    import signal
    import subprocess
    for sig, wait in ((signal.SIGINT, 5.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            break
        try:
            os_killpg(proc.pid, sig)
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            pass


def os_killpg(pid, sig):
    import os
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def run(args):
    from control_node.config import load_config
    from control_node.node import Node
    cpu = args.cpu
    if cpu is not None and cpu not in ("last", "none"):
        cpu = int(cpu)
    cfg = load_config(args.config, {"loop.duration_s": args.duration, "loop.rate_hz": args.rate,
                                    "loop.clock": args.clock, "realtime.cpu": cpu})
    live = None
    if args.foxglove is not None or cfg["foxglove"]["listen"]:
        from control_node.launch import foxglove_listen
        from control_node.live.server import require_sdk
        require_sdk()
        listen = foxglove_listen(args.config, args.foxglove) or ("127.0.0.1:8765", "--foxglove")
        live = start_live(args, cfg, listen)
    try:
        run_dir = Node(cfg, model_path=args.model, run_dir=args.run_dir, quiet=args.quiet).run()
    finally:
        if live is not None:
            stop_live(live)
    import json
    import os
    with open(os.path.join(run_dir, "summary.json")) as f:
        s = json.load(f)
    w = s["wake_latency_ns"]
    if w["count"]:
        print(f"cycles {s['cycles']}  misses {s['deadline_misses']}  stale {s['stale_cycles']}  "
              f"rejected {s['rejected_total']}  wake latency us p50 {w['p50'] / 1e3:.1f} p99 {w['p99'] / 1e3:.1f} "
              f"max {w['max'] / 1e3:.1f}")
    else:
        print(f"cycles {s['cycles']}  misses {s['deadline_misses']}  stale {s['stale_cycles']}  "
              f"rejected {s['rejected_total']}")
    print(f"run directory: {run_dir}", flush=True)
    return 0
