"""The node: load and verify the model, bind sockets, set up real time, run the loop, write the run directory.

The loop itself (``control_node.loop._rtloop``) runs without the GIL on the main
thread. A diagnostics thread, moved off the loop's core, publishes ~10 Hz
snapshots, prints ``ready`` once cycles run, logs (throttled) when the loop
degrades, and turns SIGINT/SIGTERM into a stop request. Python runs signal
handlers only on the main thread, which never returns to Python while the loop
runs, so the signals reach the diagnostics thread through ``signal.set_wakeup_fd``
(written by the C-level handler in whichever thread the kernel picks).
"""
from __future__ import annotations

import copy
import os
import platform
import resource
import select
import signal
import sys
import threading
import time

import msgpack
import numpy as np

from control_node import rundir
from control_node.errors import UserError
from control_node.loop.realtime import leave_core, name_thread, rt_summary_line, setup_realtime

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
# diagnostics "ring": the ring's records of each cycle since the last snapshot, for the live view
# (control_node.live); at most STREAMED_MAX cycles a snapshot (a longer gap keeps the newest)
STREAMED_FIELDS = ("cycle", "t_tick_ns", "wake_latency_ns", "cycle_time_ns", "input_age_ns", "flags", "seq")
STREAMED_MAX = 4096


def host_info() -> dict:
    cpu_model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        with open("/sys/devices/system/clocksource/clocksource0/current_clocksource") as f:
            clocksource = f.read().strip()
    except OSError:
        clocksource = "unknown"
    return {"cpu_model": cpu_model, "cores": os.cpu_count(), "kernel": platform.release(),
            "clocksource": clocksource, "python": platform.python_version(), "hostname": platform.node()}


