"""Processes the loop benchmark runs beside the node: feeder, echo peer, naive node, round-trip client."""
