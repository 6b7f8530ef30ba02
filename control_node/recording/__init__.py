"""Recording and replay read and write one format, defined here.

An MCAP file with three channels, :data:`TOPICS`: ``/sensor`` (frames from the simulator's or replayer's
sensor tap), ``/action`` and ``/diagnostics`` (the node's PUB sockets). Each message is stored exactly as
received: msgpack bytes (message encoding :data:`MESSAGE_ENCODING`, no schema), with a per-channel
sequence number; ``log_time`` and ``publish_time`` are the recorder's wall clock (ns since the epoch).
The payloads are the wire protocol's (docs/protocol.md).

``writer.record`` writes it; ``reader`` reads it back (tolerating a torn tail) and compares a replay's
answers with the recorded ones.
"""
SENSOR, ACTION, DIAGNOSTICS = "/sensor", "/action", "/diagnostics"
TOPICS = (SENSOR, ACTION, DIAGNOSTICS)
# which endpoint of the node config each topic is recorded from
TOPIC_ENDPOINTS = {SENSOR: "sensor_tap", ACTION: "action", DIAGNOSTICS: "diagnostics"}
MESSAGE_ENCODING = "msgpack"
