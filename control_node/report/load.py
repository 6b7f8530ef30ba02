"""Reading run directories for the report: node and simulator runs, validated, with the metrics
they carry. The formats themselves are defined in :mod:`control_node.rundir`.
"""
from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from control_node import rundir
from control_node.errors import UserError

PCTS = [("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p999", 99.9), ("p9999", 99.99)]
PCT_LABELS = {"p50": "p50", "p90": "p90", "p99": "p99", "p999": "p99.9", "p9999": "p99.99", "max": "max"}
STAT_KEYS = [k for k, _ in PCTS] + ["max"]

# metric name -> (summary.json key, cycles.npz array, title)
NODE_METRICS = [
    ("wake_latency_ns", "wake_latency_ns", "wake_latency_ns", "wake-up latency"),
    ("recv_ns", "recv_ns", "recv_ns", "recv phase"),
    ("infer_ns", "infer_ns", "infer_ns", "infer phase"),
    ("publish_ns", "publish_ns", "publish_ns", "publish phase"),
    ("cycle_time_ns", "cycle_time_ns", "cycle_time_ns", "cycle time"),
    ("period_ns", "period_ns_stats", "period_ns", "period"),
    ("input_age_ns", "input_age_ns", "input_age_ns", "input age"),
]
SIM_METRICS = [("round_trip_ns", "round_trip_ns", "rtt_ns", "sim round trip")]
METRIC_TITLES = {m[0]: m[3] for m in NODE_METRICS + SIM_METRICS}

CYCLE_ARRAYS = {name: np.dtype(dt).kind for name, dt in rundir.RING_FIELDS.items()}
SIM_ARRAYS = {"seq": "i", "t_send_ns": "i", "t_action_ns": "i", "rtt_ns": "i", "truth": "i", "action": "i",
              "safe": "b"}

# counters some nodes add beyond the spec; shown when present
EXTRA_COUNTERS = [("skipped_ticks", "skipped ticks"), ("send_failures", "send failures"),
                  ("recv_errors", "receive errors")]
NODE_REQUIRED = ["run_id", "rate_hz", "period_ns", "cycles", "ring"]
CONTROL_ARRAYS = {"t_s": "f", "theta": "f", "u": "f", "safe": "b"}
SIM_REQUIRED = ["frames_sent", "actions_received"]


@dataclass
class NodeRun:
    path: Path
    summary: dict
    arrays: dict | None  # cycles.npz arrays, None when empty
    hist: dict | None = None  # histograms.npz: metric -> bucket counts (whole run), when present
    actions: dict | None = None  # actions.npz (continuous policies): "cycle" (n,), "u" (n, n_actions)

    @property
    def complete(self) -> bool:
        return bool(self.summary.get("ring", {}).get("complete")) and self.arrays is not None


@dataclass
class SimRun:
    path: Path
    summary: dict
    arrays: dict | None  # roundtrip.npz arrays, None when absent
    control: dict | None = None  # control.npz of a physics simulator (pendulum): t_s, theta, u, safe, t0_ns


@dataclass
class Run:
    path: Path
    node: NodeRun | None = None
    sim: SimRun | None = None
    label: str = ""
    extra: dict = field(default_factory=dict)


def _read_summary(d: Path) -> dict:
    f = d / "summary.json"
    if not f.is_file():
        raise UserError(f"{f}: missing (not a complete run dir: the node writes summary.json when a run ends)")
    try:
        s = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UserError(f"{f}: not valid JSON ({e}); the file is corrupt or truncated") from None
    if not isinstance(s, dict):
        raise UserError(f"{f}: top level is {type(s).__name__}, expected a JSON object")
    fmt = s.get("format")
    if fmt != rundir.SUMMARY_FORMAT:
        raise UserError(f"{f}: format {fmt!r} is not supported (this control-node reads format {rundir.SUMMARY_FORMAT})")
    return s


def _read_npz(f: Path, spec: dict) -> dict:
    if not f.is_file():
        raise UserError(f"{f}: missing (the run dir is incomplete)")
    try:
        with np.load(f, allow_pickle=False) as z:
            names = set(z.files)
            missing = [k for k in spec if k not in names and k not in rundir.RING_OPTIONAL]
            if missing:
                raise UserError(f"{f}: arrays missing: {', '.join(missing)}")
            arrays = {k: np.asarray(z[k]) for k in spec if k in names}
        if arrays:           # fields an older run lacks: their "none" value for every cycle
            n0 = next(iter(arrays.values())).shape[0]
            for k in spec:
                if k not in arrays:
                    arrays[k] = np.full(n0, rundir.RING_OPTIONAL[k], dtype=rundir.RING_FIELDS[k])
    except UserError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise UserError(f"{f}: cannot be read ({type(e).__name__}: {e}); the file is corrupt or truncated") from None
    lengths = {k: a.shape for k, a in arrays.items()}
    n = None
    for k, a in arrays.items():
        if a.ndim != 1:
            raise UserError(f"{f}: array '{k}' has shape {a.shape}, expected 1-D")
        if a.dtype.kind not in (spec[k], "i", "u") and not (spec[k] == "b" and a.dtype.kind == "b"):
            raise UserError(f"{f}: array '{k}' has dtype {a.dtype}, expected a numeric array")
        if n is None:
            n = a.shape[0]
        elif a.shape[0] != n:
            raise UserError(f"{f}: arrays have different lengths: "
                            + ", ".join(f"{k}={s[0]}" for k, s in lengths.items()))
    return arrays