class Diagnostics(threading.Thread):
    """Publishes snapshots, prints `ready`, logs degradation, turns signals into a stop request."""

    def __init__(self, loop, sock, rt_report_ref, endpoints, hz, loop_cpu, signal_fd, policy_info=None,
                 lifecycle=None, legged_layout=None):
        super().__init__(name="diagnostics", daemon=True)
        self.legged_layout = legged_layout or {}
        self.lifecycle = lifecycle
        self.signal_fd = signal_fd
        self.policy_info = policy_info or {}
        self.loop, self.sock, self.rt_ref, self.endpoints = loop, sock, rt_report_ref, endpoints
        self.interval = 1.0 / hz
        self.loop_cpu = loop_cpu
        self.finished = threading.Event()
        self.ready_printed = threading.Event()
        self.signal_received = None
        self.packer = msgpack.Packer()

    def _window(self, start, end):
        loop, cap = self.loop, self.loop.capacity
        start = max(start, end - cap + 1)
        idx = np.arange(start, end) % cap
        out = {}
        for name in ("wake_latency_ns", "cycle_time_ns", "input_age_ns"):
            v = loop.ring[name][idx]
            v = v[v >= 0]
            if v.size:
                q = np.percentile(v, [50, 99, 99.9])
                out[name] = {"p50": float(q[0]), "p99": float(q[1]), "p999": float(q[2]), "max": float(v.max())}
            else:
                out[name] = None
        return out

    def _cycles(self, start, end):
        """Ring records of cycles [start, end) as lists (the newest STREAMED_MAX), read here, off the loop."""
        loop = self.loop
        start = max(start, end - min(loop.capacity - 1, STREAMED_MAX))
        idx = np.arange(start, end) % loop.capacity
        return {name: loop.ring[name][idx].tolist() for name in STREAMED_FIELDS}

    def run(self):
        name_thread("cn-diagnostics")
        leave_core(self.loop_cpu)
        self._last = {"cycles": 0, "t": time.monotonic(), "misses": 0, "log": 0.0, "error_log": 0.0, "streamed": 0}
        while not self.finished.is_set():
            readable, _, _ = select.select([self.signal_fd], [], [], self.interval)
            if readable:
                for signo in os.read(self.signal_fd, 64):
                    if signo in STOP_SIGNALS:
                        self.signal_received = signal.Signals(signo).name
                        self.loop.request_stop()
                continue
            try:
                self._snapshot()
            except Exception as e:      # a diagnostics bug must never take signal handling down with it
                now = time.monotonic()
                if now - self._last["error_log"] >= 10.0:
                    print(f"[node] diagnostics error (the loop is unaffected): {e!r}", file=sys.stderr, flush=True)
                    self._last["error_log"] = now

    def _snapshot(self):
        """Print `ready` once, publish one diagnostics message, log misses (at most once a second)."""
        loop, last = self.loop, self._last
        cycles = loop.cycles
        now = time.monotonic()
        # ready: cycles run, or (sensor clock) the loop waits for the first frame, which may be far off
        if (cycles > 0 or loop.waiting) and not self.ready_printed.is_set():
            eps, pol = self.endpoints, self.policy_info
            pin = (self.rt_ref.get("rt") or {}).get("cpu") or {}      # set before the first cycle ran
            pinned = pin.get("core") if pin.get("granted") else None  # the core it is on, not the one asked for
            print(f"ready sensor={eps['sensor']} action={eps['action']} diagnostics={eps['diagnostics']} "
                  f"control={eps.get('control', '-')} "
                  f"loop_cpu={'none' if pinned is None else pinned}"
                  + (f" policy={pol['kind']} n_actions={pol['n_actions']}" if pol else ""), flush=True)
            self.ready_printed.set()
        # the newest record may be mid-write: stop one short of it
        window = self._window(last["cycles"], cycles - 1) if cycles > last["cycles"] + 1 else {}
        rate = (cycles - last["cycles"]) / (now - last["t"]) if now > last["t"] else 0.0
        msg = {
            "t_ns": time.monotonic_ns(), "cycles": cycles, "rate_hz": rate,
            "deadline_misses": loop.deadline_misses, "stale_cycles": loop.stale_cycles,
            "safe_actions": loop.safe_actions, "superseded": loop.superseded,
            "frames_valid": loop.frames_valid, "rejected": loop.rejected_counts(),
            "window": window, "rt": self.rt_ref.get("rt", {}), "policy": self.policy_info,
            # whole run so far, from the loop's streaming histograms (bucket lower bounds)
            "run": {"wake_latency_ns": rundir.describe_hist(loop.histograms[0]),
                    "cycle_time_ns": rundir.describe_hist(loop.histograms[1])},
            # the policy lifecycle: names, the shadow's counts, the last transitions (numbered "n")
            "lifecycle": self.lifecycle.brief() if self.lifecycle is not None else None,
            # a legged node's mode and its faults' counts (one int each, read off the loop's thread)
            # plus its names and frame layout (legged_layout: fixed at start), so a viewer can name what it plots
            "legged": ({"mode": loop.legged.mode, "stand_done": loop.legged.stand_done, "output": loop.legged.output,
                        "counts": loop.legged.act.counts, **self.legged_layout} if loop.legged is not None else None),
            # every cycle since the last snapshot (the newest record may be mid-write: one short of it)
            "ring": self._cycles(last["streamed"], max(last["streamed"], cycles - 1)),
            "phase_offset_ns": int(loop.phase_offset_ns),
        }
        last["streamed"] = max(last["streamed"], cycles - 1)
        try:
            self.sock.send(self.packer.pack(msg), flags=1)   # NOBLOCK: a slow monitor loses snapshots
        except Exception:
            pass
        misses = loop.deadline_misses
        if misses > last["misses"] and now - last["log"] >= 1.0:
            print(f"[node] {misses - last['misses']} deadline misses since last report "
                  f"(total {misses}, {cycles} cycles)", file=sys.stderr, flush=True)
            last["log"], last["misses"] = now, misses
        last["cycles"], last["t"] = cycles, now


def legged_layout(cfg: dict, lc) -> dict:
    """The names and layout a viewer needs to read a legged node's frames and commands (the live view's joint
    states and base, control_node/live/channels.py), fixed at start: ``joints`` (robot: the frame's joint order;
    actuators: the command's; policy), ``quat_order`` of the frame's quaternion (None when neither a term nor
    the config states it: never guessed), ``frame`` [{signal, offset, width}] and ``command_rows`` per actuator
    (legged.OUTPUT_ROWS). {} without a [legged] recipe."""
    if lc is None:
        return {}
    from control_node.loop import legged as L
    op, ap = lc.obs.plan, lc.act.plan
    robot = list(((cfg.get("legged") or {}).get("joints") or {}).get("robot") or [])
    if len(robot) != op.n_robot:        # not from the config: the policy's joints by slot, the rest numbered
        robot = [f"joint{i}" for i in range(op.n_robot)]
        for i, slot in enumerate(ap.sens_map.tolist()):
            robot[slot] = ap.policy_joints[i]
    if "quat" in op.uses:
        quat = "wxyz" if op.quat_order == 0 else "xyzw"
    else:       # no term reads it: the config's word if it gave one
        quat = ((cfg.get("legged") or {}).get("observation") or {}).get("quat_order")
        quat = quat if quat in L.QUAT_ORDERS else None
    return {"joints": {"robot": [str(n) for n in robot], "actuators": [str(n) for n in ap.out_joints],
                       "policy": [str(n) for n in ap.policy_joints]},
            "quat_order": quat, "command_rows": int(L.OUTPUT_ROWS[lc.output]),
            "frame": [{"signal": s, "offset": int(o), "width": int(w)} for s, o, w in L.frame_layout(op)]}


