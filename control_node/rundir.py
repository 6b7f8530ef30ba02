"""Every run-directory format, defined once: what the loop writes, the node saves and the report reads.

A node run directory holds ``summary.json`` (``format`` = :data:`SUMMARY_FORMAT`), ``cycles.npz`` (one
array per :data:`RING_FIELDS` entry, oldest cycle first) and ``histograms.npz`` (one row of
:data:`HIST_BUCKETS` counts per :data:`HIST_NAMES` entry, the log-linear layout of ``loop/rt_hist.h``).
A run of a continuous policy adds ``actions.npz`` (:data:`ACTIONS_FILE`): the published action vector of
each of the last cycles (:data:`ACTION_RING_FIELDS`), a ring bounded by :data:`ACTION_RING_MAX_BYTES`
(:func:`action_ring_capacity`), so it may hold fewer cycles than ``cycles.npz``.
Per-cycle ``flags`` are the :data:`FLAGS` bits; rejected frames are counted under :data:`REASONS`, whose
index is the C reason code of ``loop/frame_codec.h``.

The compiled loop restates these numbers as C constants. :func:`check_compiled` compares them at
import of ``control_node.loop._rtloop``, so a reordered C enum fails loudly instead of mislabelling runs.
This module imports only numpy: the loop, the node, the report, the simulator and the tests all use it.
"""
from __future__ import annotations

import json
import os

import numpy as np

SUMMARY_FORMAT = 1          # summary.json "format" (node and simulator run directories)
REPORT_FORMAT = 1           # report.json "format" (control-node report)

# per-cycle flag bits (cycles.npz "flags", uint8)
FLAGS = {
    "miss": 1,              # the cycle ended after its deadline
    "stale": 2,             # no valid frame within watchdog.stale_after_ms: safe action
    "rejected": 4,          # at least one frame this cycle was rejected (see REASONS)
    "safe": 8,              # the published action is the safe action
    "new_frame": 16,        # the cycle acted on a frame it had not acted on before
    "no_frame_yet": 32,     # no valid frame since start: the seq in the ring is meaningless
    "infer": 64,            # an inference tick: the policy ran (else a hold tick: the last action again)
    "phase_shift": 128,     # phase lock moved the schedule after this tick (its frame's lead was off the margin)
}
FLAG_MISS, FLAG_STALE, FLAG_REJECTED = FLAGS["miss"], FLAGS["stale"], FLAGS["rejected"]
FLAG_SAFE, FLAG_NEW_FRAME, FLAG_NO_FRAME_YET = FLAGS["safe"], FLAGS["new_frame"], FLAGS["no_frame_yet"]
FLAG_INFER, FLAG_PHASE_SHIFT = FLAGS["infer"], FLAGS["phase_shift"]

# why a frame was rejected; index = CN_* code in loop/frame_codec.h ("ok" = 0 is never counted)
REASONS = ("ok", "oversized", "multipart", "malformed", "not_a_map", "missing_field", "wrong_type",
           "feature_count", "non_finite", "seq_not_increasing", "non_finite_output")

# the loop's per-cycle ring (cycles.npz): name -> dtype; -1 marks "not measured" in the int64 fields
RING_FIELDS = {
    "cycle": "int64", "t_tick_ns": "int64", "wake_latency_ns": "int64", "recv_ns": "int64",
    "infer_ns": "int64", "publish_ns": "int64", "cycle_time_ns": "int64", "period_ns": "int64",
    "input_age_ns": "int64", "flags": "uint8", "action": "int16", "seq": "uint64",
    # the policy lifecycle: the slot of the policy that acted, and the shadow's verdict on this cycle's
    # inference (SHADOW_CODES), its distance from the active policy's answer (L2 of the action vectors;
    # argmax: 0 or 1; -1: none) and the time it took after the publish (-1: no shadow ran)
    "policy": "int8", "shadow": "uint8", "shadow_dist": "float32", "shadow_ns": "int64",
}
# ring fields a run may lack (written since the policy lifecycle; older runs and hand-made ones have
# none): their value for every cycle when absent
RING_OPTIONAL = {"policy": 0, "shadow": 0, "shadow_dist": -1.0, "shadow_ns": -1}
# the policy lifecycle (control_node.lifecycle): resident policies at most, the transitions the loop
# records (code = index + 1), why (index), and the shadow's per-cycle verdict
MAX_POLICIES = 8
TRANSITIONS = ("activate", "canary", "shadow", "unshadow", "rollback", "auto_rollback", "promote")
TRANSITION_REASONS = ("request", "non_finite", "cycle_budget", "disagreement", "canary_passed", "no_previous")
SHADOW_CODES = ("none", "agree", "disagree", "non_finite")

