"""control-node bench legged: what the legged deploy path adds to a cycle, in one run.

Part 1, C level (``LeggedCycle.time_paths``: each figure the mean of --calls back-to-back calls timed in C,
--samples samples, p50 / p99): the observation recipe (once per policy tick), the actuator (every loop tick,
on a hold tick and on a policy tick) and, beside them, the kernel on the same policy (rsl_rl's 512-256-128
ELU MLP), for 12 joints (an IsaacLab quadruped: ω, g, cmd, q−q0, q̇, a; history 1 and 5) and 29 (a G1-sized
humanoid with the gait clock).
Part 2, the loop: the same 1 kHz node for --duration s fed at 1 kHz, without the recipe (a continuous policy
of the same input width: the frame is its input) and with it (torque output, a 50 Hz policy in policy mode,
the PD every tick), one after the other: wake-up p50 / p99 / p99.9, cycle time p50 / p99, misses.
Run it alone: ``flock /tmp/control-node-bench.lock control-node bench legged``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from control_node.bench.common import machine_info, machine_lines
from control_node.bench.harness import CHILD_CWD, NodeProcess, write_node_config


def quadruped_recipe(history):
    legs = ("FL", "FR", "RL", "RR")
    names = [f"{leg}_{p}_joint" for leg in legs for p in ("hip", "thigh", "calf")]
    h = {"history": history}
    return {"joints": {"policy": names, "robot": names[3:] + names[:3]}, "default_pos": [0.1, 0.8, -1.5] * 4,
            "policy_dt": 0.02,
            "observation": {"terms": [{"kind": "gyro", "scale": 0.25, **h}, {"kind": "projected_gravity", **h},
                                      {"kind": "command", **h}, {"kind": "joint_pos_rel", **h},
                                      {"kind": "joint_vel", "scale": 0.05, **h}, {"kind": "last_action", **h}],
                            "quat_order": "wxyz", "n_commands": 3},
            "action": {"scale": 0.25},
            "actuator": {"kp": 40.0, "kd": 1.0, "tau_max": 30.0, "stale_after": 0.1},
            "modes": {"stand_time": 0.1, "policy_without_stand": True}}


def humanoid_recipe(n=29):
    names = [f"joint_{i}" for i in range(n)]
    return {"joints": {"policy": names, "robot": names[::-1]}, "default_pos": 0.1, "policy_dt": 0.02,
            "observation": {"terms": [{"kind": "gyro", "scale": 0.25}, {"kind": "projected_gravity"},
                                      {"kind": "command"}, {"kind": "joint_pos_rel"},
                                      {"kind": "joint_vel", "scale": 0.05}, {"kind": "last_action"},
                                      {"kind": "gait_clock", "period": 0.8}],
                            "quat_order": "wxyz", "n_commands": 3},
            "action": {"scale": 0.25}, "actuator": {"kp": 100.0, "kd": 2.0, "tau_max": 80.0, "stale_after": 0.1},
            "modes": {"stand_time": 0.1, "policy_without_stand": True}}


SHAPES = {"12 joints, history 1": lambda: quadruped_recipe(1), "12 joints, history 5": lambda: quadruped_recipe(5),
          "29 joints + gait clock": humanoid_recipe}


def policy_for(n_in, n_out, seed=0):
    from control_node.kernels import ModelSpec
    rng = np.random.default_rng(seed)
    sizes = [n_in, 512, 256, 128, n_out]
    layers = [(rng.normal(0, 1 / np.sqrt(a), (a, b)), rng.normal(0, 0.1, b)) for a, b in zip(sizes[:-1], sizes[1:])]
    return ModelSpec(layers=layers, mean=0.0, scale=1.0, classes=[], feature_names=[f"o{i}" for i in range(n_in)],
                     dtype="float32", activations=["elu"] * 3 + ["identity"], head="continuous",
                     action_names=[f"a{i}" for i in range(n_out)])


def part1(calls, samples):
    from control_node.kernels import Policy
    from control_node.loop import legged as L
    from control_node.loop._legged import LeggedCycle
    rows = []
    for name, make in SHAPES.items():
        op, ap = L.build_plans(make())
        lc = LeggedCycle(op, ap)
        pol = Policy(policy_for(op.out_width, ap.n))
        t = lc.time_paths(pol, calls, samples)
        row = {"shape": name, "inputs": int(op.out_width), "joints": int(ap.n), "isa": pol.isa}
        for k, v in t.items():
            row[k] = {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99))}
        rows.append(row)
    return rows


def _node_run(tmp, model, extra, width, duration):
    cfg = os.path.join(tmp, "node.toml")
    write_node_config(cfg, tmp, extra)
    node = NodeProcess(cfg, model, "--duration", str(duration))
    feeder = subprocess.Popen([sys.executable, "-m", "control_node.bench.peers.feeder", node.endpoints["sensor"],
                               "1000", str(duration + 2), str(width)], cwd=CHILD_CWD)
    try:
        run_dir = _wait(node, duration)
    finally:
        feeder.kill()
        feeder.wait()
    with open(os.path.join(run_dir, "summary.json")) as f:
        s = json.load(f)
    w, c = s["wake_latency_ns"], s["cycle_time_ns"]
    return {"wake_p50_us": w["p50"] / 1e3, "wake_p99_us": w["p99"] / 1e3, "wake_p999_us": w.get("p99.9", w.get("p999", 0)) / 1e3,
            "cycle_p50_us": c["p50"] / 1e3, "cycle_p99_us": c["p99"] / 1e3, "misses": s["deadline_misses"],
            "cycles": s["cycles"], "legged": (s.get("legged") or {}).get("cycles_by_mode")}


def _wait(node, duration):
    """The node's run directory once it ended by itself (its --duration)."""
    out, err = node.proc.communicate(timeout=duration + 60)
    if node.proc.returncode != 0:
        raise RuntimeError(f"the node failed: rc={node.proc.returncode}\n{out}\n{err}")
    return [ln.split(": ", 1)[1].strip() for ln in out.splitlines() if ln.startswith("run directory: ")][-1]


