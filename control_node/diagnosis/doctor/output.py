"""The report as plain text and as a rich table."""
from __future__ import annotations

import textwrap

from control_node.diagnosis.doctor.registry import VERDICTS


# ------------------------------------------------------------------------------------------- output

def _header(result) -> str:
    m = result["machine"]
    virt = {True: "VM", False: "bare metal", None: "VM unknown"}[m.get("virtualized")]
    spec = m.get("loop_cpu_spec", "last")
    core = result["loop_cpu"]
    return (f"control-node doctor: kernel {m.get('kernel') or '?'} ({virt}), CPUs {m.get('cpus_online') or '?'}, "
            f"loop core {core if core is not None else '?'} ([realtime] cpu = {spec})")


def format_text(result: dict, width: int = 100) -> str:
    """Plain text, grouped by area: verdict, check, what was found, detail, fix."""
    lines = [_header(result), ""]
    wrap = dict(width=width, break_long_words=False, break_on_hyphens=False)
    area = None
    for c in result["checks"]:
        if c["area"] != area:
            area = c["area"]
            lines.append(area.upper())
        lines += textwrap.wrap(f"{c['verdict']:<7} {c['check']}: {c['value']}", subsequent_indent=" " * 10,
                               initial_indent="  ", **wrap)
        if c["detail"]:
            lines += textwrap.wrap(c["detail"], initial_indent=" " * 10, subsequent_indent=" " * 10, **wrap)
        if c["fix"] and c["verdict"] != "ok":
            lines += textwrap.wrap("fix: " + c["fix"], initial_indent=" " * 10, subsequent_indent=" " * 15, **wrap)
    lines += ["", f"summary: {result['summary']['line']}"
              + ("" if result["privileges_probed"] else " (privileges from capabilities/limits, not tried)")]
    return "\n".join(lines)


def print_rich(result: dict, console=None) -> None:
    """A rich table grouped by area (for a terminal)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text
    console = console or Console()
    style = {"ok": "green", "warn": "yellow", "bad": "bold red", "unknown": "magenta"}
    t = Table(title=Text(_header(result)), show_lines=False, expand=True, title_justify="left")
    t.add_column("verdict", no_wrap=True)
    t.add_column("check", no_wrap=True, style="bold")
    t.add_column("found", ratio=3)
    t.add_column("fix", ratio=2)
    area = None
    for c in result["checks"]:
        if c["area"] != area:
            if area is not None:
                t.add_section()
            area = c["area"]
            t.add_row("", Text(area.upper(), style="bold cyan"), "", "")
        found = Text(c["value"])
        if c["detail"]:
            found.append("\n" + c["detail"], style="dim")
        t.add_row(Text(c["verdict"], style=style[c["verdict"]]), Text(c["check"]), found,
                  Text(c["fix"] if c["verdict"] != "ok" else ""))
    console.print(t)
    s = result["summary"]
    line = Text("summary: ")
    for i, v in enumerate(VERDICTS):
        line.append(f"{s[v]} {v}", style=style[v] if s[v] else "")
        if i < len(VERDICTS) - 1:
            line.append(", ")
    if not result["privileges_probed"]:
        line.append(" (privileges from capabilities/limits, not tried)")
    console.print(line)