# continuous policies: the per-cycle action ring (actions.npz). "u" is (cycles, n_actions) float32, the
# action the cycle published (policy or safe); actions.npz also holds "cycle" (int64, the cycle number of
# each row). float32 and at most ACTION_RING_MAX_BYTES: a wide policy keeps fewer cycles than the main ring.
ACTION_RING_FIELDS = {"u": "float32"}
ACTION_RING_MAX_BYTES = 64 << 20
ACTIONS_FILE = "actions.npz"
# cycles.npz "action" of a continuous policy's cycle: ACTION_POLICY (the policy's answer) or ACTION_SAFE
ACTION_POLICY, ACTION_SAFE = 0, -1

# streaming histograms (histograms.npz, whole run): one row per quantity, in this order
HIST_NAMES = ("wake_latency_ns", "cycle_time_ns", "input_age_ns", "recv_ns", "infer_ns", "publish_ns",
              "period_ns")
HIST_SUB_BITS = 7           # exact below 128 ns, then 128 sub-buckets per power of two (<= 0.8% low)
HIST_BUCKETS = (64 - HIST_SUB_BITS) << HIST_SUB_BITS

PCTS = {"p50": 50, "p90": 90, "p99": 99, "p999": 99.9, "p9999": 99.99}


def check_compiled(constants: dict) -> None:
    """Raise ImportError unless the compiled loop's constants equal the definitions above.

    ``constants``: {"flags": {name: bit}, "reasons": {name: code}, "hist": {name: row},
    "hist_sub_bits": int, "hist_buckets": int, "ring": {name: itemsize}, "action_ring": {name: itemsize},
    "action_codes": {"policy": int, "safe": int}}."""
    problems = []
    if constants["flags"] != FLAGS:
        problems.append(f"flag bits {constants['flags']} != {FLAGS}")
    want = {name: code for code, name in enumerate(REASONS)}
    if constants["reasons"] != want:
        problems.append(f"reject reason codes {constants['reasons']} != {want}")
    if constants["hist"] != {name: i for i, name in enumerate(HIST_NAMES)}:
        problems.append(f"histogram rows {constants['hist']} != {HIST_NAMES}")
    if (constants["hist_sub_bits"], constants["hist_buckets"]) != (HIST_SUB_BITS, HIST_BUCKETS):
        problems.append(f"histogram layout {constants['hist_sub_bits']}/{constants['hist_buckets']} != "
                        f"{HIST_SUB_BITS}/{HIST_BUCKETS}")
    ring = {name: np.dtype(dt).itemsize for name, dt in RING_FIELDS.items()}
    if constants["ring"] != ring:
        problems.append(f"ring fields {constants['ring']} != {ring}")
    action_ring = {name: np.dtype(dt).itemsize for name, dt in ACTION_RING_FIELDS.items()}
    if constants.get("action_ring") != action_ring:
        problems.append(f"action ring fields {constants.get('action_ring')} != {action_ring}")
    codes = {"policy": ACTION_POLICY, "safe": ACTION_SAFE}
    if constants.get("action_codes") != codes:
        problems.append(f"continuous action codes {constants.get('action_codes')} != {codes}")
    if constants.get("max_policies") != MAX_POLICIES:
        problems.append(f"policy slots {constants.get('max_policies')} != {MAX_POLICIES}")
    if constants.get("transitions") != {name: i + 1 for i, name in enumerate(TRANSITIONS)}:
        problems.append(f"transition codes {constants.get('transitions')} != {TRANSITIONS}")
    if constants.get("transition_reasons") != {name: i for i, name in enumerate(TRANSITION_REASONS)}:
        problems.append(f"transition reasons {constants.get('transition_reasons')} != {TRANSITION_REASONS}")
    if constants.get("shadow_codes") != {name: i for i, name in enumerate(SHADOW_CODES)}:
        problems.append(f"shadow codes {constants.get('shadow_codes')} != {SHADOW_CODES}")
    if problems:
        raise ImportError("the compiled loop disagrees with control_node/rundir.py: " + "; ".join(problems)
                          + ". Fix: make the C constants and rundir.py agree, then rebuild (pip install -e .)")