def policy_info(policy, safe: dict) -> dict:
    """What clients learn of the policy (diagnostics ``policy``, summary.json ``policy``): its kind, widths,
    action names and the resolved safe action (``config.resolve_safe_action``)."""
    kind = "continuous" if policy.continuous else "argmax"
    return {"kind": kind, "protocol": 2 if policy.continuous else 1, "n_features": int(policy.n_features),
            "n_actions": int(policy.n_actions), "action_names": list(policy.action_names),
            "feature_names": [str(n) for n in policy.spec.feature_names],
            "classes": list(policy.classes) if not policy.continuous else [],
            # weight storage and its measured error (issue #24): a run always says what its weights were
            "weights": policy.weights, "weights_error": policy.weights_error,
            "safe_action": {"config": safe["config"], "mode": safe["mode"], "hold": bool(safe["hold"]),
                            "class": safe["class"], "u": safe["u"]}}


def describe_policy(info: dict) -> str:
    """``continuous, 4 actions (j0, ...), safe action "offset" [..]`` for the start-up line."""
    sa = info["safe_action"]
    if info["kind"] == "continuous":
        what = {"vector": "the configured vector", "offset": "the head's offset", "hold": "hold (else the offset)"}
        return (f"continuous, {info['n_actions']} actions ({', '.join(info['action_names'])}), safe action "
                f"{what[sa['mode']]} {[round(v, 6) for v in sa['u']]}")
    return (f"argmax, {len(info['classes'])} classes, safe action "
            + ("hold (else class 0)" if sa["hold"] else f"class {sa['class']}"))


def policy_rate_figures(arrays: dict, rate_hz: float, decimation: int, inference_ticks: int, cycles: int,
                        complete: bool) -> dict:
    """summary.json ``policy_rate``: loop and policy rate, inference and hold tick counts, and the cycle time
    of each kind of tick (wake -> published) from the ring's FLAG_INFER (the last ring_cycles cycles)."""
    flags = arrays["flags"]
    ct = arrays["cycle_time_ns"]
    infer = (flags & rundir.FLAG_INFER) != 0
    return {"loop_rate_hz": rate_hz, "policy_rate_hz": rate_hz / decimation, "decimation": decimation,
            "inference_ticks": inference_ticks, "hold_ticks": cycles - inference_ticks,
            "cycle_time_infer_ns": rundir.describe(ct[infer]), "cycle_time_hold_ns": rundir.describe(ct[~infer]),
            "source": "ring (whole run)" if complete else f"ring (last {int(flags.size)} cycles)"}


def phase_lock_figures(loop, arrays: dict) -> dict:
    """summary.json ``phase_lock``: whether it ran, its margin and step bounds, every shift (count, how many
    moved earlier because the probe found the frame early, net, sum of magnitudes, largest), the last tick -
    t_ns - margin, and the lead of the frames (tick - t_ns, on ticks with a new frame) over the ring."""
    age, wake = arrays["input_age_ns"], arrays["wake_latency_ns"]
    new = ((arrays["flags"] & rundir.FLAG_NEW_FRAME) != 0) & (age >= 0) & (wake >= 0)
    lead = age[new] - wake[new]             # t_wake - t_ns - (t_wake - tick) = tick - t_ns
    return {"enabled": bool(loop.phase_lock), "margin_ns": int(loop.phase_margin_ns),
            "max_slew_ns_per_cycle": int(loop.phase_max_slew_ns), "min_step_ns": int(loop.phase_min_step_ns),
            "shifts": int(loop.phase_shifts), "early": int(loop.phase_early),
            "net_shift_ns": int(loop.phase_offset_ns), "abs_shift_ns": int(loop.phase_shift_abs_ns),
            "max_shift_ns": int(loop.phase_shift_max_ns), "last_error_ns": int(loop.phase_error_ns),
            "shift_ticks": int(((arrays["flags"] & rundir.FLAG_PHASE_SHIFT) != 0).sum()),
            "frame_lead_ns": rundir.describe(lead)}


