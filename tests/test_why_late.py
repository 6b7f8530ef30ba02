"""Why was it late (control_node.diagnosis.attribution): a real node, a real interferer on its core, the
kernel's own trace of what ran there, and the causes the node names in summary.json."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from support.nodeutil import load_run, start_node
from control_node.bench.harness import CHILD_CWD

INTERFERER = r"""
import ctypes, json, mmap, os, sys, time
cpu, duration, burst_ms, every_s, mode = (int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]),
                                          float(sys.argv[4]), sys.argv[5])
ctypes.CDLL(None).prctl(15, f"cn-{mode}".encode(), 0, 0, 0)      # PR_SET_NAME: the name the trace shows
os.sched_setaffinity(0, {cpu})
os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(90))     # above the node's loop (80)
# awake: every span this task was awake at priority 90 on the core (the bursts, and the few us around each
# sleep, which a host stall can stretch: a main-checkout run of 2026-12-05 saw 1.6 ms at its last wake-up)
bursts, awake, end = [], [], time.monotonic() + duration
t_wake = time.monotonic_ns()
print("ready", flush=True)
faults = 0


def nap(s):
    global t_wake
    awake.append((t_wake, time.monotonic_ns()))
    time.sleep(s)
    t_wake = time.monotonic_ns()


nap(0.5)
while time.monotonic() < end:
    t0 = time.monotonic_ns()
    while time.monotonic_ns() - t0 < burst_ms * 1e6:
        if mode == "faulter":                  # fresh anonymous pages: every first touch is a page fault
            m = mmap.mmap(-1, 1 << 20)
            for off in range(0, 1 << 20, 4096):
                m[off] = 1
            m.close()
            faults += 256
    bursts.append((t0, time.monotonic_ns()))
    nap(every_s)