def new_ring(capacity: int) -> dict:
    """Zeroed ring arrays (``RING_FIELDS``), every page touched now (np.zeros maps them lazily)."""
    ring = {name: np.zeros(capacity, dt) for name, dt in RING_FIELDS.items()}
    for a in ring.values():
        a.fill(1)
        a.fill(0)
    return ring


def action_ring_capacity(ring_cycles: int, n_actions: int) -> int:
    """Cycles the action ring of a continuous policy keeps: the main ring's, unless ``n_actions`` float32
    per cycle would take more than :data:`ACTION_RING_MAX_BYTES`; then as many as fit."""
    itemsize = np.dtype(ACTION_RING_FIELDS["u"]).itemsize
    return int(max(1, min(int(ring_cycles), ACTION_RING_MAX_BYTES // (itemsize * max(1, int(n_actions))))))


def new_action_ring(capacity: int, n_actions: int) -> np.ndarray:
    """The zeroed (capacity, n_actions) action ring, every page touched now."""
    u = np.zeros((capacity, n_actions), ACTION_RING_FIELDS["u"])
    u.fill(1)
    u.fill(0)
    return u


def ordered_action_ring(u: np.ndarray, cycles: int) -> dict:
    """actions.npz arrays: ``cycle`` (int64) and ``u`` rows, oldest first, of the ring ``u`` after
    ``cycles`` cycles (row ``c % capacity`` holds cycle c)."""
    capacity = u.shape[0]
    kept = min(cycles, capacity)
    first = cycles - kept
    idx = np.arange(first, cycles, dtype=np.int64)
    return {"cycle": idx, "u": u[idx % capacity].copy()}


def flag_names(flags: int) -> str:
    """``"miss|stale"`` for a flags value; ``"-"`` when none is set."""
    return "|".join(k for k, bit in FLAGS.items() if flags & bit) or "-"


# ---- figures: the {p50, p90, p99, p999, p9999, max, mean, count} dict summary.json uses ----

def describe(values) -> dict:
    """{p50, p90, p99, p999, p9999, max, mean, count} of an int array (ns); Nones when empty.

    Percentiles are numpy's default (linear interpolation) on the raw values."""
    v = np.asarray(values)
    if v.size == 0:
        return {**{k: None for k in PCTS}, "max": None, "mean": None, "count": 0}
    q = np.percentile(v, list(PCTS.values()))
    out = {k: float(x) for k, x in zip(PCTS, q)}
    out.update(max=float(v.max()), mean=float(v.mean()), count=int(v.size))
    return out


def hist_lower_bounds(n_buckets: int = HIST_BUCKETS) -> np.ndarray:
    """Lowest value (int64 ns) of each bucket of the log-linear histogram (``loop/rt_hist.h``)."""
    i = np.arange(n_buckets, dtype=np.int64)
    sub = 1 << HIST_SUB_BITS
    e = (i >> HIST_SUB_BITS) + HIST_SUB_BITS - 1
    mant = i & (sub - 1)
    lower = (sub + mant) << np.maximum(e - HIST_SUB_BITS, 0)
    return np.where(i < sub, i, lower)


def hist_quantiles(counts, pcts) -> np.ndarray:
    """Bucket lower bounds at percentiles ``pcts`` (0-100) of a histogram row; NaN when empty."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return np.full(len(pcts), np.nan)
    lows = hist_lower_bounds(len(counts))
    cum = np.cumsum(counts)
    ranks = np.maximum(1, np.ceil(np.asarray(pcts, dtype=float) / 100 * total)).astype(np.int64)
    return lows[np.searchsorted(cum, ranks)].astype(float)


def describe_hist(counts) -> dict:
    """Same fields as :func:`describe`, from a streaming histogram (bucket lower bounds, <= 0.8% low).

    Works on a copy: the running loop may be writing the histogram meanwhile."""
    counts = np.array(counts, dtype=np.int64, copy=True)
    total = int(counts.sum())
    if total == 0:
        return {**{k: None for k in PCTS}, "max": None, "mean": None, "count": 0}
    lows = hist_lower_bounds(len(counts))
    q = hist_quantiles(counts, list(PCTS.values()))
    out = {k: float(x) for k, x in zip(PCTS, q)}
    nz = np.flatnonzero(counts)
    out.update(max=float(lows[nz[-1]]), mean=float((lows * counts).sum() / total), count=total)
    return out


# ---- writing and reading a node run directory ----

def ordered_ring(ring: dict, cycles: int, capacity: int) -> dict:
    """Ring arrays oldest first, trimmed to what was recorded (``cycles`` written into ``capacity``)."""
    out = {}
    for name, a in ring.items():
        if cycles <= capacity:
            out[name] = a[:cycles].copy()
        else:
            start = cycles % capacity
            out[name] = np.concatenate([a[start:], a[:start]])
    return out


def write_node_run(run_dir: str, summary: dict, cycles: dict, histograms: dict, actions: dict | None = None) -> None:
    """Write cycles.npz, histograms.npz, actions.npz (continuous policies: ``actions`` from
    :func:`ordered_action_ring`) and (atomically, last) summary.json."""
    os.makedirs(run_dir, exist_ok=True)
    np.savez(os.path.join(run_dir, "cycles.npz"), **cycles)
    np.savez(os.path.join(run_dir, "histograms.npz"), **histograms)
    if actions is not None:
        np.savez(os.path.join(run_dir, ACTIONS_FILE), **actions)
    tmp = os.path.join(run_dir, "summary.json.tmp")
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=2, default=str)
    os.replace(tmp, os.path.join(run_dir, "summary.json"))


def read_node_run(run_dir) -> tuple[dict, dict]:
    """(summary dict, cycles.npz arrays by name) of a node run directory."""
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    with np.load(os.path.join(run_dir, "cycles.npz")) as z:
        arrays = {k: z[k] for k in z.files}
    return summary, arrays


def read_node_actions(run_dir) -> dict | None:
    """actions.npz of a continuous policy's run (``cycle``, ``u``), or None when the run has none."""
    path = os.path.join(run_dir, ACTIONS_FILE)
    if not os.path.exists(path):
        return None
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def copy_line(choice: dict | None) -> str:
    """summary.json ``model.copy`` (kernels/dispatch.py's choice) as one line: ``kernel copy avx2 (runs avx2+fma),
    fastest measured: avx2 4.62 us, avx512 5.23 us, ... (cache)``; "" when not recorded (older runs)."""
    if not choice:
        return ""
    if choice.get("source") == "forced":
        return f"kernel copy {choice.get('copy')} (forced by isa = \"{choice.get('copy')}\"; runs {choice.get('isa')})"
    if choice.get("source") == "widest":
        return f"kernel copy: the widest this CPU runs ({choice.get('isa')})"
    t = choice.get("times_ns") or {}
    return (f"kernel copy {choice.get('copy')} (runs {choice.get('isa')}), fastest measured on this machine: "
            + ", ".join(f"{c} {v / 1e3:.3g} us" for c, v in sorted(t.items(), key=lambda kv: kv[1]))
            + f" ({choice.get('source')})")
