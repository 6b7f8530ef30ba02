"""Stand-up: a joint-space PD ramp from the measured pose to a keyframe's pose, as the real legged stacks start.

The target moves linearly from the joint positions measured at the start to the goal pose over
``duration_s``, then holds; the PD is the robot's :class:`~control_node.sim.mujoco_robot.Impedance`, so it runs
in the simulator at physics rate. Gains are "stand" gains for the packaged quadruped (kp 80, kd 2).
"""
from __future__ import annotations

import numpy as np

from control_node.sim.mujoco_robot import Impedance, MujocoRobot


class StandController:
    """``command(t)`` -> the :class:`Impedance` for time ``t`` (seconds, the robot's clock)."""

    def __init__(self, robot: MujocoRobot, keyframe="home", duration_s=1.0, kp=80.0, kd=2.0):
        self.goal = robot.keyframe_joint_pos(keyframe)
        self.start = robot.joint_pos
        self.t0 = robot.time
        self.duration_s = float(duration_s)
        self.kp, self.kd = kp, kd

    def target(self, t: float) -> np.ndarray:
        a = 1.0 if self.duration_s <= 0 else min(max((t - self.t0) / self.duration_s, 0.0), 1.0)
        return self.start + a * (self.goal - self.start)

    def command(self, t: float) -> Impedance:
        return Impedance(q=self.target(t), kp=self.kp, kd=self.kd)


def stand(robot: MujocoRobot, seconds: float, keyframe="home", duration_s=1.0, control_every=10, score=None, **gains):
    """Run the stand-up for ``seconds``, updating the target every ``control_every`` physics steps; feeds
    ``score`` (a Score) every physics step when given. Returns the base heights, one per physics step."""
    ctl = StandController(robot, keyframe, duration_s, **gains)
    n = int(round(seconds / robot.dt))
    heights = np.empty(n)
    for k in range(n):
        if k % control_every == 0:
            robot.apply(ctl.command(robot.time))
        robot.step()
        if score is not None:
            score.update_from(robot)
        heights[k] = robot.base_pos[2]
    return heights
