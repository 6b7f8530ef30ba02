"""Diagnosis of the machine the node runs on (node level: imports the leaves, procfs among them, and the
loop's real-time helpers).

:mod:`control_node.diagnosis.doctor` (a package: one module per area, checks registered with
``@check(area, name)``): ``control-node doctor``, the real-time readiness check, and :func:`machine_facts`,
the cheap subset the node records in every run's summary.json. :mod:`control_node.diagnosis.attribution`:
why cycles were late. Both read /proc and /sys through :mod:`control_node.procfs`.
"""
from control_node.diagnosis.doctor import exit_code, format_text, machine_facts, run_doctor

__all__ = ["exit_code", "format_text", "machine_facts", "run_doctor"]
