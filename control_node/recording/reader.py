"""Read recordings (tolerating a truncated file) and compare replayed actions with recorded ones."""
from __future__ import annotations

import numpy as np

from control_node.recording import ACTION


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
    """Map seq -> (action, safe) of the first recorded action carrying that seq."""
    import msgpack
    ans = {}
    for raw, _lt in read_recording(path, [ACTION])[ACTION]:
        d = msgpack.unpackb(raw)
        s = d.get("seq", -1)
        if s >= 0 and s not in ans:
            ans[s] = (int(d["action"]), bool(d["safe"]))
    return ans


def verify(recorded_seq, res, answers):
    """Compare live answers (``res`` from the engine, one row per replayed frame) with recorded ones.

    Returns (compared, mismatches) where mismatches is a list of dicts with the recorded seq.
    Frames whose recorded answer is missing or safe are not compared.
    """
    mismatches = []
    compared = 0
    for i, rs in enumerate(np.asarray(recorded_seq).tolist()):
        rec = answers.get(rs)
        if rec is None or rec[1]:
            continue
        compared += 1
        got = int(res["action"][i])
        lost = res["rtt_ns"][i] < 0
        safe = bool(res["safe"][i])
        if lost or safe or got != rec[0]:
            mismatches.append({"seq": int(rs), "recorded": rec[0],
                               "replayed": None if lost else got, "safe": safe, "lost": bool(lost)})
    return compared, mismatches
