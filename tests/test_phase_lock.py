"""Phase lock ([loop] phase_lock = true): the timer clock moves its schedule so that the frames of a periodic
stream land phase_margin_us before the tick, and follows a sender whose clock runs off by 200 ppm. A real node,
a real sender process stamping t_ns on its own schedule, real sockets."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from nodeutil import start_node, stop_node
from control_node import rundir
from control_node.bench.harness import CHILD_CWD, run_cli, write_node_config

# the sender's frames are due on its own absolute schedule (period, phase); each is stamped when sent. It sleeps
# (50-80 us late at most), never spins: a spinning sender on a 2-CPU machine keeps the node's ZeroMQ I/O thread
# (which runs off the loop's core) from delivering its frames for most of a period.
SENDER = r"""
import sys, time, msgpack, zmq
endpoint, period_ns, duration, phase_ns = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
pub = zmq.Context.instance().socket(zmq.PUB)
pub.setsockopt(zmq.LINGER, 1000)
pub.connect(endpoint)
time.sleep(0.4)
t0 = time.monotonic_ns() + phase_ns
n = 0
end = t0 + int(duration * 1e9)
while True:
    due = t0 + int(n * period_ns)
    if due >= end:
        break
    dt = due - time.monotonic_ns()
    if dt > 0:
        time.sleep(dt / 1e9)        # no busy wait: on 2 CPUs it would starve the node's ZeroMQ I/O thread
    n += 1
    pub.send(msgpack.packb({"seq": n, "t_ns": time.monotonic_ns(), "x": [5.1, 3.5, 1.4, 0.2]}))
