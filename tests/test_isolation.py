"""[realtime] isolate: other threads and IRQs moved off the loop's core for a run and back, checked from
/proc; after a SIGKILL the restore file and `control-node doctor --restore` give them back."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from support.nodeutil import load_run, start_node
from control_node.bench.harness import run_cli
from control_node.endpoints import runtime_dir
from control_node.loop.isolation import restore_file
from control_node.procfs import Procfs, parse_cpulist

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or len(os.sched_getaffinity(0)) < 2,
                                reason="needs root (moving other processes' threads and IRQs) and 2 cores")


FS = Procfs()


def allowed(pid) -> set[int]:
    status, err = FS.status(pid)
    assert status and "Cpus_allowed_list" in status, err or "no Cpus_allowed_list"
    return parse_cpulist(status["Cpus_allowed_list"])


def irq_lists() -> dict[int, set[int]]:
    out = {}
    for irq in FS.irqs():
        cpus, _ = FS.irq_affinity(irq)
        if cpus is not None:
            out[irq] = cpus
    return out


def wait_for(pred, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
@pytest.mark.machine_exclusive      # it moves every process's threads, the other -n worker's tests' too
def test_isolation_moves_others_off_the_core_and_back(tmp_path, continuous_f64_model_path):
    core = max(os.sched_getaffinity(0))
    bystander = subprocess.Popen(["sleep", "60"])
    irqs_before = irq_lists()
    try:
        full = allowed(bystander.pid)
        assert core in full
        node, _ = start_node(tmp_path, continuous_f64_model_path, extra="[realtime]\nisolate = true\n",
                             args=("--duration", 4))
        assert wait_for(lambda: core not in allowed(bystander.pid)), "the bystander was not moved"
        during = irq_lists()
        node.proc.communicate(timeout=60)
        assert node.proc.returncode == 0
        assert allowed(bystander.pid) == full                     # given back
    finally:
        bystander.kill()
        bystander.wait()
    runs = os.path.join(str(tmp_path), "runs")
    summary, _ = load_run(os.path.join(runs, os.listdir(runs)[0]))
    iso = summary["rt"]["isolation"]
    assert iso["granted"] and iso["core"] == core and iso["threads_moved"] >= 1
    assert iso["restored"]["threads_restored"] >= 1 and iso["restored"]["threads_failed"] == 0
    moved = set(iso["irqs_moved"])
    assert moved, "no IRQ could be moved off the core"
    for irq in moved:                                             # moved during the run, back after
        assert core in irqs_before[irq] and core not in during[irq]
    after = irq_lists()
    assert all(after.get(irq) == irqs_before.get(irq) for irq in moved)
    assert iso["restored"]["irqs_restored"] == len(moved)
    assert not os.path.exists(restore_file(runtime_dir(), node.proc.pid))
    # every refusal is named with its reason (per-CPU kernel threads cannot move)
    assert all(r["reason"] for r in iso["threads_refused"])


@pytest.mark.machine_exclusive
def test_a_killed_node_leaves_a_restore_file_that_doctor_restores(tmp_path, continuous_f64_model_path):
    core = max(os.sched_getaffinity(0))
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        full = allowed(bystander.pid)
        node, _ = start_node(tmp_path, continuous_f64_model_path, extra="[realtime]\nisolate = true\n")
        path = restore_file(runtime_dir(), node.proc.pid)
        assert wait_for(lambda: core not in allowed(bystander.pid))
        assert os.path.exists(path)
        os.killpg(node.proc.pid, signal.SIGKILL)
        node.proc.communicate(timeout=30)
        assert core not in allowed(bystander.pid)                 # nobody gave it back
        r = run_cli("doctor", "--restore")
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"node {node.proc.pid} (core {core})" in r.stdout and "threads and" in r.stdout
        assert allowed(bystander.pid) == full
        assert not os.path.exists(path)
    finally:
        bystander.kill()
        bystander.wait()


def test_isolation_off_by_default_and_said_so(tmp_path, continuous_f64_model_path):
    node, _ = start_node(tmp_path, continuous_f64_model_path, args=("--duration", 1))
    node.proc.communicate(timeout=60)
    runs = os.path.join(str(tmp_path), "runs")
    summary, _ = load_run(os.path.join(runs, os.listdir(runs)[0]))
    assert summary["rt"]["isolation"] == {"requested": False, "granted": False,
                                          "detail": "off (realtime.isolate = false)"}
    assert sys.platform.startswith("linux")
