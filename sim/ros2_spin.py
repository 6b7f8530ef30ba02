"""An rclpy node spun on a thread of its own, and its shutdown: what the ROS 2 simulators (``sim pendulum --ros2``,
``sim mujoco --ros2``) share. A tool: never imported by the node."""
from __future__ import annotations

import threading


class Ros2Spin:
    """Spins ``executor`` (holding ``node``) every 50 ms until :meth:`close`, which also destroys the node and
    shuts rclpy down."""

    def __init__(self, rclpy, node, executor):
        self.rclpy, self.node, self.executor = rclpy, node, executor
        executor.add_node(node)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._spin, name="ros2-spin", daemon=True)
        self.thread.start()

    def _spin(self):
        from rclpy.executors import ExternalShutdownException
        try:
            while not self.stop.is_set() and self.rclpy.ok():
                self.executor.spin_once(timeout_sec=0.05)
        except ExternalShutdownException:
            pass        # SIGINT: rclpy's own handler shut the context down under spin_once

    def close(self):
        self.stop.set()
        self.thread.join(2.0)
        try:
            self.node.destroy_node()
            if self.rclpy.ok():
                self.rclpy.shutdown()
        except Exception:       # noqa: BLE001 - shutting down
            pass
