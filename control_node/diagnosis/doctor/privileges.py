"""The privileges the node asks for: affinity, SCHED_FIFO, mlockall, /dev/cpu_dma_latency. Tried in a
child process (``probe_privileges.py``, which then exits, so doctor changes nothing), or judged from the
capabilities and limits in /proc/self/status and /proc/self/limits (what the fake trees use)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from control_node.diagnosis.doctor.registry import check, item
from control_node.procfs import format_cpulist

CAP_IPC_LOCK, CAP_SYS_NICE = 14, 23
NAMES = ("affinity", "sched_fifo", "mlockall", "cpu_dma_latency")
PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe_privileges.py")


def try_privileges(cpu: int, priority: int = 80, timeout: float = 20.0) -> dict:
    """Try affinity, mlockall, /dev/cpu_dma_latency and SCHED_FIFO in a child process (which then exits,
    so nothing stays changed). {name: (granted, error)} or {"error": reason}."""
    try:
        r = subprocess.run([sys.executable, "-I", "-S", PROBE, str(cpu), str(priority)],
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            return {"error": f"probe child exited {r.returncode}: {r.stderr.strip()[-300:]}"}
        return {k: tuple(v) for k, v in json.loads(r.stdout).items()}
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return {"error": f"probe child failed: {e}"}


def _limit(ctx, name):
    """Soft limit of /proc/self/limits `name`: int, "unlimited" or None."""
    v = ctx.limits.get(name)
    if v is None:
        return None
    return "unlimited" if v[0] == "unlimited" else int(v[0]) if v[0].isdigit() else None


def static_privileges(ctx) -> dict:
    """What the capabilities and limits say, without trying."""
    priority = ctx.priority
    nice, ipc = ctx.cap(CAP_SYS_NICE), ctx.cap(CAP_IPC_LOCK)
    rtprio, memlock = _limit(ctx, "Max realtime priority"), _limit(ctx, "Max locked memory")
    out = {}
    caps = f"CapEff {'has' if nice else 'lacks'} CAP_SYS_NICE, RLIMIT_RTPRIO {rtprio}"
    if nice is None and rtprio is None:
        out["sched_fifo"] = {"granted": None, "detail": "/proc/self/status and /proc/self/limits unreadable"}
    else:
        ok = bool(nice) or rtprio == "unlimited" or (isinstance(rtprio, int) and rtprio >= priority)
        out["sched_fifo"] = {"granted": ok, "detail": caps, "how": caps}
    mem = "unlimited" if memlock == "unlimited" else (f"{memlock // 1024} KiB" if isinstance(memlock, int) else None)
    caps = f"CapEff {'has' if ipc else 'lacks'} CAP_IPC_LOCK, RLIMIT_MEMLOCK {mem}"
    if ipc is None and memlock is None:
        out["mlockall"] = {"granted": None, "detail": "/proc/self/status and /proc/self/limits unreadable"}
    else:
        out["mlockall"] = {"granted": bool(ipc) or memlock == "unlimited", "how": caps,
                           "detail": caps + ("" if ipc or memlock == "unlimited" else
                                             ": mlockall(MCL_CURRENT|MCL_FUTURE) locks the node's whole mapped "
                                             "size (hundreds of MiB with numpy and libzmq)")}
    if ctx.loop_cpu is not None and ctx.allowed:
        ok = ctx.loop_cpu in ctx.allowed
        how = f"Cpus_allowed_list {format_cpulist(ctx.allowed)}"
        out["affinity"] = {"granted": ok, "detail": how, "how": how}
    else:
        out["affinity"] = {"granted": None, "detail": "affinity mask or loop core unknown"}
    dma = ctx.path("/dev/cpu_dma_latency")
    if os.path.exists(dma):
        ok = os.access(dma, os.W_OK)
        how = f"/dev/cpu_dma_latency {'writable' if ok else 'not writable'} by uid {os.getuid()}"
        out["cpu_dma_latency"] = {"granted": ok, "how": how, "detail": how}
    else:
        out["cpu_dma_latency"] = {"granted": False, "detail": "/dev/cpu_dma_latency does not exist", "how": ""}
    return out


def gather(ctx, probe: bool) -> dict:
    """The static view, replaced by the child's answers when ``probe``."""
    priv = static_privileges(ctx)
    if not probe:
        return priv
    res = try_privileges(ctx.loop_cpu, ctx.priority)
    for name in NAMES:
        static = priv[name]
        if "error" in res:
            priv[name] = {"granted": None, "detail": res["error"]}
        else:
            ok, err = res[name]
            priv[name] = {"granted": ok, "how": "tried in a child process",
                          "detail": ("granted when tried in a child process" if ok else f"refused: {err}")
                          + (f" ({static['how']})" if static.get("how") else "")}
    return priv


@check("privileges", "privileges", cost="probe")
def check_privileges(ctx) -> list[dict]:
    area = "privileges"
    priority = ctx.priority
    how = "" if ctx.priv_probed else " (from capabilities/limits, not tried)"
    c = ctx.loop_cpu
    specs = {   # name: (verdict when refused, what the node does with it, what is lost without it, fix)
        "affinity": ("bad", f"the node pins its loop thread to core {c}",
                     f"the loop thread could not be pinned to core {c} and would migrate",
                     "use --cpu / [realtime] cpu within the process's affinity (`taskset -p $$`), or widen the "
                     "cpuset the node starts in"),
        "sched_fifo": ("bad", f"the loop thread runs SCHED_FIFO priority {priority}",
                       "without SCHED_FIFO the loop is an ordinary task: any other runnable task on the core "
                       "delays it by up to a scheduler slice (ms)",
                       "grant real-time priority: limits.conf `@realtime - rtprio 99` (and add the user to group "
                       "realtime), systemd `LimitRTPRIO=99` or `AmbientCapabilities=CAP_SYS_NICE`; in a container "
                       "`--cap-add SYS_NICE` (cgroup v1 with RT_GROUP_SCHED also needs cpu.rt_runtime_us > 0)"),
        "mlockall": ("warn", "the node locks all its memory (mlockall MCL_CURRENT|MCL_FUTURE)",
                     "without mlockall a page of the node can be reclaimed and faulted back in inside the loop",
                     "raise the locked-memory limit: `ulimit -l unlimited` (limits.conf `@realtime - memlock "
                     "unlimited`; systemd `LimitMEMLOCK=infinity`) or grant CAP_IPC_LOCK"),
        "cpu_dma_latency": ("warn", "the node holds /dev/cpu_dma_latency at 0 while it runs",
                            "without it idle CPUs may enter deep idle states and wake slowly",
                            "run the node as root, or a udev rule: KERNEL==\"cpu_dma_latency\", GROUP=\"realtime\", "
                            "MODE=\"0660\" (and the user in group realtime)"),
    }
    out = []
    for name, (sev, what, loss, fix) in specs.items():
        p = ctx.priv.get(name, {"granted": None, "detail": "not checked"})
        if p["granted"] is None:
            out.append(item(area, name, "unknown", "unknown", p["detail"], fix))
        elif p["granted"]:
            out.append(item(area, name, "granted" + how, "ok", f"{what}: {p['detail']}"))
        else:
            out.append(item(area, name, "refused" + how, sev, f"{loss}: {p['detail']}", fix))
    return out