def part2(duration):
    from control_node.kernels import save_model
    from control_node.loop import legged as L
    recipe = quadruped_recipe(5)
    op, ap = L.build_plans(recipe)
    width = sum(w for _, _, w in L.frame_layout(op))
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o700)
        legged_model = os.path.join(tmp, "legged.npz")
        save_model(policy_for(op.out_width, 12), legged_model)
        plain_model = os.path.join(tmp, "plain.npz")
        save_model(policy_for(width, 12), plain_model)     # the frame is its input
        loop = "[loop]\nrate_hz = 1000.0\npolicy_rate_hz = 50.0\n[watchdog]\nstale_after_ms = 100.0\n"
        rec = {k: v for k, v in recipe.items()}
        rec["actuator"] = {k: v for k, v in recipe["actuator"].items() if k != "stale_after"}
        from control_node.config import section_toml
        legged = loop + section_toml("legged", {**rec, "output": "torque",
                                                "sequence": [[0.0, "stand"], [0.0, "policy"]]})
        for name, model, extra in (("without the recipe", plain_model, loop), ("with the recipe + PD", legged_model,
                                                                                legged)):
            d = os.path.join(tmp, name.replace(" ", "_").replace("+", ""))
            os.makedirs(d, mode=0o700)
            out[name] = _node_run(d, model, extra, width, duration)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="control-node bench legged", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=2000, help="calls per timed sample (default %(default)s)")
    p.add_argument("--samples", type=int, default=300, help="samples per figure (default %(default)s)")
    p.add_argument("--duration", type=float, default=20.0, help="seconds per node run in part 2 (0: skip part 2)")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    a = p.parse_args(argv)
    res = {"machine": machine_info(), "when": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    for line in machine_lines(res["machine"]):
        print(line)
    res["c_level"] = part1(a.calls, a.samples)
    print("\nC level, ns per call (p50 / p99): the recipe once per policy tick, the actuator every loop tick")
    print(f"{'shape':<24} {'inputs':>6} {'recipe':>13} {'tick (hold)':>13} {'tick (action)':>14} {'kernel (' + 'isa)':>16}")
    for r in res["c_level"]:
        def f(k):
            return f"{r[k]['p50']:.0f} / {r[k]['p99']:.0f}"
        print(f"{r['shape']:<24} {r['inputs']:>6} {f('recipe'):>13} {f('tick_hold'):>13} {f('tick_action'):>14} "
              f"{f('policy') + ' ' + r['isa']:>16}")
    if a.duration > 0:
        res["loop"] = part2(a.duration)
        print(f"\nthe loop, 1 kHz, fed at 1 kHz, {a.duration:g} s each (us)")
        print(f"{'node':<22} {'wake p50':>9} {'p99':>7} {'p99.9':>7} {'cycle p50':>10} {'p99':>7} {'misses':>7}")
        for name, r in res["loop"].items():
            print(f"{name:<22} {r['wake_p50_us']:>9.2f} {r['wake_p99_us']:>7.2f} {r['wake_p999_us']:>7.1f} "
                  f"{r['cycle_p50_us']:>10.2f} {r['cycle_p99_us']:>7.2f} {r['misses']:>7}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return 0