def _load_node(d: Path, s: dict) -> NodeRun:
    missing = [k for k in NODE_REQUIRED if k not in s]
    if missing:
        raise UserError(f"{d / 'summary.json'}: node summary lacks {', '.join(missing)}")
    arrays = _read_npz(d / "cycles.npz", CYCLE_ARRAYS)
    rec = s.get("ring", {}).get("recorded")
    n = len(arrays["cycle"])
    if rec is not None and rec != n:
        raise UserError(f"{d / 'cycles.npz'}: holds {n} cycles but summary.json says ring.recorded = {rec}")
    hist = None
    hf = d / "histograms.npz"
    if hf.exists():  # optional: the node's streaming histograms over the whole run
        try:
            with np.load(hf, allow_pickle=False) as z:
                hist = {k: np.asarray(z[k], dtype=np.int64) for k in z.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as e:
            raise UserError(f"{hf}: cannot be read ({type(e).__name__}: {e}); the file is corrupt or "
                            "truncated (delete it to report from summary.json and cycles.npz only)") from None
        for k, c in hist.items():
            if c.ndim != 1:
                raise UserError(f"{hf}: array '{k}' has shape {c.shape}, expected 1-D bucket counts")
    return NodeRun(d, s, arrays if n else None, hist, _read_actions(d))


def _read_actions(d: Path) -> dict | None:
    """actions.npz of a continuous policy's run (rundir.ACTIONS_FILE), validated; None when absent."""
    f = d / rundir.ACTIONS_FILE
    if not f.exists():
        return None
    try:
        a = rundir.read_node_actions(d)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise UserError(f"{f}: cannot be read ({type(e).__name__}: {e}); the file is corrupt or truncated "
                        "(delete it to report without the action plot)") from None
    if a is None or "u" not in a or "cycle" not in a:
        raise UserError(f"{f}: arrays missing: expected 'cycle' and 'u'")
    u, cyc = np.asarray(a["u"]), np.asarray(a["cycle"])
    if u.ndim != 2 or cyc.ndim != 1 or u.shape[0] != cyc.shape[0]:
        raise UserError(f"{f}: 'u' has shape {u.shape} and 'cycle' {cyc.shape}; expected (n, n_actions) and (n,)")
    return {"cycle": cyc, "u": u} if cyc.size else None


def _load_sim(d: Path, s: dict) -> SimRun:
    missing = [k for k in SIM_REQUIRED if k not in s]
    if missing:
        raise UserError(f"{d / 'summary.json'}: sim summary lacks {', '.join(missing)}")
    f = d / "roundtrip.npz"
    arrays = _read_npz(f, SIM_ARRAYS) if f.exists() else None
    c = d / "control.npz"
    control = _read_npz(c, CONTROL_ARRAYS) if c.exists() else None
    return SimRun(d, s, arrays, control)


def _load_one(d: Path):
    s = _read_summary(d)
    role = s.get("role")
    if role == "node":
        return _load_node(d, s)
    if role in ("sim", "replay"):  # the replayer writes the simulator's format
        return _load_sim(d, s)
    raise UserError(f"{d / 'summary.json'}: role {role!r} unknown (expected 'node', 'sim' or 'replay')")


def load_run(path) -> Run:
    """A node run dir, a sim run dir, or a launch dir holding ``node/`` and/or ``sim/``."""
    d = Path(path)
    if not d.exists():
        raise UserError(f"{d}: no such run dir")
    if not d.is_dir():
        raise UserError(f"{d}: not a directory (pass a run dir such as runs/<id>/)")
    run = Run(d)
    subs = [sub for sub in ("node", "sim", "replay") if (d / sub).is_dir()]
    if subs:  # a launch dir: node/ plus the driver's sim/ or replay/
        if "sim" in subs and "replay" in subs:
            raise UserError(f"{d}: holds both sim/ and replay/; report them as separate launch dirs")
        for sub in subs:
            r = _load_one(d / sub)
            if not isinstance(r, NodeRun if sub == "node" else SimRun):
                raise UserError(f"{d / sub / 'summary.json'}: role {r.summary.get('role')!r} in {sub}/")
            setattr(run, "node" if sub == "node" else "sim", r)
    else:
        if not any(d.iterdir()):
            raise UserError(f"{d}: empty directory, not a run dir (expected summary.json and cycles.npz)")
        r = _load_one(d)
        if isinstance(r, NodeRun):
            run.node = r
        else:
            run.sim = r
    if run.node is not None:
        run.label = str(run.node.summary.get("run_id") or d.name)
    else:
        run.label = str(run.sim.summary.get("run_id") or d.name)
    if run.label in ("node", "sim", "replay"):
        run.label = d.name
    return run
