"""control-node bench control: how the pendulum's control score degrades with added delay and with missed
policy ticks -- the picture of why latency and jitter matter.

The trained pendulum policy (``control-node train --task pendulum``, or trained here in a few seconds) runs
through the compiled kernel at 50 Hz inside a 1 kHz RK4 simulation of the pendulum, in one process, so that
the only things varied are the ones named: a transport delay added between observation and torque, a
share of policy ticks missed at random, and periodic stalls (no new action for S ms every 500 ms, as a host
stall of the loop does); a missed tick holds the previous torque, as the node holds its action. Each
setting is scored from several starts (time to upright, RMS angle error after settling, falls, effort).
``--through-node`` adds the delay sweep through a real node: for each delay, `control-node launch` of
the packaged pendulum config (the node at 1 kHz, the same policy at 50 Hz via ``policy_rate_hz``, the
pendulum simulator over ZeroMQ with ``--delay-us``), scored by the simulator, beside the in-process result
for the same delay and start: what the real loop, sockets and scheduling add.
``--weights-rows`` scores narrower weight storage (kernels/weights.py) in closed loop: the pendulum MLP and
the GRU pendulum policy with f32, f16 and int8 weights, each through a real node (`control-node launch`,
no added delay, from each of the node starts), the error measured at storage time beside the score.
"""
from __future__ import annotations

import argparse

import numpy as np

from control_node.bench.common import console, machine_info, machine_lines, print_table, write_json

DELAYS_MS = (0, 5, 10, 20, 40, 80, 120, 160, 200, 300)
MISS_RATES = (0.0, 0.1, 0.3, 0.6, 0.8, 0.9, 0.95)
STALLS_MS = (0, 20, 50, 100, 200, 300, 400)       # one stall of this length every 500 ms
STARTS = (np.pi, 2.5, -2.0, 1.0)


def _policy(model):
    from control_node.kernels import Policy
    if model:
        return Policy.load(model)
    from control_node.train.pendulum import train_pendulum
    return Policy(train_pendulum())


def run_setting(policy, delay_ms=0.0, miss_rate=0.0, stall_ms=0.0, seed=0, duration_s=10.0, dt=0.001, every=20,
                starts=STARTS):
    from control_node.sim import pendulum as P
    rng = np.random.default_rng(seed)
    out = np.zeros(1)
    held = [0.0]
    tick = [0]

    def controller(obs):
        t_ms = tick[0] * every * dt * 1000
        tick[0] += 1
        if rng.random() < miss_rate or (stall_ms and (t_ms % 500) < stall_ms):
            return held[0]                       # a missed tick: the last action stays
        policy.act_into(np.ascontiguousarray(obs), out)
        held[0] = float(out[0])
        return held[0]
    scores = []
    for th0 in starts:
        held[0], tick[0] = 0.0, 0
        t, th, u = P.rollout(controller, duration_s=duration_s, dt=dt, control_every=every, theta0=th0,
                             delay_steps=int(round(delay_ms / 1000 / dt)))
        scores.append(P.score(t, th, u))
    ups = [s.time_to_upright_s for s in scores if s.time_to_upright_s is not None]
    rms = [s.rms_error_rad for s in scores if s.rms_error_rad is not None]
    return {"delay_ms": delay_ms, "miss_rate": miss_rate, "stall_ms": stall_ms, "upright_runs": len(ups), "runs": len(scores),
            "time_to_upright_s": float(np.mean(ups)) if ups else None,
            "rms_error_deg": float(np.degrees(np.mean(rms))) if rms else None,
            "falls": int(sum(s.falls for s in scores)), "effort": float(np.mean([s.effort for s in scores]))}


NODE_DELAYS_MS = (0, 40, 80, 120, 160, 300)
NODE_STARTS = (np.pi, -2.0)


def launch_summaries(r, run_dir):
    """(sim, node) summary.json of a finished ``control-node launch`` run (``r``: its CompletedProcess), or
    RuntimeError with the end of its output when it failed."""
    import json
    import os
    if r.returncode != 0:
        raise RuntimeError(f"launch failed ({r.returncode}): {r.stdout[-2000:]}{r.stderr[-2000:]}")
    with open(os.path.join(run_dir, "sim", "summary.json")) as f:
        sim = json.load(f)
    with open(os.path.join(run_dir, "node", "summary.json")) as f:
        node = json.load(f)
    return sim, node