pub.close(linger=1000)
print(n)
"""


def run_locked(tmp_path, model, ppm, duration=4.0, margin_us=100, phase_ns=370_000, lock=True):
    node, _ = start_node(tmp_path, model, extra=f"[loop]\nphase_lock = {str(lock).lower()}\n"
                                                f"phase_margin_us = {margin_us}\n"
                                                "[watchdog]\nstale_after_ms = 50.0\n"
                                                "[budget]\ndeadline_misses = 1000000\n")
    period = 1e6 * (1 + ppm * 1e-6)
    sender = subprocess.Popen([sys.executable, "-c", SENDER, node.endpoints["sensor"], repr(period), str(duration),
                               str(phase_ns)], cwd=CHILD_CWD, stdout=subprocess.PIPE, text=True)
    try:
        sender.wait(timeout=duration + 30)
    finally:
        if sender.poll() is None:
            sender.kill()
        rc, out, err, run_dir = stop_node(node)
    assert rc == 0, err
    return rundir.read_node_run(run_dir)


def leads(s, a, last_s):
    """tick - t_ns of every frame acted on in the last ``last_s`` seconds of frames (ns)."""
    new = ((a["flags"] & rundir.FLAG_NEW_FRAME) != 0) & (a["input_age_ns"] >= 0) & (a["wake_latency_ns"] >= 0)
    t = a["t_tick_ns"]
    last = t[new].max()
    sel = new & (t > last - last_s * 1e9)
    return (a["input_age_ns"][sel] - a["wake_latency_ns"][sel]).astype(np.int64), sel


def assert_locked(lead):
    """tick - t_ns of the frames acted on: at least the margin (stamp + transport before the tick), steady,
    and a frame that misses its tick (waits a whole period more) is the exception."""
    missed = (lead > 1_000_000).mean()
    assert missed < 0.2, f"{missed:.0%} of frames missed their tick"
    ok = lead[lead <= 1_000_000]
    p10, med, p90 = np.percentile(ok, [10, 50, 90])
    assert med >= 100_000 - 20_000, f"frames lead the tick by {med / 1e3:.1f} us, under the 100 us margin"
    assert med < 600_000, f"frames lead the tick by {med / 1e3:.1f} us: they wait most of a period"
    assert p90 - p10 < 300_000, f"the phase wanders: lead p10 {p10 / 1e3:.0f} us, p90 {p90 / 1e3:.0f} us"


def test_phase_lock_converges_on_a_1khz_sender(tmp_path, iris_model_path):
    s, a = run_locked(tmp_path, iris_model_path, ppm=0)
    pl = s["phase_lock"]
    assert pl["enabled"] and pl["margin_ns"] == 100_000 and pl["max_slew_ns_per_cycle"] == 10_000
    lead, _ = leads(s, a, 2.0)
    assert lead.size > 1000
    # locked: the probe at tick - margin finds 9 frames in 10 there (the lock's target)
    assert 0.75 < pl["early"] / pl["shifts"] < 0.97, pl
    assert_locked(lead)
    # every shift is counted, none bigger than the slew bound, and each flags its tick in the ring
    assert pl["shifts"] > 0 and pl["max_shift_ns"] <= pl["max_slew_ns_per_cycle"]
    assert pl["shift_ticks"] == pl["shifts"] or not s["ring"]["complete"]
    assert pl["abs_shift_ns"] >= abs(pl["net_shift_ns"])
    # the schedule stays monotonic
    assert (np.diff(a["t_tick_ns"]) > 0).all()


def _calm_tick_period(tmp_path, model):
    """A locked run beside a sender 200 ppm slow. Returns the tick period (ns) the node kept over its last 2.5 s
    away from host stalls, the number of calm ticks it is measured over, the run's summary and the stall count.

    The period is measured against the sender's frames: lead = tick - t_ns of the frame acted on drifts by
    (1 - P_sender / P_tick) per ns of run, so a least-squares line through the leads gives P_tick = P_sender /
    (1 - slope). Fitted over all the calm ticks, the lock's own wander (the lead moves within its band of
    some 100 us) averages out; the mean of consecutive tick periods would carry that wander at the window's
    ends whole (117 ppm once, over 1266 ticks)."""
    s, a = run_locked(tmp_path, model, ppm=200, duration=5.0)
    lead, sel = leads(s, a, 2.5)
    assert_locked(lead)
    t = a["t_tick_ns"][sel].astype(np.int64)
    # a host stall (the node's own record: a wake-up over 1 ms late) bunches the sender's frames and the lock
    # re-converges for a while: leave out the second after each one, and frames that missed their tick
    stalls = t[a["wake_latency_ns"][sel] > 1_000_000]
    calm = lead <= 1_000_000
    for ts in stalls:
        calm &= ~((t >= ts) & (t < ts + 1_000_000_000))
    if calm.sum() < 2:
        return float("nan"), int(calm.sum()), s, stalls.size
    slope = np.polyfit((t[calm] - t[calm][0]).astype(np.float64), lead[calm].astype(np.float64), 1)[0]
    return 1_000_200 / (1 - slope), int(calm.sum()), s, stalls.size


def test_phase_lock_follows_a_sender_off_by_200_ppm(tmp_path, iris_model_path):
    # measured over > 1000 calm ticks: a host that stalls the node every few hundred ms leaves fewer (212 after
    # 9 stalls in 2.5 s, once), so such a run is made once more
    for attempt in range(2):
        run = tmp_path / f"run{attempt}"
        run.mkdir(mode=0o700)          # (its ipc endpoints live there: private, or the node refuses them)
        period, n_calm, s, n_stalls = _calm_tick_period(run, iris_model_path)
        if n_calm > 1000:
            break
    else:
        pytest.skip(f"the host stalled the node (wake-ups over 1 ms late) {n_stalls} times in the last 2.5 s of "
                    f"both runs, leaving {n_calm} calm ticks, not the 1000 needed to measure 200 ppm")
    # within 100 ppm of the sender's; a loop that did not follow would be 200 ppm off (1000000 ns)
    assert abs(period - 1_000_200) < 100, f"tick period {period:.1f} ns over {n_calm} ticks, sender's 1000200 ns"
    assert s["phase_lock"]["net_shift_ns"] > 0          # a slow sender: the schedule moved later


def test_without_phase_lock_a_200_ppm_sender_drifts(tmp_path, iris_model_path):
    """The control: the same sender without phase lock slides through the period (0.2 us per ms)."""
    s, a = run_locked(tmp_path, iris_model_path, ppm=200, duration=5.0, lock=False)
    assert not s["phase_lock"]["enabled"] and s["phase_lock"]["shifts"] == 0
    new = ((a["flags"] & rundir.FLAG_NEW_FRAME) != 0) & (a["input_age_ns"] >= 0) & (a["wake_latency_ns"] >= 0)
    t = a["t_tick_ns"][new]
    lead = (a["input_age_ns"][new] - a["wake_latency_ns"][new]).astype(np.int64)
    first, last = t < t[0] + 0.5e9, t > t[-1] - 0.5e9

    def phase(sel):         # circular mean of the lead (ns, modulo the period): frames either side of a tick
        z = np.exp(2j * np.pi * lead[sel] / 1e6).mean()
        return np.angle(z) / (2 * np.pi) * 1e6
    drift = (phase(first) - phase(last)) % 1_000_000
    want = 200e-6 * (float(np.mean(t[last])) - float(np.mean(t[first])))     # ~0.2 us per ms between them
    assert abs(drift - want) < 150_000, f"lead moved {drift / 1e3:.0f} us, expected {want / 1e3:.0f} us"


def test_phase_lock_needs_the_timer_clock(tmp_path, iris_model_path):
    cfg = tmp_path / "n.toml"
    write_node_config(cfg, str(tmp_path), extra='[loop]\nclock = "sensor"\nphase_lock = true\n')
    r = run_cli("run", "--config", cfg, "--model", iris_model_path, "--duration", "1")
    assert r.returncode == 2 and "field 'loop.phase_lock'" in r.stderr and "Fix:" in r.stderr


@pytest.mark.parametrize("margin", [0, 500, 1000])
def test_bad_phase_margin_fails_naming_the_field(tmp_path, iris_model_path, margin):
    cfg = tmp_path / "n.toml"
    write_node_config(cfg, str(tmp_path), extra=f"[loop]\nphase_lock = true\nphase_margin_us = {margin}\n")
    r = run_cli("run", "--config", cfg, "--model", iris_model_path, "--duration", "1")
    assert r.returncode == 2 and "field 'loop.phase_margin_us'" in r.stderr and "Fix:" in r.stderr


def test_report_shows_the_phase_lock(tmp_path, iris_model_path):
    node, _ = start_node(tmp_path, iris_model_path, extra="[loop]\nphase_lock = true\n")
    sender = subprocess.Popen([sys.executable, "-c", SENDER, node.endpoints["sensor"], "1000000.0", "1.5", "0"],
                              cwd=CHILD_CWD, stdout=subprocess.PIPE, text=True)
    try:
        sender.wait(timeout=30)
    finally:
        rc, out, err, run_dir = stop_node(node)
    assert rc == 0, err
    rep = run_cli("report", run_dir, "--no-plots", "--out", tmp_path / "rep", env={"COLUMNS": "200"})
    assert rep.returncode in (0, 1), rep.stderr
    assert "phase lock: margin 100 us" in rep.stdout and "shifts (net" in rep.stdout, rep.stdout
    assert "phase lock: margin 100 us" in open(tmp_path / "rep" / "report.html").read()