def loop_config(cfg: dict, safe: dict, decimation: int, spin_us: float, ring_cycles: int):
    """The loop's :class:`~control_node.loop._rtloop.LoopConfig` from the validated config (``safe``:
    config.resolve_safe_action's answer, ``decimation`` / ``spin_us`` resolved, ``ring_cycles`` sized)."""
    from control_node.loop._rtloop import LoopConfig
    lp, wd, lim = cfg["loop"], cfg["watchdog"], cfg["limits"]
    rate = float(lp["rate_hz"])
    period_ns = int(round(1e9 / rate))
    timer = lp["clock"] == "timer"
    return LoopConfig(
        period_ns=period_ns, deadline_ns=int(lp["deadline_us"] * 1000) or period_ns,
        stale_after_ns=int(wd["stale_after_ms"] * 1e6), spin_ns=int(spin_us * 1000),
        max_cycles=int(round(float(lp["duration_s"]) * rate)) if timer else 0,
        sensor_clock=not timer, catch_up_skip=lp["catch_up"] == "skip",
        safe_action=safe["class"] or 0, hold_last=safe["hold"], max_frame_bytes=lim["max_frame_bytes"],
        ring_cycles=ring_cycles, safe_u=safe["u"], decimation=decimation, history=int(cfg["policy"]["history"]),
        history_newest_first=cfg["policy"]["history_order"] == "newest_first", phase_lock=bool(lp["phase_lock"]),
        phase_margin_ns=int(round(lp["phase_margin_us"] * 1e3)) if lp["phase_lock"] else 0,
        reset_on_trip=bool(wd["reset_state"]))


