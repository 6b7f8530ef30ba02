"""control-node export: convert a msgpack MCAP recording to a JSON-encoded MCAP (Foxglove), CSV or a rosbag2."""


def register(sub):
    p = sub.add_parser("export", help="convert a recording to JSON-encoded MCAP (for Foxglove) or CSV",
                       description="Foxglove cannot decode the msgpack message encoding of `control-node record`. "
                                   "--to json-mcap writes an MCAP with message encoding json and jsonschema "
                                   "schemas that Foxglove decodes and plots; --to csv writes one CSV per channel. "
                                   "A continuous policy's action vector `u` becomes one column per component "
                                   "(CSV), named after the action names the recorded diagnostics announce, else "
                                   "u0, u1, ...; the JSON MCAP keeps `u` and adds `u_by_name`. The JSON MCAP also "
                                   "holds the live view's channels (/control_node/observation, action, cycle, "
                                   "events; the same schemas and values as `launch --foxglove`), so the packaged "
                                   "Foxglove layouts open it as they open the live view (docs/live.md).")
    p.add_argument("file", help="MCAP recording from `control-node record`")
    p.add_argument("--to", choices=["json-mcap", "csv", "rosbag2"], default="json-mcap",
                   help="output format (default: %(default)s); rosbag2: a ROS 2 bag directory (MCAP storage, CDR), "
                        "observations and actions as the --config's [ros2] types (docs/ros2.md)")
    p.add_argument("--out", help="output file (json-mcap; default FILE.json.mcap) or directory (csv; default FILE_csv/; "
                                 "rosbag2: default FILE_rosbag2/, must not exist)")
    p.add_argument("--every", type=int, default=1, metavar="N",
                   help="json-mcap: the live view's channels keep one frame and action in N and one "
                        "/control_node/cycle message per N cycles (default: %(default)s, every one)")
    p.add_argument("--config", help="rosbag2: the node config whose [ros2] recipe names the observation and action "
                                    "topics and types (without one: Float64MultiArray on /control_node/...)")
    return p


SCHEMAS = {
    "/sensor": {"title": "control_node.SensorFrame", "type": "object", "properties": {
        "seq": {"type": "integer"}, "t_ns": {"type": "integer", "description": "sender CLOCK_MONOTONIC ns"},
        "x": {"type": "array", "items": {"type": "number"}},
        "truth": {"type": "integer", "description": "simulator ground-truth class"},
        "u_expected": {"type": "array", "items": {"type": "number"},
                       "description": "simulator: the action a continuous policy should answer"}}},
    "/action": {"title": "control_node.Action", "type": "object", "properties": {
        "seq": {"type": "integer"}, "t_ns": {"type": "integer"}, "cycle": {"type": "integer"},
        "action": {"type": "integer", "description": "v1 (argmax policies): class index"},
        "u": {"type": "array", "items": {"type": "number"}, "description": "v2 (continuous policies): actions"},
        "u_by_name": {"type": "object", "description": "v2: u by action name (added by the export)"},
        "safe": {"type": "boolean"}}},
    "/diagnostics": {"title": "control_node.Diagnostics", "type": "object", "properties": {
        "t_ns": {"type": "integer"}, "cycles": {"type": "integer"}, "rate_hz": {"type": "number"},
        "deadline_misses": {"type": "integer"}, "stale_cycles": {"type": "integer"},
        "safe_actions": {"type": "integer"}, "superseded": {"type": "integer"}, "frames_valid": {"type": "integer"},
        "rejected": {"type": "object"}, "window": {"type": "object"}, "rt": {"type": "object"},
        "policy": {"type": "object", "description": "kind, n_features, n_actions, action_names, safe_action"}}},
}


