"""`policy load` of a hostile file into a running node (issue #44): the file is read and verified in a
process of its own (kernels/isolated_load.py), not in the node, whose memory is locked; the refusal names
the field, its shape and the bound; the node's loop keeps its deadlines meanwhile, by its own evidence."""
from __future__ import annotations

import time

import numpy as np
import pytest

from support.bomb import write_bomb
from support.nodeutil import load_run, start_node
from control_node import rundir
from control_node.lifecycle import PolicyClient


RANDOM_SLACK = 2


def _vm_hwm(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmHWM:"))


def _misses(arrays, causes, t0, t1):
    """(cycles of the misses ticked in [t0, t1) ns, those of them the node put down to the host)."""
    t = arrays["t_tick_ns"].astype(np.int64)
    miss = (arrays["flags"] & rundir.FLAG_MISS) != 0
    sel = miss & (t >= t0) & (t < t1)
    cycles = arrays["cycle"][sel].tolist()
    return cycles, [c for c in cycles if causes.get(c) == "hypervisor"]


@pytest.mark.slow
@pytest.mark.machine_exclusive      # misses are compared between two windows of one run: another test's
                                    # processes on the loop's core would be named in either, by chance
def test_a_bomb_loaded_into_a_running_node_is_refused_and_the_loop_keeps_its_deadlines(
        tmp_path, continuous_f64_model_path, iris_model_path):
    """The node runs its 1 kHz loop with no sensor attached (as in the issue: 800 misses in 25 s, the control
    endpoint silent for 10 s). For 3 s nothing is loaded, then for 3 s the bomb is loaded back to back.
    Each load is refused by the loader process (load_failed, the field, its shape and the bound) in well under
    the control client's timeout; the node's peak RSS does not grow by 64 MiB; no late cycle is named for the
    load's work; and the loop misses no more deadlines while the loads are refused than in the quiet window
    before (beside RANDOM_SLACK), counting as the node's own why-late attribution does (a miss it names for the
    hypervisor, a host stall, is the host's)."""
    bomb = str(tmp_path / "bomb.npz")
    write_bomb(bomb, iris_model_path)
    node, cfg = start_node(tmp_path, continuous_f64_model_path, extra="[watchdog]\nstale_after_ms = 100.0\n",
                           args=("--duration", "8"), spin_us=None, attribution=True)
    client = PolicyClient(node.endpoints["control"], timeout=30.0)
    replies, spans = [], []
    try:
        assert client.request({"op": "status"})["ok"]
        hwm0 = _vm_hwm(node.proc.pid)
        t_q0 = time.monotonic_ns()
        time.sleep(3.0)
        t_l0 = time.monotonic_ns()
        while time.monotonic_ns() - t_l0 < 3e9:
            a = time.monotonic_ns()
            replies.append(client.request({"op": "load", "name": f"bomb{len(replies)}", "path": bomb}))
            spans.append((a, time.monotonic_ns()))
        t_l1 = time.monotonic_ns()
        hwm1 = _vm_hwm(node.proc.pid)
        status = client.request({"op": "status"})
    finally:
        client.close()
        rc, out, err, run_dir = node.stop()
    assert rc == 0, err
    assert replies
    for rep in replies:
        assert not rep["ok"] and rep["error"] == "load_failed", rep
        msg = rep["message"]
        assert msg.startswith(f"cannot load {bomb}: field 'extra_a'") and "(402653184,)" in msg, msg
        assert "256 MiB" in msg and "\n" not in msg, msg
    assert [p["name"] for p in status["status"]["policies"]] == [status["status"]["active"]]
    assert hwm1 - hwm0 < 64 << 20, (hwm0, hwm1)
    took = [(b - a) / 1e9 for a, b in spans]
    summary, arrays = load_run(run_dir)
    w = summary["why_late"]
    causes = {e["cycle"]: e["cause"] for e in w["events"] if e["miss"]}
    quiet, quiet_host = _misses(arrays, causes, t_q0, t_l0)
    loads, loads_host = _misses(arrays, causes, t_l0, t_l1)
    named = {causes.get(c) for c in loads}
    print(f"{len(replies)} refused loads, {min(took):.3f}-{max(took):.3f} s each; misses quiet {len(quiet)} "
          f"({len(quiet_host)} host), during loads {len(loads)} ({len(loads_host)} host), named {named}")
    # the load's own work is never what made a cycle late: the loader, the lifecycle thread, page faults
    assert not any(str(c).endswith(("cn-loader", "cn-lifecycle")) or str(c).startswith("page faults")
                   for c in named), named
    # and the loads cost no deadlines: at most as many as the quiet window, beside RANDOM_SLACK misses a task of
    # the host's own can make in either window (one run, machine to itself: a kworker once took the loop's core
    # during the loads). Reading the bomb in the node missed 800 deadlines in 25 s, ~80 in such a window.
    assert len(loads) - len(loads_host) <= len(quiet) - len(quiet_host) + RANDOM_SLACK, (quiet, loads, w["text"])