# leave the core before the interpreter's teardown, which would be one more burst at priority 90
os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
awake.append((t_wake, time.monotonic_ns()))
os.sched_setaffinity(0, set(range(os.cpu_count())) - {cpu} or {cpu})
print(json.dumps({"bursts": bursts, "awake": awake}), flush=True)
"""


def _can_trace_and_fifo():
    if os.geteuid() != 0:
        return "needs root (SCHED_FIFO for the interferer, tracefs for the evidence)"
    if not (os.path.isdir("/sys/kernel/tracing") or os.path.isdir("/sys/kernel")):
        return "no /sys/kernel/tracing"
    return None


def _with_attribution(extra):
    """``extra`` TOML with [diagnostics] attribution = true (the default; said here so the test does not
    depend on it)."""
    if "[diagnostics]" in extra:
        return extra.replace("[diagnostics]\n", "[diagnostics]\nattribution = true\n")
    return extra + "[diagnostics]\nattribution = true\n"


def fed_node(tmp_path, model, extra, duration):
    """A node for ``duration`` s fed at 1 kHz by the benchmark feeder (6 features)."""
    node, cfg = start_node(tmp_path, model, extra="[watchdog]\nstale_after_ms = 200.0\n" + _with_attribution(extra),
                           args=("--duration", duration), spin_us=None)
    # off the loop core, as launch places its children: unpinned, the feeder (a `python` task) ran on the loop
    # core beside the loop and was named for 769 of 1017 misses in a fresh-clone run of the own-work test
    loop_cpu = node.endpoints["loop_cpu"]           # "none": an unpinned loop
    others = os.sched_getaffinity(0) - {int(loop_cpu)} if loop_cpu.isdigit() else set()
    feeder = subprocess.Popen([sys.executable, "-m", "control_node.bench.peers.feeder", node.endpoints["sensor"],
                               "1000", str(duration + 3), "6"], cwd=CHILD_CWD)
    if others:      # at once: the child is still starting Python, long before its ZeroMQ threads (no preexec_fn,
        os.sched_setaffinity(feeder.pid, others)    # which is unsafe in the threaded xdist worker)
    return node, feeder


def _fed_node_beside(tmp_path, model, extra, duration, helper):
    """A fed node for ``duration`` s beside ``helper`` (a Python script's argv after ``-c``), which prints
    ``ready`` and then its spans as one JSON line (a map of lists of (t0, t1) ns: "bursts" and what else it saw). Returns
    (summary, {cycle: tick ns}, that JSON) once the node has ended, with the attribution's trace granted."""
    node, feeder = fed_node(tmp_path, model, extra, duration)
    proc = subprocess.Popen([sys.executable, "-c", *helper], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        bursts = json.loads(proc.stdout.readline())
        node.proc.communicate(timeout=60)
    finally:
        proc.kill()
        feeder.kill()
        feeder.wait()
    runs = os.path.join(str(tmp_path), "runs")
    summary, arrays = load_run(os.path.join(runs, os.listdir(runs)[0]))
    w = summary["why_late"]
    assert w["enabled"] and w["evidence"]["trace"]["granted"], w["evidence"]
    return summary, dict(zip(arrays["cycle"].tolist(), arrays["t_tick_ns"].tolist())), bursts


def _with_interferer(tmp_path, model, mode):
    """A fed node for 5 s with an interferer (SCHED_FIFO 90, pinned to the loop's core) that, every 250 ms,
    spins (``mode="interferer"``) or faults fresh pages in (``"faulter"``) for 4 ms. Returns (why_late,
    the interferer's {"bursts": [(t0, t1) ns], "awake": [(t0, t1) ns]}, {cycle: tick ns})."""
    cpu = max(os.sched_getaffinity(0))              # [realtime] cpu = "last"
    summary, tick, spans = _fed_node_beside(tmp_path, model, "", 5, (INTERFERER, str(cpu), "3.5", "4", "0.25", mode))
    assert summary["rt"]["cpu"]["core"] == cpu
    assert len(spans["bursts"]) >= 8
    assert all(any(a0 <= b0 and b1 <= a1 for a0, a1 in spans["awake"]) for b0, b1 in spans["bursts"])
    return summary["why_late"], spans, tick


def _overlaps(e, burst, tick):
    """The event's window (from its tick to its publish) overlaps the burst (t0, t1) ns."""
    t0 = tick[e["cycle"]] - 200_000
    t1 = tick[e["cycle"]] + e["wake_latency_ns"] + e["cycle_time_ns"]
    return t0 <= burst[1] and burst[0] <= t1


def _named_otherwise_by_the_rule(e, interferer):
    """The event names another cause for a reason the evidence shows: the hypervisor (its timer interrupt came
    late, with no interrupt holding it back: the vCPU was not running, whatever task the trace showed), or
    something else seen on the core for longer than the interferer. That is the attribution's rule, not a miss
    of it: on a loaded host another test's process (``task python``) held the loop's core beside a burst."""
    mine = e["seen"].get(interferer, 0.0)
    if e["cause"] == "hypervisor":
        late_timer = e["timer_irq_late_us"] is not None and e["timer_irq_late_us"] >= 0.5 * e["lateness_us"]
        return late_timer or mine < max(0.3 * e["lateness_us"], 50.0)
    other = e["cause"].removeprefix("page faults in ")
    return other != interferer and e["seen"].get(other, 0.0) >= mine


def _named_for_the_bursts(w, spans, tick, causes):
    """The misses named one of ``causes`` (the interferer's task first) cover >= 80 % of the bursts whose
    misses the node did not rightly put down to something else (:func:`_named_otherwise_by_the_rule`), at
    least half of all bursts; and no event outside the spans the interferer was awake (its bursts, and the
    moments around its sleeps) has one. Returns those misses."""
    bursts = spans["bursts"]
    named = [e for e in w["events"] if e["cause"] in causes]
    interferer = causes[0]

    def overlaps(e, burst):
        return _overlaps(e, burst, tick)
    hit = {i for i, b in enumerate(bursts) if any(overlaps(e, b) for e in named if e["miss"])}
    # a burst none of whose overlapping misses names it, each naming something else by the rule's evidence
    elsewhere = set()
    for i, b in enumerate(bursts):
        over = [e for e in w["events"] if e["miss"] and overlaps(e, b)]
        if i not in hit and over and all(_named_otherwise_by_the_rule(e, interferer) for e in over):
            elsewhere.add(i)
    judged = len(bursts) - len(elsewhere)
    assert len(hit) >= 0.8 * judged and len(hit) >= 0.5 * len(bursts), \
        (len(hit), len(bursts), len(elsewhere), w["text"])                                  # recall
    stray = [e for e in named if not any(overlaps(e, a) for a in spans["awake"])]
    assert not stray, (stray, [(tick[e["cycle"]] - a[0]) / 1e6 for e in stray for a in spans["awake"]])  # precision
    assert sum(w["misses_by_cause"].get(c, 0) for c in causes) >= len(hit)
    assert any(c in w["text"] for c in causes)
    # the misses it was seen in (not those that only inherited the lateness of the cycle before)
    return [e for e in named if e["miss"] and "carried_from_cycle" not in e]


@pytest.mark.slow
@pytest.mark.machine_exclusive      # SCHED_FIFO 90 bursts on a core hold off every other test's processes there,
                                    # and theirs would be named beside the interferer, rightly
@pytest.mark.skipif(_can_trace_and_fifo() is not None, reason=str(_can_trace_and_fifo()))
def test_a_task_holding_the_loop_core_is_named(tmp_path, continuous_f64_model_path):
    """A task spinning 4 ms every 250 ms above the loop on its core: every burst makes a miss, the node
    names `task cn-interferer` for it from the trace, and names it for no other miss."""
    w, spans, tick = _with_interferer(tmp_path, continuous_f64_model_path, "interferer")
    misses = _named_for_the_bursts(w, spans, tick, ("task cn-interferer",))
    bursts = spans["bursts"]
    # The naming rests on evidence: every miss named for the task saw it on the core.
    assert misses and all(e["seen"]["task cn-interferer"] > 0 for e in misses), misses
    # What the trace saw of it, per burst, over the misses covering that burst (a burst can straddle two
    # misses' windows). A rule, not a host figure: the typical burst is seen for at least 1 ms of its
    # 4 ms. One burst may be seen for less: a host stall can make the miss before it late and named
    # otherwise, leaving only the burst's tail in a named window (290 us once in CI).
    seen = {}
    for e in misses:
        for i, b in enumerate(bursts):
            if _overlaps(e, b, tick):
                seen[i] = seen.get(i, 0.0) + e["seen"]["task cn-interferer"]
    assert seen, misses
    assert float(np.median(list(seen.values()))) >= 1000, (seen, misses)


@pytest.mark.slow
@pytest.mark.machine_exclusive      # SCHED_FIFO 90 bursts on a core hold off every other test's processes there,
                                    # and theirs would be named beside the interferer, rightly
@pytest.mark.skipif(_can_trace_and_fifo() is not None, reason=str(_can_trace_and_fifo()))
def test_a_page_fault_storm_on_the_loop_core_is_named(tmp_path, continuous_f64_model_path):
    """A task faulting fresh pages in for 4 ms every 250 ms above the loop on its core: the node names
    `page faults in task cn-faulter` (not just the task) where the faults it counted in the window are dense
    (one per 10 us of the task's hold or more), and the task alone where they are not: how fast this host
    faults pages in decides which (on a loaded host 5 of 12 bursts' misses saw one fault per 17-19 us)."""
    from control_node.diagnosis.attribution import FAULT_DENSE_NS
    w, spans, tick = _with_interferer(tmp_path, continuous_f64_model_path, "faulter")
    misses = _named_for_the_bursts(w, spans, tick, ("task cn-faulter", "page faults in task cn-faulter"))
    print(w["text"], misses[0])
    # the evidence for each: the task held the core, and the name follows the density of its faults there
    # (`seen` is rounded to 0.1 us)
    dense_us = FAULT_DENSE_NS / 1e3
    for e in misses:
        held_us, n = e["seen"]["task cn-faulter"], e["page_faults_of_tasks"].get("cn-faulter", 0)
        assert held_us > 0, e
        if e["cause"] == "page faults in task cn-faulter":
            assert n * dense_us >= held_us - 0.1, e
        else:
            assert n * dense_us < held_us + 0.1, e
    # the storm made dense windows, named for the faults (7 of those 12)
    assert any(e["cause"] == "page faults in task cn-faulter" for e in misses), w["text"]
    # the typical miss saw >= 1 ms of it (one can see only a burst's tail, as for the spinning task)
    assert float(np.median([e["seen"]["task cn-faulter"] for e in misses])) >= 1000, misses


DISK_READER = r"""
import json, mmap, os, random, sys, time
path, stat, cpu, bursts_n, burst_s, every_s, until_s = (sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
                                                        float(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7]))
os.sched_setaffinity(0, {cpu})                  # the reader is not on the loop's core: only its interrupts are
fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
buf = mmap.mmap(-1, 1 << 20)
size = os.fstat(fd).st_size >> 20
start = time.monotonic_ns()


def completed():
    # the disk's completed requests of every kind (reads, writes, discards, flushes), whoever asked
    if not stat:
        return 0
    with open(stat) as fh:
        f = fh.read().split()
    return sum(int(f[i]) for i in (0, 4, 11, 15) if i < len(f))


other = []                                      # (t0, t1) ns: the disk completed requests that were not ours


def watch(until_ns):
    # between bursts, poll the disk's counters every ms: the journal's commit or another process's write
    # completes on the same interrupt, and the node rightly names it wherever it falls
    t, n = time.monotonic_ns(), completed()
    while t < until_ns:
        time.sleep(0.001)
        t1, n1 = time.monotonic_ns(), completed()
        if n1 != n:
            other.append((t, t1))
        t, n = t1, n1


print("ready", flush=True)
watch(time.monotonic_ns() + 500_000_000)
bursts = []
for _ in range(bursts_n):
    t0 = time.monotonic_ns()
    while time.monotonic_ns() - t0 < burst_s * 1e9:
        os.preadv(fd, [buf], random.randrange(0, size) << 20)      # 1 MB, past the page cache
    bursts.append((t0, time.monotonic_ns()))
    watch(time.monotonic_ns() + int(every_s * 1e9))
watch(start + int(until_s * 1e9))               # until the node has ended
print(json.dumps({"bursts": bursts, "other_io": other}), flush=True)
"""


def _disk_stat(path):
    """/sys/.../stat of the whole disk holding ``path`` (its partitions share the disk's interrupt), or "" where
    the file system is not on a block device this kernel lists."""
    dev = os.stat(path).st_dev
    base = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    if not os.path.isdir(base):
        return ""
    whole = os.path.join(base, "..") if os.path.exists(os.path.join(base, "partition")) else base
    return os.path.realpath(os.path.join(whole, "stat"))


def _irq_counts():
    """{irq number: total count} from /proc/interrupts (numbered lines only)."""
    out = {}
    for line in open("/proc/interrupts").read().splitlines()[1:]:
        head, _, rest = line.partition(":")
        if head.strip().isdigit():
            out[int(head)] = sum(int(v) for v in rest.split() if v.isdigit())
    return out


def _disk_irq(path):
    """The interrupt that completes O_DIRECT reads of ``path``, found by reading: (number, name) or None."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    import mmap
    buf = mmap.mmap(-1, 1 << 20)
    try:
        before = _irq_counts()
        for i in range(64):
            os.preadv(fd, [buf], i << 20)
        after = _irq_counts()
    finally:
        os.close(fd)
    grew = sorted(((after[k] - before.get(k, 0), k) for k in after), reverse=True)
    if not grew or grew[0][0] < 32:
        return None
    irq = grew[0][1]
    name = next(line.split()[-1] for line in open("/proc/interrupts") if line.split()[0] == f"{irq}:")
    return irq, name


@pytest.mark.slow
@pytest.mark.machine_exclusive      # it routes the disk's IRQ to one core for every process, and other tests' own
                                    # processes on the loop core would be named beside the disk, rightly
@pytest.mark.skipif(_can_trace_and_fifo() is not None, reason=str(_can_trace_and_fifo()))
def test_a_burst_of_device_interrupts_on_the_loop_core_is_named(tmp_path, continuous_f64_model_path):
    """The disk's completion interrupt routed to the loop's core, and a reader on the other core doing 1 MB
    O_DIRECT reads in 150 ms bursts: with a 60 us deadline the interrupt handlers (which hold off even the
    loop's timer interrupt) make misses, and the node names the disk's IRQ (or its BLOCK softirq) for them,
    not the hypervisor; it names that IRQ for no miss far from a time the disk completed a request (the
    reader's bursts, and the requests of others it sees complete between them)."""
    data = tmp_path / "disk.bin"
    with open(data, "wb") as f:
        for _ in range(64):
            f.write(os.urandom(1 << 20))
        os.fsync(f.fileno())
    try:
        found = _disk_irq(str(data))
    except OSError as e:
        pytest.skip(f"O_DIRECT reads of {tmp_path} are not possible here ({e.strerror}): no disk interrupts to make")
    if found is None:
        pytest.skip("reads of a file here raise no device interrupt (no block device under the test dir)")
    irq, name = found
    cpu = max(os.sched_getaffinity(0))
    aff = f"/proc/irq/{irq}/smp_affinity_list"
    old = open(aff).read().strip()
    try:
        with open(aff, "w") as f:
            f.write(str(cpu))
    except OSError as e:
        old = None                                   # not ours to move: fine if it is on the loop's core already
        effective = open(f"/proc/irq/{irq}/effective_affinity_list").read().strip()
        if effective != str(cpu):
            pytest.skip(f"IRQ {irq} ({name}) is on core {effective}, not the loop's {cpu}, and cannot be "
                        f"routed there: {e.strerror}")
    try:
        reader = (DISK_READER, str(data), _disk_stat(str(data)), str(min(os.sched_getaffinity(0))), "8", "0.15",
                  "0.3", "6.5")
        summary, tick, spans = _fed_node_beside(tmp_path, continuous_f64_model_path, "[loop]\ndeadline_us = 60\n", 6,
                                                 reader)
    finally:
        if old is not None:
            with open(aff, "w") as f:
                f.write(old)
    w = summary["why_late"]
    causes = {f"irq {name}", "softirq BLOCK"}
    named = [e for e in w["events"] if e["cause"] in causes]

    bursts, other_io = spans["bursts"], spans["other_io"]

    def near(e, windows, margin=5_000_000):
        return any(b[0] - margin <= tick[e["cycle"]] <= b[1] + margin for b in windows)
    hit = {i for i, b in enumerate(bursts) if any(near(e, [b]) for e in named)}
    print(f"{w['text']}; bursts with a late cycle (miss or worst wake-up) named {sorted(causes)}: "
          f"{len(hit)} of {len(bursts)}; the disk completed others' requests in {len(other_io)} ms polls between them")
    # the interrupts reached the loop's core, and the node counted them there
    on_core = w["evidence"]["interrupts"]["on_core_during_run"]
    assert sum(n for k, n in on_core.items() if k.split()[0] == str(irq)) >= 100, on_core
    # precision: the disk is named only in (or right by) the bursts, or where the disk was completing someone
    # else's requests (a journal commit, another process's write: the same interrupt completes them; one
    # fresh-clone run saw 1 of 8 named misses away from the bursts), and with its own evidence
    assert sum(near(e, bursts + other_io) for e in named) >= 0.9 * len(named), (w["text"], other_io)
    # a late cycle whose lateness carried over from the cycle before has its evidence there (its own `seen`
    # is empty by design): follow the carry back to the cycle that was seen
    by_cycle = {e["cycle"]: e for e in w["events"]}

    def evidence(e, depth=0):
        if e["seen"].get(f"irq {name}", 0) + e["seen"].get("softirq BLOCK", 0) > 0:
            return True
        origin = by_cycle.get(e.get("carried_from_cycle"))
        return origin is not None and origin["cause"] == e["cause"] and depth < 100 and evidence(origin, depth + 1)
    assert all(evidence(e) for e in named), [e for e in named if not evidence(e)]
    # wherever the disk's handlers were the largest thing on the core, by the rule's margin, they are named;
    # and an interrupt that held the loop's timer back does not make the miss the hypervisor's. On this
    # VM how many bursts make such misses varies from run to run (the host often stalls the vCPU for the
    # same I/O, which the node names `hypervisor`): counted above, not bounded
    for e in w["events"]:
        if not e["miss"] or not e["seen"] or "carried_from_cycle" in e:
            continue
        top, us = max(e["seen"].items(), key=lambda kv: kv[1])
        held = e["timer_held_by_irqs_us"] >= 0.5 * (e["timer_irq_late_us"] or 0)
        if top in causes and held and us >= 0.3 * e["lateness_us"]:
            assert e["cause"] == top, e


def test_an_interrupt_holding_the_timer_back_is_not_the_hypervisor():
    """The loop's timer interrupt came 40 us late: with nothing else seen that is the hypervisor (the vCPU
    was not running); with a device interrupt's handler running over that time it is the device."""
    from control_node.diagnosis.attribution import classify
    cause, fig = classify(100_000, 45_000, {}, 0.0, True, 0, timer_late_ns=40_000)
    assert cause == "hypervisor"
    cause, fig = classify(100_000, 45_000, {("irq", "virtio1-req.0"): 38_000}, 0.0, True, 0, timer_late_ns=40_000,
                          irq_held_ns=38_000)
    assert cause == "irq virtio1-req.0" and fig["timer_held_by_irqs_us"] == 38.0
    # a softirq runs with interrupts on: it cannot hold the timer back, only the wake-up after it
    cause, _ = classify(100_000, 45_000, {("softirq", "BLOCK"): 38_000}, 0.0, True, 0, timer_late_ns=40_000)
    assert cause == "hypervisor"


def test_a_quiet_gap_after_an_on_time_timer_is_the_hypervisor_only_in_a_vm():
    """The timer came on time (2 us), the loop woke 250 us late, nothing seen on the core in between: in a
    VM the vCPU was not running; on bare metal (an SMI? an idle exit?) it stays unknown, with why."""
    from control_node.diagnosis.attribution import classify, virtual_machine
    cause, fig = classify(400_000, 250_000, {("task", "python"): 9_000}, 0.0, True, 0, timer_late_ns=2_000,
                          in_vm=True, woke_late=True)
    assert cause == "hypervisor" and "came 2 us after it was due, then nothing ran" in fig["why"]
    cause, fig = classify(400_000, 250_000, {("task", "python"): 9_000}, 0.0, True, 0, timer_late_ns=2_000,
                          woke_late=True)
    assert cause == "unknown" and fig["why"]
    # no timer interrupt in the window: the loop did not sleep (it spun, or probed for a frame) and lost the
    # time running, with nothing else on the core: in a VM the vCPU was stopped; without the trace, unknown
    cause, fig = classify(400_000, 250_000, {}, 0.0, True, 0, in_vm=True, woke_late=True)
    assert cause == "hypervisor" and "no timer interrupt" in fig["why"]
    assert classify(400_000, 250_000, {}, 0.0, False, 0, in_vm=True, woke_late=True)[0] == "unknown"
    # a small late timer (15 us of 16 us late) in a VM is its timer virtualisation
    assert classify(300_000, 16_000, {}, 0.0, True, 0, timer_late_ns=15_000, in_vm=True,
                    woke_late=True)[0] == "hypervisor"
    # woke 26 us late, then worked 65 us past a 5 us deadline: late mostly by its own work
    assert classify(300_000, 86_000, {}, 0.0, True, 65_000, timer_late_ns=20_000, typical_ns=60_000, in_vm=True,
                    woke_late=True)[0] == "own cycle work"
    # a cycle 100x its 5 us median (500 us) with nothing else seen: mid-cycle vCPU stall in a VM only
    assert classify(500_000, 495_000, {}, 0.0, True, 495_000, typical_ns=5_000, in_vm=True)[0] == "hypervisor"
    assert classify(500_000, 495_000, {}, 0.0, True, 495_000, typical_ns=5_000)[0] == "unknown"
    # own work a little over the deadline (2x the median) is the cycle's own
    assert classify(20_000, 8_000, {}, 0.0, True, 8_000, typical_ns=10_000, in_vm=True)[0] == "own cycle work"
    # the VM verdict is doctor's (one detection in control_node.procfs): on this machine they agree
    from control_node.diagnosis import machine_facts
    assert virtual_machine()["vm"] == bool(machine_facts()["virtualized"])


@pytest.mark.machine_exclusive      # no other test's processes on the loop core: they would be named, rightly
def test_own_cycle_work_is_named_when_the_policy_is_slower_than_the_deadline(tmp_path):
    """A 48-512-256-128-12 float64 policy (tens of us) under a 5 us deadline: the misses are the cycle's own
    work, and the node says so."""
    from conftest import continuous_spec
    from control_node.kernels import save_model
    model = tmp_path / "big.npz"
    save_model(continuous_spec("float64", seed=5, sizes=(6, 512, 256, 128, 12)), model)
    node, feeder = fed_node(tmp_path, model, "[loop]\ndeadline_us = 5\n", 2)
    try:
        node.proc.communicate(timeout=60)
    finally:
        feeder.kill()
        feeder.wait()
    runs = os.path.join(str(tmp_path), "runs")
    summary, _ = load_run(os.path.join(runs, os.listdir(runs)[0]))
    w = summary["why_late"]
    assert w["enabled"] and summary["deadline_misses"] > 500
    # per late cycle (a host stall also makes a miss here, and its skipped ticks count with it in the
    # totals: a few 20 ms stalls would outweigh hundreds of cycles in misses_by_cause)
    misses = [e for e in w["events"] if e["miss"]]
    own = sum(e["cause"] == "own cycle work" for e in misses)
    # the rest are late wake-ups larger than the overrun, mostly the host's, which it names `hypervisor` (132 of
    # 1012 on a slow host, 434 of 1006 in one stalled CI run): of the misses the host did not cause, the
    # overrunning policy's own work must be most
    not_host = [e for e in misses if e["cause"] != "hypervisor"]
    assert not_host and own >= 0.7 * len(not_host), (w["text"], [e for e in not_host if e["cause"] != "own cycle work"][:5])
    assert w["misses_by_cause"]["own cycle work"] >= own
    assert w["text"].startswith(f"{w['misses_attributed']} misses: ")
    from control_node.bench.harness import run_cli
    rep = run_cli("report", os.path.join(runs, os.listdir(runs)[0]), env={"COLUMNS": "200"})
    assert rep.returncode == 0, rep.stderr
    assert f"why late: {w['text']}" in rep.stdout and "own cycle work" in rep.stdout
    html = open(os.path.join(runs, os.listdir(runs)[0], "report", "report.html")).read()
    assert "<h3>Why late</h3>" in html


def test_evidence_that_could_not_be_had_is_listed(tmp_path, continuous_f64_model_path):
    """Without the trace, nothing is put down to a task or an interrupt, and the evidence says why; an
    unpinned loop has no core to watch."""
    node, feeder = fed_node(tmp_path, continuous_f64_model_path, "[diagnostics]\nattribution_trace = false\n", 1.5)
    try:
        node.proc.communicate(timeout=60)
    finally:
        feeder.kill()
        feeder.wait()
    runs = os.path.join(str(tmp_path), "runs")
    summary, _ = load_run(os.path.join(runs, os.listdir(runs)[0]))
    w = summary["why_late"]
    assert w["enabled"] and w["evidence"]["trace"] == {"granted": False,
                                                       "detail": "off ([diagnostics] attribution_trace = false)"}
    assert not any(e["cause"].startswith(("task ", "irq ", "softirq ", "vector ")) for e in w["events"])
    assert w["evidence"]["interrupts"]["granted"] and "smi" in w["evidence"]
    d2 = tmp_path / "unpinned"
    d2.mkdir(mode=0o700)
    node, feeder = fed_node(d2, continuous_f64_model_path, '[realtime]\ncpu = "none"\n', 1.0)
    try:
        node.proc.communicate(timeout=60)
    finally:
        feeder.kill()
        feeder.wait()
    runs = os.path.join(str(d2), "runs")
    summary, _ = load_run(os.path.join(runs, os.listdir(runs)[0]))
    assert summary["why_late"]["enabled"] is False and "no core to watch" in summary["why_late"]["detail"]
    assert not os.path.exists(f"/sys/kernel/tracing/instances/control-node-{node.proc.pid}")


def test_the_trace_instance_is_removed_and_tracefs_left_as_found(tmp_path, continuous_f64_model_path):
    """After a run, no control-node instance is left in tracefs, and tracefs is mounted only if it was."""
    was = os.path.ismount("/sys/kernel/tracing")
    node, feeder = fed_node(tmp_path, continuous_f64_model_path, "", 1.0)
    try:
        node.proc.communicate(timeout=60)
    finally:
        feeder.kill()
        feeder.wait()
    runs = os.path.join(str(tmp_path), "runs")
    summary, _ = load_run(os.path.join(runs, os.listdir(runs)[0]))
    tr = summary["why_late"]["evidence"]["trace"]
    if not tr["granted"]:
        pytest.skip(f"tracefs not granted here: {tr['detail']}")
    # every line read is either parsed (near a late cycle) or counted as left out
    assert tr["lines"] + tr["lines_skipped_far_from_late_cycles"] > 1000
    assert tr["unparsed"] == 0, tr["unparsed_examples"]
    assert not os.path.exists(f"/sys/kernel/tracing/instances/control-node-{node.proc.pid}")
    assert os.path.ismount("/sys/kernel/tracing") == was or not tr.get("mounted_by_node")
    assert np.isfinite(summary["duration_s"])


# ---- the raw-trace slots and the parser, on trace_pipe text in this kernel's format, through a real pipe
def _switch_line(t_s, prev, prev_pid, nxt, next_pid):
    return (f"{prev:>16}-{prev_pid:<7} [001] d..2. {t_s:.6f}: sched_switch: prev_comm={prev} prev_pid={prev_pid} "
            f"prev_prio=120 prev_state=R ==> next_comm={nxt} next_pid={next_pid} next_prio=120\n")


def test_lost_events_lines_are_counted_not_unparsed():
    """trace_pipe's "CPU:1 [LOST n EVENTS]" (the ring overran before the reader took it: a series run on a
    loaded host printed one, and the run counted it as an unparsed line) is evidence that could not be kept,
    counted as such; anything else the parser cannot read stays unparsed."""
    from control_node.diagnosis.attribution import TraceParser
    got = []
    p = TraceParser(loop_tid=4242, sink=got.append)
    for line in (_switch_line(1.0, "<idle>", 0, "hog", 77) + "CPU:1 [LOST 1234 EVENTS]\n"
                 + _switch_line(1.004, "hog", 77, "swapper/1", 0) + "not a trace line\n").splitlines():
        p.feed(line)
    assert p.events_lost == 1234 and p.unparsed == 1 and p.lines == 4
    assert p.unparsed_examples == ["not a trace line"]
    assert ("task", "hog", 1_000_000_000, 1_004_000_000) in got


def test_a_task_the_header_calls_unknown_is_named_from_the_trace_bodies():
    """trace_pipe's header prints "<...>" for a pid the kernel's name cache (saved_cmdlines) has lost; series
    run 10 of 73b13d6 named 28 of 39 misses "page faults in task <...>" and the faulter was named for too few
    bursts. The name comes from the sched_switch / sched_wakeup bodies, which always carry it: the hold and
    the faults are the named task's; a pid no body names stays "<...>" (unknown, not guessed)."""
    from control_node.diagnosis.attribution import TraceParser
    got = []
    p = TraceParser(loop_tid=4242, sink=got.append)
    lines = (f"{'<...>':>16}-77      [001] d..2. 1.000000: sched_waking: comm=cn-faulter pid=77 prio=9 target_cpu=001\n"
             + _switch_line(1.000001, "<idle>", 0, "cn-faulter", 77)
             + f"{'<...>':>16}-77      [001] d..2. 1.001000: page_fault_user: address=0x1000 ip=0x2000 error_code=0x6\n"
             + _switch_line(1.004000, "cn-faulter", 77, "swapper/1", 0).replace("      cn-faulter-77", "           <...>-77")
             + f"{'<...>':>16}-99      [001] d..2. 1.005000: page_fault_user: address=0x1000 ip=0x2000 error_code=0x6\n")
    for line in lines.splitlines():
        p.feed(line)
    assert p.unparsed == 0
    assert ("faults", "cn-faulter", 1_001_000_000, 1_001_000_000) in got
    assert ("task", "cn-faulter", 1_000_001_000, 1_004_000_000) in got
    assert ("faults", "<...>", 1_005_000_000, 1_005_000_000) in got


def test_only_trace_text_near_a_late_cycle_is_parsed_and_the_rest_counted():
    """Two reads of trace text: a task holding the core near a late cycle's window (parsed: its interval is
    evidence), and one far from any (left out: its lines counted, no interval). A line cut between two
    reads is put together again."""
    from control_node.diagnosis.attribution import Recorder, _RawTrace
    loop_tid = 4242
    near = (_switch_line(1.000000, "<idle>", 0, "hog", 77) + _switch_line(1.004000, "hog", 77, "python", loop_tid)
            + _switch_line(1.004500, "python", loop_tid, "swapper/1", 0))
    far = (_switch_line(5.000000, "<idle>", 0, "farhog", 88) + _switch_line(5.004000, "farhog", 88, "swapper/1", 0)
           + _switch_line(5.004100, "<idle>", 0, "farhog", 88) + _switch_line(5.005000, "farhog", 88, "swapper/1", 0))
    rec = Recorder(cpu=1, loop_tid=loop_tid, tracing=False)
    rec.loop = object()                                  # decisions need a loop: windows come from its ring
    rec._raw = raw = _RawTrace()
    r, w = os.pipe()
    try:
        cut = len(near) - 30                             # the last line arrives in two reads
        os.write(w, near[:cut].encode())
        assert raw.read(r) == cut and len(raw.queue) == 1
        os.write(w, near[cut:].encode())
        raw.read(r)
        os.write(w, far.encode())
        raw.read(r)
    finally:
        os.close(r)
        os.close(w)
    assert len(raw.queue) == 3
    k0, k1, k2 = raw.queue
    assert (raw.t0[k0], raw.t1[k0]) == (1_000_000_000, 1_004_000_000)
    assert raw.t0[k1] == raw.t1[k1] == 1_004_500_000                     # the cut line, whole
    assert (raw.t0[k2], raw.t1[k2]) == (5_000_000_000, 5_005_000_000)
    rec.windows.add(1_002_000_000, 1_003_000_000)         # a late cycle inside the hog's hold
    rec._examined_tick = 1_100_000_000                    # the ring examined past the first slots only
    rec._settle()
    assert list(raw.queue) == [k2]                        # undecided: the ring has not reached 5 s yet
    rec._examined_tick = 6_000_000_000
    rec._settle()
    assert not raw.queue and len(raw.free) == 63
    tasks = [iv for iv in rec.intervals if iv[0] == "task"]
    assert tasks == [("task", "hog", 1_000_000_000, 1_004_000_000)]
    assert rec.lines_skipped == 4 and rec.parser.lines == 3 and rec.parser.unparsed == 0


def test_a_full_set_of_slots_is_parsed_rather_than_lost():
    """When the ring cannot say yet and no slot is free, the oldest slot is parsed, not dropped."""
    from control_node.diagnosis.attribution import N_SLOTS, Recorder, _RawTrace
    rec = Recorder(cpu=1, loop_tid=1, tracing=False)
    rec.loop = object()
    rec._raw = raw = _RawTrace()
    r, w = os.pipe()
    try:
        for i in range(N_SLOTS - 1):
            os.write(w, _switch_line(10.0 + i * 1e-3, "<idle>", 0, f"t{i}", 100 + i).encode())
            raw.read(r)
    finally:
        os.close(r)
        os.close(w)
    assert not raw.free
    rec._settle()                                          # nothing decided: the oldest goes to the parser
    assert len(raw.free) == 1 and rec.parser.lines == 1 and rec.lines_skipped == 0


def test_a_cycle_that_could_not_sleep_takes_the_late_cycle_befores_cause():
    """Cycle 10's timer interrupt came 1.2 ms late (the hypervisor); it ended 300 us into cycle 11's period,
    so cycle 11 never slept and woke 300 us late with nothing on the core: its cause is cycle 10's, said so.
    With phase lock the window starts at the end of the last sleep (tick - spin - margin)."""
    from control_node.diagnosis.attribution import Recorder, attribute, sleep_lead_ns
    P, lead = 1_000_000, sleep_lead_ns(150_000, 100_000)
    assert lead == 250_000
    n = 20
    tick = np.arange(n, dtype=np.int64) * P + 10**9
    wake = np.zeros(n, dtype=np.int64)
    ct = np.full(n, 5_000, dtype=np.int64)
    flags = np.full(n, 64, dtype=np.int64)                 # FLAG_INFER
    wake[10], wake[11] = 1_295_000, 300_000 + 5_000        # cycle 10 ends at tick[11] + 300 us
    flags[10] |= 1
    arrays = {"cycle": np.arange(n), "flags": flags, "t_tick_ns": tick, "wake_latency_ns": wake, "cycle_time_ns": ct}
    rec = Recorder(cpu=1, loop_tid=1, tracing=False)
    rec.evidence = {"trace": {"granted": True}, "virtual_machine": {"vm": True}}
    # the only evidence: cycle 10's timer interrupt, 1.2 ms after its sleep was due
    rec.intervals.append(("vector", "local_timer", int(tick[10]) - lead + 1_200_000, int(tick[10]) - lead + 1_205_000))
    w = attribute(rec, arrays, P, P, lead)
    ev = {e["cycle"]: e for e in w["events"]}
    assert ev[10]["cause"] == "hypervisor" and ev[10]["timer_irq_late_us"] == 1200.0
    assert ev[11]["cause"] == "hypervisor" and ev[11]["carried_from_cycle"] == 10 and "carried over" in ev[11]["why"]
    assert w["late_time_named_share"] == 1.0