def _jsonable(v):
    import numpy as np
    if isinstance(v, dict):
        return {str(k.decode() if isinstance(k, bytes) else k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        if len(v) % 8 == 0:
            return np.frombuffer(v, dtype="<f8").tolist()
        return v.hex()
    if isinstance(v, float) and v != v:
        return None
    return v


def action_columns(names, n, taken=()):
    """Column names for the n components of ``u``: the action names when they are known, n of them, unique
    and not clashing with the message's other columns; else u0..u{n-1}."""
    if names and len(names) == n and len(set(names)) == n and not set(names) & set(taken) and all(names):
        return [str(x) for x in names]
    return [f"u{i}" for i in range(n)]


def recorded_snapshots(path):
    """The recording's /diagnostics snapshots, decoded, in order (a torn one skipped: it names nothing)."""
    import msgpack

    from control_node.recording import DIAGNOSTICS
    from control_node.recording.reader import iter_messages
    for topic, data, *_ in iter_messages(path):
        if topic != DIAGNOSTICS:
            continue
        try:
            d = msgpack.unpackb(data, raw=False, strict_map_key=False)
        except Exception:       # noqa: BLE001 - a torn message names nothing
            continue
        if isinstance(d, dict):
            yield d


def recorded_action_names(path):
    """The action names the recording's /diagnostics announce (``policy.action_names``), or None."""
    for d in recorded_snapshots(path):
        pol = d.get("policy")
        if isinstance(pol, dict) and isinstance(pol.get("action_names"), list):
            return [str(x) for x in pol["action_names"]]
    return None


def recorded_policy(path):
    """The ``policy`` map the recording's /diagnostics announce, or {}."""
    for d in recorded_snapshots(path):
        if isinstance(d.get("policy"), dict):
            return d["policy"]
    return {}


def recorded_legged(path):
    """The legged names and frame layout the recording's /diagnostics announce (``legged`` with ``joints``), or
    None (not a legged node, or recorded before the snapshots carried them)."""
    for d in recorded_snapshots(path):
        lg = d.get("legged")    # the node's first snapshot says: every snapshot carries the same names
        return lg if isinstance(lg, dict) and lg.get("joints") and lg.get("frame") else None
    return None


class LiveChannels:
    """The live view's channels (control_node.live.channels) written beside the recorded ones: one
    converter for the file, its wall-clock offset fixed by the first message that carries a send time."""

    def __init__(self, writer, path, every):
        import json

        from control_node.live import channels
        self.ch, self.w, self.json = channels, writer, json
        pol = recorded_policy(path)
        self.names = (pol.get("feature_names"), pol.get("action_names"))
        self.legged = recorded_legged(path)     # a legged node's names: joint states from the first frame on
        self.every = every
        self.conv = None
        self.chans = {}
        self.count = 0

    def add(self, topic, d, log_time):
        if not isinstance(d, dict):
            return
        if self.conv is None:
            if not isinstance(d.get("t_ns"), int):
                return
            self.conv = self.ch.Converter(self.ch.offset_from_recording(log_time, d["t_ns"]), self.every,
                                          feature_names=self.names[0], action_names=self.names[1],
                                          legged=self.legged)
        conv = {"/sensor": self.conv.sensor, "/action": self.conv.action,
                "/diagnostics": self.conv.diagnostics, "/sim/state": self.conv.sim_state}.get(topic)
        for t, msg, lt in (conv(d) if conv else []):
            if t not in self.chans:
                sch = self.ch.schema(t, feature_names=self.conv.feature_names or (),
                                     action_names=self.conv.action_names or (), legged=self.conv.legged)
                sid = self.w.register_schema(name=sch["title"], encoding="jsonschema",
                                             data=self.json.dumps(sch).encode())
                self.chans[t] = self.w.register_channel(topic=t, message_encoding="json", schema_id=sid)
            self.w.add_message(self.chans[t], log_time=lt, publish_time=lt, sequence=self.count,
                               data=self.json.dumps(msg, allow_nan=False).encode())
            self.count += 1


def run(args):
    import csv
    import json
    import os

    import msgpack

    from control_node.errors import UserError
    from control_node.recording.reader import iter_messages
    if not os.path.exists(args.file):
        raise UserError(f"recording {args.file} does not exist")
    stem = args.file[:-5] if args.file.endswith(".mcap") else args.file
    names = recorded_action_names(args.file)
    n = 0
    if args.to == "rosbag2":
        return _rosbag2(args, stem, names)
    legged = recorded_legged(args.file)
    if legged:                  # a legged node publishes its actuators' command, not the policy's action
        from control_node.live.channels import command_names
        names = command_names(legged)
    if args.to == "json-mcap":
        from mcap.writer import Writer

        from control_node.recording.writer import best_compression
        out = args.out or stem + ".json.mcap"
        with open(out, "wb") as f:
            w = Writer(f, compression=best_compression())
            w.start(profile="", library="control-node export")
            live = LiveChannels(w, args.file, args.every)
            chans = {}
            for topic, data, lt, pt, sq in iter_messages(args.file):
                if topic not in chans:
                    schema = SCHEMAS.get(topic, {"type": "object"})
                    sid = w.register_schema(name=schema.get("title", topic.strip("/")), encoding="jsonschema",
                                            data=json.dumps(schema).encode())
                    chans[topic] = w.register_channel(topic=topic, message_encoding="json", schema_id=sid)
                d = _jsonable(msgpack.unpackb(data, raw=False, strict_map_key=False))
                live.add(topic, d, lt)
                if topic == "/action" and isinstance(d, dict) and isinstance(d.get("u"), list):
                    d["u_by_name"] = dict(zip(action_columns(names, len(d["u"])), d["u"]))
                w.add_message(chans[topic], log_time=lt, publish_time=pt, sequence=sq,
                              data=json.dumps(d, allow_nan=False).encode())
                n += 1
            w.finish()
        print(f"export: {live.count} messages on the live view's channels ({', '.join(sorted(live.chans))})")
    else:
        out = args.out or stem + "_csv"
        os.makedirs(out, exist_ok=True)
        files, writers = {}, {}
        try:
            for topic, data, lt, _pt, sq in iter_messages(args.file):
                d = _jsonable(msgpack.unpackb(data, raw=False, strict_map_key=False))
                row = {"log_time_ns": lt, "sequence": sq}
                for k, v in d.items():
                    if k == "x" and isinstance(v, list):
                        row.update({f"x{i}": x for i, x in enumerate(v)})
                    elif k == "u" and topic == "/action" and isinstance(v, list):
                        row.update(zip(action_columns(names, len(v), taken=set(d) | set(row)), v))
                    elif isinstance(v, (dict, list)):
                        row[k] = json.dumps(v)
                    else:
                        row[k] = v
                if topic not in writers:
                    files[topic] = open(os.path.join(out, topic.strip("/").replace("/", "_") + ".csv"), "w",
                                        newline="")
                    writers[topic] = csv.DictWriter(files[topic], fieldnames=list(row), extrasaction="ignore")
                    writers[topic].writeheader()
                writers[topic].writerow(row)
                n += 1
        finally:
            for f in files.values():
                f.close()
    print(f"exported {n} messages to {out}")
    return 0


def export_recipe(config, names):
    """The [ros2] recipe of ``config`` (None without a [ros2] section), checked against the model when
    [node] model is readable, else named by the action names the recording announces."""
    import os

    from control_node.bridge.recipe import load_recipe, parse_recipe
    from control_node.config import read_toml
    raw = read_toml(config)
    if "ros2" not in raw:
        return None
    model = (raw.get("node") or {}).get("model")
    if model and os.path.exists(model):
        return load_recipe(config)
    return parse_recipe(raw["ros2"], config, action_names=names)


def _rosbag2(args, stem, names):
    from control_node.bridge.rosbag2 import export_rosbag2
    recipe = export_recipe(args.config, names) if args.config else None
    out = args.out or stem + "_rosbag2"
    res = export_rosbag2(args.file, out, recipe)
    for note in res["notes"]:
        print(f"export: {note}")
    for topic, (typ, count) in res["topics"].items():
        print(f"  {topic}  {typ}  {count}")
    print(f"exported {sum(c for _t, c in res['topics'].values())} messages ({res['frames']} frames, "
          f"{res['actions']} actions, {res['diagnostics']} diagnostics) to {out} (rosbag2, mcap)")
    return 0
