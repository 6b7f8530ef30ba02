"""control-node export: convert a msgpack MCAP recording to a JSON-encoded MCAP (Foxglove) or CSV."""


def register(sub):
    p = sub.add_parser("export", help="convert a recording to JSON-encoded MCAP (for Foxglove) or CSV",
                       description="Foxglove cannot decode the msgpack message encoding of `control-node record`. "
                                   "--to json-mcap writes an MCAP with message encoding json and jsonschema "
                                   "schemas that Foxglove decodes and plots; --to csv writes one CSV per channel.")
    p.add_argument("file", help="MCAP recording from `control-node record`")
    p.add_argument("--to", choices=["json-mcap", "csv"], default="json-mcap", help="output format (default: %(default)s)")
    p.add_argument("--out", help="output file (json-mcap; default FILE.json.mcap) or directory (csv; default FILE_csv/)")
    return p


SCHEMAS = {
    "/sensor": {"title": "control_node.SensorFrame", "type": "object", "properties": {
        "seq": {"type": "integer"}, "t_ns": {"type": "integer", "description": "sender CLOCK_MONOTONIC ns"},
        "x": {"type": "array", "items": {"type": "number"}},
        "truth": {"type": "integer", "description": "simulator ground-truth class"}}},
    "/action": {"title": "control_node.Action", "type": "object", "properties": {
        "seq": {"type": "integer"}, "t_ns": {"type": "integer"}, "cycle": {"type": "integer"},
        "action": {"type": "integer"}, "safe": {"type": "boolean"}}},
    "/diagnostics": {"title": "control_node.Diagnostics", "type": "object", "properties": {
        "t_ns": {"type": "integer"}, "cycles": {"type": "integer"}, "rate_hz": {"type": "number"},
        "deadline_misses": {"type": "integer"}, "stale_cycles": {"type": "integer"},
        "safe_actions": {"type": "integer"}, "superseded": {"type": "integer"}, "frames_valid": {"type": "integer"},
        "rejected": {"type": "object"}, "window": {"type": "object"}, "rt": {"type": "object"}}},
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
    n = 0
    if args.to == "json-mcap":
        from mcap.writer import Writer

        from control_node.recording.writer import best_compression
        out = args.out or stem + ".json.mcap"
        with open(out, "wb") as f:
            w = Writer(f, compression=best_compression())
            w.start(profile="", library="control-node export")
            chans = {}
            for topic, data, lt, pt, sq in iter_messages(args.file):
                if topic not in chans:
                    schema = SCHEMAS.get(topic, {"type": "object"})
                    sid = w.register_schema(name=schema.get("title", topic.strip("/")), encoding="jsonschema",
                                            data=json.dumps(schema).encode())
                    chans[topic] = w.register_channel(topic=topic, message_encoding="json", schema_id=sid)
                d = _jsonable(msgpack.unpackb(data, raw=False, strict_map_key=False))
                w.add_message(chans[topic], log_time=lt, publish_time=pt, sequence=sq,
                              data=json.dumps(d, allow_nan=False).encode())
                n += 1
            w.finish()
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
