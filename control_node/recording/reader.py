"""Read recordings (tolerating a truncated file) and compare replayed actions with recorded ones."""
from __future__ import annotations

import numpy as np

from control_node.recording import ACTION, DIAGNOSTICS


def iter_messages(path):
    """Yield ``(topic, data, log_time, publish_time, sequence)`` in file order.

    Streams the file, so a recording whose recorder was killed (no summary/footer, maybe a torn last
    chunk) yields every message up to its last complete chunk instead of failing.
    """
    from mcap.reader import NonSeekingReader
    with open(path, "rb") as f:
        reader = NonSeekingReader(f)
        it = reader.iter_messages(log_time_order=False)
        while True:
            try:
                _schema, ch, msg = next(it)
            except StopIteration:
                return
            except Exception:  # truncated or torn tail: stop at the last complete record
                return
            yield ch.topic, msg.data, msg.log_time, msg.publish_time, msg.sequence


def read_recording(path, topics=None):
    """``{topic: [(data, log_time), ...]}`` for the requested topics (all when None)."""
    import os

    from control_node.errors import UserError
    if not os.path.exists(path):
        raise UserError(f"recording {path} does not exist")
    out = {t: [] for t in (topics or [])}
    for topic, data, log_time, _pt, _seq in iter_messages(path):
        if topics is None or topic in out:
            out.setdefault(topic, []).append((data, log_time))
    return out


def recorded_answers(path):
    """Map seq -> (action, safe) of the first recorded action carrying that seq. ``action`` is the class
    index (int) of a v1 message, or the action vector (tuple of floats) of a v2 message (``u``)."""
    import msgpack
    ans = {}
    for raw, _lt in read_recording(path, [ACTION])[ACTION]:
        d = msgpack.unpackb(raw)
        s = d.get("seq", -1)
        if s >= 0 and s not in ans:
            ans[s] = (tuple(float(v) for v in d["u"]) if "u" in d else int(d["action"]), bool(d["safe"]))
    return ans


def u_mismatch(got, recorded, atol):
    """First component where ``got`` differs from ``recorded`` by more than atol * max(1, |recorded|):
    (index, |diff|, tolerance), or None when all match (a different length is a mismatch at index -1)."""
    got = np.asarray(got, dtype=np.float64)
    rec = np.asarray(recorded, dtype=np.float64)
    if got.shape != rec.shape:
        return -1, float("inf"), 0.0
    diff = np.abs(got - rec)
    tol = atol * np.maximum(1.0, np.abs(rec))
    bad = np.flatnonzero(~(diff <= tol))            # NaN is a mismatch
    if bad.size == 0:
        return None
    j = int(bad[0])
    return j, float(diff[j]), float(tol[j])


def verify(recorded_seq, res, answers, atol=1e-6):
    """Compare live answers (``res`` from the engine, one row per replayed frame) with recorded ones.

    Class actions (v1) must be equal; action vectors (v2, ``res["u"]``) must agree per component within
    ``atol * max(1, |recorded|)``. Returns (compared, mismatches) where mismatches is a list of dicts with
    the recorded seq (and, for vectors, the first differing ``component``, ``diff`` and ``tol``). Frames
    whose recorded answer is missing or safe are not compared.
    """
    mismatches = []
    compared = 0
    live_u = res.get("u")
    for i, rs in enumerate(np.asarray(recorded_seq).tolist()):
        rec = answers.get(rs)
        if rec is None or rec[1]:
            continue
        compared += 1
        lost = res["rtt_ns"][i] < 0
        safe = bool(res["safe"][i])
        vector = isinstance(rec[0], tuple)
        if vector:
            got = None if live_u is None else [float(v) for v in live_u[i]]
            bad = None if (lost or safe or got is None) else u_mismatch(got, rec[0], atol)
            if lost or safe or got is None or bad is not None:
                m = {"seq": int(rs), "recorded": list(rec[0]), "replayed": None if lost else got,
                     "safe": safe, "lost": bool(lost)}
                if got is None and not lost:
                    m["replayed"] = int(res["action"][i])        # the live node answers with a class
                    m["kind"] = "the recording holds action vectors (u) but the node answers with classes"
                if bad is not None:
                    m.update(component=bad[0], diff=bad[1], tol=bad[2])
                mismatches.append(m)
        else:
            got = int(res["action"][i])
            if live_u is not None and not lost:
                mismatches.append({"seq": int(rs), "recorded": rec[0], "replayed": [float(v) for v in live_u[i]],
                                   "safe": safe, "lost": False,
                                   "kind": "the recording holds classes but the node answers with vectors (u)"})
            elif lost or safe or got != rec[0]:
                mismatches.append({"seq": int(rs), "recorded": rec[0],
                                   "replayed": None if lost else got, "safe": safe, "lost": bool(lost)})
    return compared, mismatches


def recorded_transitions(path):
    """The node's policy transitions recorded in a file (``lifecycle.transitions`` of its diagnostics
    snapshots, each numbered ``n``), once each, in order. Empty for a recording of an older node."""
    import msgpack
    seen = {}
    for raw, _lt in read_recording(path, [DIAGNOSTICS])[DIAGNOSTICS]:
        d = msgpack.unpackb(raw)
        for e in ((d.get("lifecycle") or {}).get("transitions") or []):
            seen.setdefault(e["n"], e)
    return [seen[k] for k in sorted(seen)]


SWITCH_EVENTS = ("activate", "canary", "rollback", "auto_rollback")


def policy_switches(transitions):
    """Which policy was active from which frame on: ``[(seq, name, path, sha256, event)]`` in order, each
    the active policy for the frames after ``seq`` (the last frame the old policy acted on; -1: from the
    start, as the start-up policy)."""
    out = []
    for e in transitions:
        if e["event"] in SWITCH_EVENTS and e.get("policy"):
            out.append((-1 if e.get("seq") is None else int(e["seq"]), e["policy"], e.get("path"), e.get("sha256"),
                        e["event"]))
    return out