class Node:
    def __init__(self, cfg: dict, model_path=None, run_dir=None, quiet=False):
        self.cfg = cfg
        self.model_path = model_path or cfg["node"]["model"]
        self.run_dir = run_dir
        self.quiet = quiet

    def run(self) -> str:

        from control_node.loop._rtloop import RtLoop
        from control_node.loop.libzmq import libzmq_functions
        from control_node.sockets import NodeSockets
        cfg = self.cfg
        lp, wd, lim, st = cfg["loop"], cfg["watchdog"], cfg["limits"], cfg["stats"]
        if not os.path.exists(self.model_path):
            raise UserError(f"model file {self.model_path} does not exist. Fix: run `control-node train` "
                            f"(writes models/iris.npz) or pass --model PATH")
        # validates and proves kernel == reference; the file's arrays bounded by the configured policy memory
        # the vector copy: by [policy] isa, "fastest" measured on this machine for this shape (kernels/dispatch.py)
        try:
            from control_node.kernels.dispatch import load as load_policy
            policy = load_policy(self.model_path, cfg["policy"]["isa"],
                                 max_bytes=int(cfg["lifecycle"]["max_resident_mb"] * (1 << 20)))
        except ValueError as e:
            if "cannot run that copy" not in str(e):
                raise
            raise UserError(f"[policy] isa = \"{cfg['policy']['isa']}\": {e}. Fix: \"fastest\" (the default) or "
                            "a copy this CPU runs") from None
        from control_node.config import resolve_decimation, resolve_history, resolve_safe_action, resolve_spin_us
        source = cfg.get("source", "(config)")
        safe = resolve_safe_action(wd["safe_action"], policy, source)
        decimation = resolve_decimation(cfg, source)
        frame_width = resolve_history(cfg, int(policy.n_features), source)
        spin_us = resolve_spin_us(cfg)
        info = policy_info(policy, safe)
        info["history"] = {"frames": int(cfg["policy"]["history"]), "order": cfg["policy"]["history_order"],
                           "frame_width": int(frame_width)}
        rate = float(lp["rate_hz"])
        period_ns = int(round(1e9 / rate))
        duration = float(lp["duration_s"])
        ring = st["ring_cycles"]
        if duration > 0 and lp["clock"] == "timer":
            ring = min(ring, int(duration * rate) + 16)
        from control_node.deploy import build_legged
        legged = build_legged(cfg, policy, decimation, ring)     # None without a [legged] recipe
        if legged is not None:
            info["history"]["frame_width"] = int(legged.frame_width)
            info["legged"] = {"output": legged.output, "frame_width": int(legged.frame_width),
                              "publish_width": int(legged.pub_width)}
        # SIGINT/SIGTERM: no-op Python handlers; the wakeup fd carries them to the diagnostics thread
        sig_r, sig_w = os.pipe()
        os.set_blocking(sig_w, False)
        old_wakeup = signal.set_wakeup_fd(sig_w, warn_on_full_buffer=False)
        old_handlers = {s: signal.signal(s, lambda *_: None) for s in STOP_SIGNALS}
        sockets = None
        rt_session = None
        recorder = None
        metrics = None
        completed = False
        try:
            from control_node.loop.realtime import choose_cpu
            loop_cpu = choose_cpu(cfg["realtime"]["cpu"])
            others = set(os.sched_getaffinity(0)) - {loop_cpu} if loop_cpu is not None else set()
            sockets = NodeSockets(cfg["endpoints"], lim["max_frame_bytes"], lim["send_hwm"], io_cpus=others,
                                  security=cfg.get("security"), recv_hwm=lim["recv_hwm"])
            loop = RtLoop(policy, loop_config(cfg, safe, decimation, spin_us, ring), sockets.sensor.underlying,
                          sockets.action.underlying, libzmq_functions(), legged=legged)
            from control_node.lifecycle import ControlThread, Lifecycle
            rt_ref = {}
            lifecycle = Lifecycle(loop, cfg, policy, self.model_path)
            diag = Diagnostics(loop, sockets.diagnostics, rt_ref, cfg["endpoints"], st["diagnostics_hz"], loop_cpu,
                               sig_r, info, lifecycle, legged_layout=legged_layout(cfg, legged))
            control = ControlThread(lifecycle, sockets.control, loop_cpu)
            diag.start()                              # before pinning: they keep the full CPU mask
            control.start()
            dg = cfg["diagnostics"]
            if dg["prometheus"]:
                from control_node.metrics import MetricsServer
                try:
                    metrics = MetricsServer(dg["prometheus"], loop, lifecycle, rate, loop_cpu).start()
                except OSError as e:
                    raise UserError(f"cannot serve metrics on {dg['prometheus']}: {e.strerror or e}. Fix: choose a "
                                    "free port in [diagnostics] prometheus, or \"\" for off") from None
            if dg["attribution"] and loop_cpu is not None:
                from control_node.diagnosis.attribution import Recorder
                from control_node.diagnosis.attribution import sleep_lead_ns
                recorder = Recorder(loop_cpu, os.getpid(), tracing=dg["attribution_trace"], loop=loop,
                                    floor_ns=max(10_000, period_ns // 100),
                                    lead_ns=sleep_lead_ns(int(spin_us * 1000), int(loop.phase_margin_ns))).start()
            started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            ru0 = resource.getrusage(resource.RUSAGE_THREAD)
            rt_session = setup_realtime(cfg["realtime"])
            rt_ref["rt"] = rt_session.report
            if not self.quiet:
                extra = (f" (policy {rate / decimation:g} Hz, decimation {decimation})" if decimation > 1 else "")
                extra += (f"; history {info['history']['frames']} x {frame_width} features "
                          f"{info['history']['order']}" if info["history"]["frames"] > 1 else "")
                print(f"[node] model {policy} isa={policy.isa}; {describe_policy(info)}; {rate:g} Hz{extra} "
                      f"{lp['clock']} clock, spin {spin_us:g} us; rt: {rt_summary_line(rt_session.report)}",
                      file=sys.stderr, flush=True)
            t_start = time.monotonic_ns()
            run_until = t_start + int(duration * 1e9) + period_ns if (duration > 0 and lp["clock"] == "sensor") else 0
            lifecycle.running = True
            try:
                loop.run(0, run_until)
            finally:
                lifecycle.running = False
                if metrics is not None:
                    metrics.running = False
            ru1 = resource.getrusage(resource.RUSAGE_THREAD)
            if recorder is not None:
                recorder.stop()
            rt_session.restore()
            rt_session = None
            diag.finished.set()
            control.finished.set()
            diag.join(timeout=2)
            control.join(timeout=3)
            completed = True
        finally:
            if recorder is not None and not recorder.stopped:
                recorder.stop()                       # never leave a tracefs instance behind
            if metrics is not None and not completed:
                metrics.stop()                        # failed: no final figures to linger with
            if rt_session is not None:
                rt_session.restore()
            if sockets is not None:
                sockets.close()
            signal.set_wakeup_fd(old_wakeup)
            for signo, handler in old_handlers.items():
                signal.signal(signo, handler)
            os.close(sig_r)
            os.close(sig_w)
        run_dir = self._write_run_dir(policy, loop, rt_ref.get("rt", {}), started_at, period_ns, ru0, ru1,
                                      diag.signal_received, rundir.HIST_NAMES, info, spin_us, lifecycle, recorder)
        if metrics is not None:
            time.sleep(float(cfg["diagnostics"]["prometheus_linger_s"]))    # the final figures, for a last scrape
            metrics.stop()
        return run_dir

    def _why_late(self, recorder, arrays, period_ns, loop, spin_us, rt_report):
        from control_node.diagnosis.attribution import attribute
        dg = self.cfg["diagnostics"]
        if not dg["attribution"]:
            return {"enabled": False, "detail": "off ([diagnostics] attribution = false)"}
        if recorder is None:
            return {"enabled": False, "detail": "the loop was not pinned to one core ([realtime] cpu = \"none\" or "
                                                "pinning refused): there is no core to watch"}
        return attribute(recorder, arrays, period_ns, int(loop.deadline_ns), recorder.lead_ns,
                         max_events=int(dg["attribution_events"]))

    def _write_run_dir(self, policy, loop, rt_report, started_at, period_ns, ru0, ru1, stop_signal, hist_names,
                       info, spin_us, lifecycle, recorder):
        import psutil

        from control_node.deploy import summary as deploy_summary
        from control_node.diagnosis import machine_facts
        cfg = self.cfg
        run_id = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
        run_dir = self.run_dir or os.path.join(cfg["node"]["run_root"], run_id)
        os.makedirs(run_dir, exist_ok=True)
        arrays = rundir.ordered_ring(loop.ring, loop.cycles, loop.capacity)
        complete = loop.cycles <= loop.capacity
        hist = {name: loop.histograms[i] for i, name in enumerate(hist_names)}
        actions = rundir.ordered_action_ring(loop.action_ring, loop.cycles) if loop.continuous else None

        def figure(name, arr_name=None):
            if complete:
                v = arrays[arr_name or name]
                return rundir.describe(v[v >= 0])
            return rundir.describe_hist(hist[name])

        duration_s = (loop.t_end_ns - loop.t0_ns) / 1e9 if loop.t_end_ns > loop.t0_ns else 0.0
        order = np.argsort(arrays["wake_latency_ns"])[::-1][:10] if loop.cycles else []
        worst = [{"cycle": int(arrays["cycle"][i]), "wake_latency_ns": int(arrays["wake_latency_ns"][i]),
                  "cycle_time_ns": int(arrays["cycle_time_ns"][i]), "flags": int(arrays["flags"][i])}
                 for i in order]
        proc = psutil.Process()
        rejected = loop.rejected_counts()
        summary = {
            "role": "node", "format": rundir.SUMMARY_FORMAT, "run_id": os.path.basename(os.path.normpath(run_dir)),
            "started_at": started_at, "duration_s": duration_s,
            "rate_hz": float(cfg["loop"]["rate_hz"]), "period_ns": period_ns, "clock_mode": cfg["loop"]["clock"],
            "spin_us": float(spin_us), "spin_us_from": cfg["loop"].get("spin_us_from", "config"),
            # the policy's schedule: its rate, and the cost of an inference tick against a hold tick
            "recurrent": ({"kind": policy.recurrent, "hidden_size": int(policy.hidden_size),
                           "reset_on_watchdog_trip": bool(loop.reset_on_trip),
                           "state_resets_watchdog": int(loop.state_resets),
                           "state_resets_nonfinite": int(sum(r["policy"].state_resets_nonfinite
                                                             for r in lifecycle.residents.values()))}
                          if policy.hidden_size else None),
            "policy_rate": policy_rate_figures(arrays, float(cfg["loop"]["rate_hz"]), int(loop.decimation),
                                               int(loop.inference_ticks), int(loop.cycles), complete),
            "phase_lock": phase_lock_figures(loop, arrays),
            "cycles": int(loop.cycles),
            "achieved_rate_hz": loop.cycles / duration_s if duration_s > 0 else 0.0,
            "deadline_misses": int(loop.deadline_misses), "skipped_ticks": int(loop.skipped_ticks),
            "stale_cycles": int(loop.stale_cycles), "safe_actions": int(loop.safe_actions),
            "superseded": int(loop.superseded), "frames_valid": int(loop.frames_valid),
            "rejected": rejected, "rejected_total": int(sum(rejected.values())),
            "send_failures": int(loop.send_failures), "recv_errors": int(loop.recv_errors),
            "wake_latency_ns": figure("wake_latency_ns"), "cycle_time_ns": figure("cycle_time_ns"),
            "recv_ns": figure("recv_ns"), "infer_ns": figure("infer_ns"), "publish_ns": figure("publish_ns"),
            "period_ns_stats": figure("period_ns"), "input_age_ns": figure("input_age_ns"),
            "worst_cycles": worst,
            "budget": {"wake_latency_p99_ns": int(round(cfg["budget"]["wake_latency_p99_us"] * 1e3)),
                       "cycle_time_max_ns": int(round(cfg["budget"]["cycle_time_max_us"] * 1e3)) or period_ns,
                       "deadline_misses": int(cfg["budget"]["deadline_misses"])},
            "stop": {"signal": stop_signal},
            "rt": rt_report,
            "model": {"path": os.path.abspath(self.model_path), "sha256": policy.sha256,
                      "layer_sizes": [int(s) for s in policy.spec.layer_sizes], "dtype": policy.dtype,
                      "isa": policy.isa, "classes": policy.classes, "head": policy.head,
                      # how the vector copy was chosen, and the times behind it (kernels/dispatch.py)
                      "copy": policy.copy_choice,
                      "action_names": policy.action_names},
            # what the node published: the policy kind, its action width and the safe action it used
            "policy": info,
            "safe_action": info["safe_action"],
            # policies loaded, switched, shadowed and rolled back while the loop ran (control_node.lifecycle)
            "lifecycle": lifecycle.summary(arrays),
            # the legged deploy path ([legged]): output, mode timeline, limits and faults counted (None without)
            "legged": deploy_summary(loop.legged, float(cfg["loop"]["rate_hz"]), int(loop.cycles)),
            # why cycles were late: each miss and the worst wake-ups matched to evidence about the loop's core
            "why_late": self._why_late(recorder, arrays, period_ns, loop, spin_us, rt_report),
            "config": copy.deepcopy(cfg),
            "host": host_info(),
            # what `control-node doctor` checks, read cheaply (no probes, no sampling) for the loop's core
            "machine": machine_facts(cpu=(rt_report.get("cpu") or {}).get("core")),
            "process": {
                "loop_thread": {"voluntary_ctx_switches": ru1.ru_nvcsw - ru0.ru_nvcsw,
                                "involuntary_ctx_switches": ru1.ru_nivcsw - ru0.ru_nivcsw,
                                "minor_page_faults": ru1.ru_minflt - ru0.ru_minflt,
                                "major_page_faults": ru1.ru_majflt - ru0.ru_majflt,
                                "cpu_time_s": (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)},
                "ctx_switches": proc.num_ctx_switches()._asdict(),
                "cpu_times": {k: v for k, v in proc.cpu_times()._asdict().items()},
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "rss_bytes": proc.memory_info().rss,
                "num_fds": proc.num_fds(),
            },
            "ring": {"capacity": int(loop.capacity), "recorded": int(min(loop.cycles, loop.capacity)),
                     "complete": bool(complete)},
            "percentile_source": "raw arrays (numpy linear)" if complete else "streaming histogram (<=0.8% low)",
        }
        if actions is not None:
            kept = int(len(actions["cycle"]))
            summary["action_ring"] = {
                "file": rundir.ACTIONS_FILE, "dtype": rundir.ACTION_RING_FIELDS["u"],
                "n_actions": int(loop.n_actions), "capacity": int(loop.action_capacity), "recorded": kept,
                "first_cycle": int(actions["cycle"][0]) if kept else None,
                "complete": bool(loop.cycles <= loop.action_capacity),
                "max_bytes": rundir.ACTION_RING_MAX_BYTES}
        rundir.write_node_run(run_dir, summary, arrays, hist, actions)
        return run_dir