def run_through_node(model_path, delay_ms, theta0, duration_s, tmp):
    """One `control-node launch` of node + `sim pendulum` (policy at 50 Hz in the 1 kHz loop) with
    ``delay_ms`` of added transport delay, from ``theta0``; the simulator's control score."""
    import os
    import subprocess
    import sys

    from control_node.bench.harness import CHILD_CWD, child_env, make_endpoint_dir
    ep = make_endpoint_dir()
    cfg = os.path.join(tmp, f"pendulum-{delay_ms:g}-{theta0:.2f}.toml")
    with open(cfg, "w") as f:
        f.write(f'[node]\nmodel = "{model_path}"\n[endpoints]\n'
                + "".join(f'{k} = "ipc://{ep}/{k}"\n' for k in ("sensor", "action", "diagnostics"))
                + '[loop]\nrate_hz = 1000.0\npolicy_rate_hz = 50.0\nphase_lock = true\n'
                + '[watchdog]\nstale_after_ms = 20.0\nsafe_action = "offset"\n'
                + f'[children.sim]\nargs = ["pendulum", "--delay-us", "{int(delay_ms * 1000)}", "--theta0", "{theta0}"]\n')
    run_dir = os.path.join(tmp, os.path.basename(cfg)[:-5])
    r = subprocess.run([sys.executable, "-m", "control_node", "launch", cfg, "--duration", str(duration_s),
                        "--run-dir", run_dir], cwd=CHILD_CWD, env=child_env(), capture_output=True, text=True,
                       timeout=duration_s + 120)
    sim, node = launch_summaries(r, run_dir)
    c = sim["control"]
    return {"delay_ms": delay_ms, "theta0": theta0, "time_to_upright_s": c["time_to_upright_s"],
            "rms_error_deg": None if c["rms_error_rad"] is None else float(np.degrees(c["rms_error_rad"])),
            "falls": c["falls"], "effort": c["effort"], "deadline_misses": node["deadline_misses"],
            "round_trip_p50_ms": (sim.get("round_trip_ns") or {}).get("p50", 0) / 1e6}


WEIGHT_STORAGES = ("f32", "f16", "int8")


def weights_rows(mlp_spec, gru_spec, duration_s, tmp, starts=NODE_STARTS, log=print):
    """Control score through a real node of each policy with each storage in WEIGHT_STORAGES (float32
    first: the score to compare with). Each storage is written as the import would write it: the error
    against the float32 policy measured (kernels.importers.proof.store_weights) and kept in the model file, and the
    node's summary.json says which weights ran (checked here)."""
    import json
    import os

    from control_node.kernels import Policy, save_model
    from control_node.kernels.importers.proof import store_weights
    rows = []
    for label, spec in (("pendulum MLP", mlp_spec), ("pendulum GRU", gru_spec)):
        if spec is None:
            continue
        for w in WEIGHT_STORAGES:
            stored = store_weights(spec, w, policy_class=Policy, tolerance=float("inf"), n_random=500)
            path = os.path.join(tmp, f"{label.replace(' ', '-')}-{w}.npz")
            save_model(stored, path)
            for th0 in starts:
                log(f"{label} {w} weights, start {th0:.2f} rad, {duration_s:g} s through a real node ...")
                r = run_through_node(path, 0.0, th0, duration_s, tmp)
                run_dir = os.path.join(tmp, f"pendulum-0-{th0:.2f}")
                with open(os.path.join(run_dir, "node", "summary.json")) as f:
                    ran = (json.load(f).get("policy") or {}).get("weights", "f32")
                if ran != w:
                    raise SystemExit(f"bench control: the node ran {ran} weights, {w} were written")
                err = stored.weights_error or {}
                rows.append({"policy": label, "weights": w, "theta0": th0, **r, "weights_ran": ran,
                             "error_max_abs": err.get("max_abs", 0.0), "error_max_rel": err.get("max_rel", 0.0)})
    return rows


def plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    for ax, key, rows, xlabel in ((axes[0], "delay_ms", res["delay"], "added delay (ms)"),
                                  (axes[1], "miss_rate", res["misses"], "share of policy ticks missed at random"),
                                  (axes[2], "stall_ms", res["stalls"], "stall every 500 ms (ms, action held)")):
        x = [r[key] for r in rows]
        up = [r["time_to_upright_s"] if r["upright_runs"] == r["runs"] else np.nan for r in rows]
        rms = [r["rms_error_deg"] if r["rms_error_deg"] is not None else np.nan for r in rows]
        ax.plot(x, up, "o-", label="time to upright (s), all starts up")
        ax2 = ax.twinx()
        ax2.plot(x, rms, "s--", color="tab:red", label="RMS angle error after settling (deg)")
        fails = [r[key] for r in rows if r["upright_runs"] < r["runs"] or r["falls"]]
        for f in fails:
            ax.axvline(f, color="grey", alpha=0.3)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("time to upright (s)")
        ax2.set_ylabel("RMS error (deg)", color="tab:red")
        ax.set_title("grey: a start never got up, or fell")
    fig.suptitle("pendulum, 50 Hz policy in a 1 kHz simulation: score against delay and missed ticks")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="control-node bench control", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="pendulum model file (default: train one now, a few seconds)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--plot", help="write the picture here (PNG)")
    ap.add_argument("--through-node", action="store_true",
                    help=f"also sweep the delay ({', '.join(f'{d:g}' for d in NODE_DELAYS_MS)} ms) through a real node "
                         f"and the pendulum simulator, 10 s from each of {len(NODE_STARTS)} starts")
    ap.add_argument("--weights-rows", action="store_true",
                    help="score f32 / f16 / int8 weights of the pendulum MLP and the GRU pendulum policy through a "
                         "real node (no added delay; the GRU is trained here unless --gru-model is given)")
    ap.add_argument("--gru-model", help="GRU pendulum model file for --weights-rows (default: train one now)")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per real-node run (default: %(default)s)")
    ap.add_argument("--no-sweeps", action="store_true",
                    help="skip the in-process delay / miss / stall sweeps (e.g. with --weights-rows only)")
    ap.add_argument("--robot", choices=("pendulum", "quadruped"), default="pendulum",
                    help="quadruped: the walking policy through the node on the MuJoCo quadruped (`launch "
                         "quadruped`) against added latency, dropped commands, host stalls on the loop's core, and "
                         "the node's PD at 1 kHz against PD in the simulator; --duration s each (needs mujoco)")
    a = ap.parse_args(argv)
    if a.robot == "quadruped":
        return quadruped_main(a)
    policy = _policy(a.model)
    res = {"machine": machine_info(), "model": policy.sha256, "starts_rad": list(STARTS),
           "delay": [] if a.no_sweeps else [run_setting(policy, delay_ms=d) for d in DELAYS_MS],
           "misses": [] if a.no_sweeps else [run_setting(policy, miss_rate=m) for m in MISS_RATES],
           "stalls": [] if a.no_sweeps else [run_setting(policy, stall_ms=st) for st in STALLS_MS]}
    con = console()
    for line in machine_lines(res["machine"]):
        con.print(line)
    cols = ["setting", "starts upright", "time to upright", "RMS error after settling", "falls", "effort (N m)"]

    def row(r, label):
        return [label, f"{r['upright_runs']}/{r['runs']}",
                "-" if r["time_to_upright_s"] is None else f"{r['time_to_upright_s']:.2f} s",
                "-" if r["rms_error_deg"] is None else f"{r['rms_error_deg']:.2f} deg", str(r["falls"]),
                f"{r['effort']:.2f}"]
    if not a.no_sweeps:
        print_table("added transport delay", cols, [row(r, f"{r['delay_ms']:g} ms") for r in res["delay"]], con)
        print_table("missed policy ticks (action held)", cols,
                    [row(r, f"{r['miss_rate']:.0%}") for r in res["misses"]], con)
        print_table("a stall every 500 ms (no new action for its length)", cols,
                    [row(r, f"{r['stall_ms']:g} ms") for r in res["stalls"]], con)
    if a.weights_rows:
        import tempfile

        from control_node.kernels import load_model
        if a.gru_model:
            gru = load_model(a.gru_model)
        else:
            from control_node.train.pendulum_gru import train_pendulum_gru
            gru = train_pendulum_gru(log=lambda m: None)
        tmp = tempfile.mkdtemp(prefix="cn-bench-control-weights-")
        wr = weights_rows(policy.spec, gru, a.duration, tmp, log=lambda m: con.print(m))
        res["weights_rows"] = wr

        def score(r):
            return ("never up" if r["time_to_upright_s"] is None else
                    f"up {r['time_to_upright_s']:.2f} s, RMS {r['rms_error_deg']:.2f} deg") + \
                (f", {r['falls']} falls" if r["falls"] else "")
        print_table("weight storage, through a real node (1 kHz loop, policy 50 Hz, no added delay)",
                    ["policy", "weights", "start (rad)", "control score", "error vs f32 (of range)", "node misses"],
                    [[r["policy"], r["weights"], f"{r['theta0']:.2f}", score(r),
                      "exact" if r["weights"] == "f32" else f"{r['error_max_rel']:.2g}", str(r["deadline_misses"])]
                     for r in wr], con)
    if a.through_node:
        import os
        import tempfile

        from control_node.kernels import save_model
        tmp = tempfile.mkdtemp(prefix="cn-bench-control-")
        model_path = os.path.abspath(a.model) if a.model else os.path.join(tmp, "pendulum.npz")
        if not a.model:
            save_model(policy.spec, model_path)
        rows = []
        from rich.progress import Progress
        with Progress(console=con, transient=True) as bar:
            task = bar.add_task("through a real node", total=len(NODE_DELAYS_MS) * len(NODE_STARTS))
            for d in NODE_DELAYS_MS:
                for th0 in NODE_STARTS:
                    node_r = run_through_node(model_path, d, th0, 10.0, tmp)
                    off = run_setting(policy, delay_ms=d, starts=(th0,))
                    rows.append({"node": node_r, "in_process": off})
                    bar.advance(task)
        res["through_node"] = rows

        def fmt(up, rms, falls):
            return ("never up" if up is None else f"up {up:.2f} s, RMS {rms:.2f} deg") + (f", {falls} falls" if falls else "")
        print_table("added delay, through a real node (1 kHz loop, policy 50 Hz, ZeroMQ) vs in-process",
                    ["delay", "start (rad)", "real node", "in-process", "node misses", "round trip p50"],
                    [[f"{r['node']['delay_ms']:g} ms", f"{r['node']['theta0']:.2f}",
                      fmt(r["node"]["time_to_upright_s"], r["node"]["rms_error_deg"], r["node"]["falls"]),
                      fmt(r["in_process"]["time_to_upright_s"], r["in_process"]["rms_error_deg"], r["in_process"]["falls"]),
                      str(r["node"]["deadline_misses"]), f"{r['node']['round_trip_p50_ms']:.2f} ms"] for r in rows], con)
    if a.plot:
        plot(res, a.plot)
        con.print(f"plot: {a.plot}")
    if a.json:
        write_json(a.json, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# ---- the quadruped: the walking policy through the node, on the MuJoCo robot (--robot quadruped) ----------
QUAD_DELAYS_MS = (0, 1, 2, 5, 10)
QUAD_DROPS = (0.1, 0.3)
QUAD_STALLS_MS = (5, 20)            # a SCHED_FIFO burst on the loop's core of this length, every 500 ms
STALLER = r"""
import os, sys, time
cpu, burst_ms, every_s, end = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), time.monotonic() + float(sys.argv[4])
os.sched_setaffinity(0, {cpu})
os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(90))     # above the node's loop (80): the loop stalls
while time.monotonic() < end:
    t0 = time.monotonic()
    while time.monotonic() - t0 < burst_ms / 1e3:
        pass
    time.sleep(every_s)
"""


def quadruped_row(label, tmp, duration_s, sim_args=(), legged=None, stall_ms=0.0):
    """One `control-node launch` of the packaged quadruped config with ``sim_args`` added to `sim mujoco`'s
    (``legged``: TOML lines replacing [legged] keys, e.g. the output), optionally beside a staller on the loop's
    core; the simulator's walk score and the node's misses."""
    import json
    import os
    import re
    import subprocess
    import sys
    from importlib import resources

    from control_node.bench.harness import CHILD_CWD, child_env, make_endpoint_dir
    text = (resources.files("control_node.configs") / "quadruped.toml").read_text()
    ep = make_endpoint_dir()
    text = re.sub(r'ipc://\{runtime_dir\}', f"ipc://{ep}", text)
    at = text.index("\n[children.sim]\n")           # the table, not a comment naming it
    args = re.compile(r'^args = (\[.*?\])$', re.M).search(text, at)
    new_args = json.loads(args.group(1)) + [str(a) for a in sim_args]
    text = text[:args.start()] + f"args = {json.dumps(new_args)}" + text[args.end():]
    for key, value in (legged or {}).items():       # keys of [legged] itself (its first lines)
        text = re.sub(rf'^{key} = [^#\n]*', f"{key} = {value} ", text, count=1, flags=re.M)
    cfg = os.path.join(tmp, re.sub(r"\W+", "_", label) + ".toml")
    with open(cfg, "w") as f:
        f.write(text)
    run_dir = cfg[:-5]
    staller = None
    if stall_ms:
        cpu = max(os.sched_getaffinity(0))          # [realtime] cpu = "last": the loop's core
        staller = subprocess.Popen([sys.executable, "-c", STALLER, str(cpu), str(stall_ms), "0.5", str(duration_s + 8)])
    try:
        r = subprocess.run([sys.executable, "-m", "control_node", "launch", cfg, "--duration", str(duration_s),
                            "--run-dir", run_dir], cwd=CHILD_CWD, env=child_env(), capture_output=True, text=True,
                           timeout=duration_s + 180)
    finally:
        if staller is not None:
            staller.kill()
            staller.wait()
    sim, node = launch_summaries(r, run_dir)
    sc = sim["score"]
    return {"setting": label, "distance_m": sc["distance_m"], "vx": sc["mean_velocity"]["vx"],
            "command_vx": sc["mean_command"]["vx"], "falls": sc["falls"], "tracking_rms_vx": sc["tracking_rms"]["vx"],
            "policy_s": sim["policy_s"], "deadline_misses": node["deadline_misses"],
            "wake_p99_us": node["wake_latency_ns"]["p99"] / 1e3, "line": sim["control"]["line"]}


def quadruped_main(a) -> int:
    import tempfile
    con = console()
    res = {"machine": machine_info(), "robot": "quadruped (sim/models/quadruped.xml, train/quadruped_policy.onnx)",
           "duration_s": a.duration, "rows": []}
    for line in machine_lines(res["machine"]):
        con.print(line)
    tmp = tempfile.mkdtemp(prefix="cn-bench-quadruped-")
    plan = ([(f"added latency {d:g} ms", {"sim_args": ("--delay-us", int(d * 1000))}) for d in QUAD_DELAYS_MS]
            + [(f"commands dropped {p:.0%}", {"sim_args": ("--drop", p)}) for p in QUAD_DROPS]
            + [(f"host stall {s:g} ms every 500 ms", {"stall_ms": s}) for s in QUAD_STALLS_MS]
            + [("PD in the simulator (impedance output)", {"sim_args": ("--pd-in-sim",),
                                                           "legged": {"output": '"impedance"'}})])
    for label, kw in plan:
        con.print(f"[dim]{label} ...[/]")
        res["rows"].append(quadruped_row(label, tmp, a.duration, **kw))
    print_table(f"the quadruped walking at 0.4 m/s through the node, {a.duration:g} s each (node PD at 1 kHz "
                "unless said)", ["setting", "distance", "vx (command)", "falls", "tracking rms vx", "node misses",
                                 "wake-up p99"],
                [[r["setting"], f"{r['distance_m']:.2f} m", f"{r['vx']:.3f} ({r['command_vx']:.2f}) m/s",
                  str(r["falls"]), f"{r['tracking_rms_vx']:.3f} m/s", str(r["deadline_misses"]),
                  f"{r['wake_p99_us']:.1f} us"] for r in res["rows"]], con)
    if a.json:
        write_json(a.json, res)
    return 0
