"""The live view: a Foxglove WebSocket server of a running node's streams (``control-node live``,
``launch --foxglove``). A tool: its own process, fed by ZeroMQ subscribers; never imported by the node.

``channels``: the topics, their JSON schemas and the conversion of the node's messages (shared with
``control-node export``); ``server``: the process (the optional foxglove-sdk package).
"""
