"""Bridges: separate processes joining another middleware's graph to the node over its own protocol.

``recipe`` reads the ``[ros2]`` config (no rclpy); ``ros2`` is the live bridge (imports rclpy). Tool tier:
the node level never imports this package (tests/test_architecture.py).
"""
