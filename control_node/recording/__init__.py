"""Recording and replay read and write one format, defined here.

An MCAP file with three channels, :data:`TOPICS`: ``/sensor`` (frames from the simulator's or replayer's
sensor tap), ``/action`` and ``/diagnostics`` (the node's PUB sockets); a fourth, ``/sim/state`` (the
pendulum simulator's state stream), when the recorder is given its endpoint. Each message is stored exactly as
received: msgpack bytes (message encoding :data:`MESSAGE_ENCODING`, no schema), with a per-channel
sequence number; ``log_time`` and ``publish_time`` are the recorder's wall clock (ns since the epoch).
The payloads are the wire protocol's (docs/protocol.md).

``writer.record`` writes it; ``reader`` reads it back (tolerating a torn tail) and compares a replay's
answers with the recorded ones.
"""
SENSOR, ACTION, DIAGNOSTICS = "/sensor", "/action", "/diagnostics"
# the pendulum simulator's physics state (`sim pendulum --state`): recorded when the endpoints name it
SIM_STATE = "/sim/state"
TOPICS = (SENSOR, ACTION, DIAGNOSTICS, SIM_STATE)
# which endpoint of the node config each topic is recorded from
TOPIC_ENDPOINTS = {SENSOR: "sensor_tap", ACTION: "action", DIAGNOSTICS: "diagnostics", SIM_STATE: "sim_state"}
MESSAGE_ENCODING = "msgpack"
