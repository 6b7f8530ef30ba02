"""Policies that change while the loop runs: resident policies, the control endpoint, the transition log.

The node's loop (``control_node.loop._rtloop.RtLoop``) holds up to :data:`rundir.MAX_POLICIES` policies in
slots and switches between them itself, between two cycles, when a request is posted. Everything else
happens here, on the lifecycle thread (kept off the loop's core): reading and verifying a file (in a
process of its own, bounded by ``[lifecycle] max_resident_mb``: kernels/isolated_load.py), laying out its
weights, allocating its buffers and proving the kernel against the reference, checking it against the
stream (input width, action width, head), posting the request and waiting for the loop to take it, and turning the loop's transition records into the log that ``status``, the
diagnostics, ``summary.json`` and the report show.

Requests arrive on the node's control REP socket (``[endpoints] control``) as msgpack maps, one reply
each (docs/protocol.md, "Control"): ``{"op": "load", "name": N, "path": P}``, ``activate`` (``canary``),
``shadow``, ``unshadow``, ``rollback``, ``unload``, ``status``. A refused request leaves every policy as
it was and its reply says why (``ok`` false, ``error`` a code of :data:`ERRORS`, ``message`` the fix).
"""
from __future__ import annotations

import math
import os
import threading
import time

import msgpack
import numpy as np

from control_node import rundir

# reply "error" codes of refused requests
ERRORS = ("bad_request", "unknown_op", "bad_name", "not_resident", "already_resident", "too_many", "memory",
          "no_file", "load_failed", "size_mismatch", "in_use", "already_active", "canary_running",
          "no_previous", "no_shadow", "loop_not_running", "timeout", "not_legged", "mode_refused")
OPS = ("load", "activate", "shadow", "unshadow", "rollback", "unload", "status", "mode")
TRANSITION_CODES = {name: i + 1 for i, name in enumerate(rundir.TRANSITIONS)}
LOG_KEEP = 10000            # transitions kept in memory (summary.json); older ones are counted, not kept
STATUS_TRANSITIONS = 32     # transitions in a status reply and in each diagnostics snapshot


class Refused(Exception):
    """A request the node will not carry out: ``code`` (one of ERRORS) and a message naming the fix."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class Lifecycle:
    """The resident policies of one node and the log of its transitions.

    ``loop``: the node's RtLoop (its slot 0 holds the start-up policy, ``policy`` read from ``path``);
    ``cfg``: the node's validated config. Thread use: :meth:`handle` and :meth:`poll` on the lifecycle
    thread only; :meth:`brief` from any thread.
    """

    def __init__(self, loop, cfg: dict, policy, path: str):
        self.loop, self.cfg = loop, cfg
        lc = cfg["lifecycle"]
        self.max_policies = int(lc["max_policies"])
        self.max_bytes = int(lc["max_resident_mb"] * (1 << 20))
        self.source = cfg.get("source", "(config)")
        self.running = False                 # set by the node around loop.run()
        self._lock = threading.Lock()        # guards log, residents and by_slot: brief() reads them on another thread
        self.log: list[dict] = []
        self.log_dropped = 0
        self._tr_next = 0
        self.last_shadow = None             # the shadow the loop's shadow figures belong to
        name = lc["name"] or _stem(path)
        self.residents: dict[str, dict] = {}
        self.by_slot: dict[int, str] = {}
        self._add(name, 0, policy, path)
        self._log("load", name, None, "start-up policy", cycle=0)
        self._log("activate", name, None, "start-up policy", cycle=0)
        ro = cfg["rollout"]
        rate = float(cfg["loop"]["rate_hz"]) / max(1, int(getattr(loop, "decimation", 1)))
        period_ns = int(round(1e9 / float(cfg["loop"]["rate_hz"])))
        budget_ns = int(round(ro["cycle_time_budget_us"] * 1e3)) or (int(cfg["loop"]["deadline_us"] * 1e3) or period_ns)
        self.rules = {"canary_ticks": max(1, int(math.ceil(ro["canary_s"] * rate))),
                      "window_ticks": int(ro["window_ticks"]), "max_disagree": float(ro["max_disagree"]),
                      "cycle_time_budget_ns": budget_ns, "max_over_budget": int(ro["max_over_budget"]),
                      "shadow_distance": float(lc["shadow_distance"])}
        loop.set_rules(canary_ticks=self.rules["canary_ticks"], window=self.rules["window_ticks"],
                       max_disagree=self.rules["max_disagree"], budget_ns=budget_ns,
                       max_over=self.rules["max_over_budget"], distance=self.rules["shadow_distance"])

    # ------------------------------------------------------------------ bookkeeping
    def _add(self, name, slot, policy, path):
        entry = {
            "name": name, "slot": slot, "path": os.path.abspath(path), "sha256": policy.sha256,
            "kind": "continuous" if policy.continuous else "argmax", "layers": [int(s) for s in policy.spec.layer_sizes],
            "recurrent": policy.recurrent, "dtype": policy.dtype, "nbytes": int(policy.nbytes),
            # weight storage (issue #24): f32 exact, or f16 / bf16 / int8 with the error measured at import
            "weights": policy.weights, "weights_error": policy.weights_error,
            "isa": policy.isa, "copy": policy.copy_choice,     # the vector copy and how it was chosen
            "loaded_cycle": int(self.loop.cycles), "policy": policy}
        with self._lock:                    # the diagnostics thread reads residents (brief)
            self.residents[name] = entry
            self.by_slot[slot] = name

    def _log(self, event, name, other, reason, cycle=None, t_ns=None, seq=None):
        entry = {"n": self._count(), "cycle": int(self.loop.cycles if cycle is None else cycle),
                 "t_ns": int(time.monotonic_ns() if t_ns is None else t_ns), "event": event, "policy": name,
                 "from": other, "reason": reason, "seq": seq,
                 "sha256": self.residents[name]["sha256"] if name in self.residents else None,
                 "path": self.residents[name]["path"] if name in self.residents else None}
        with self._lock:
            self.log.append(entry)
            if len(self.log) > LOG_KEEP:
                del self.log[0]
                self.log_dropped += 1
        return entry

    def _count(self):
        return len(self.log) + self.log_dropped

    def poll(self):
        """Turn the loop's new transition records into log entries (call before any slot is cleared, so
        every record's slot still names its policy)."""
        records, self._tr_next = self.loop.transitions_since(self._tr_next)
        out = []
        for cycle, kind, slot, from_slot, why, t_ns, seq in records:
            event = rundir.TRANSITIONS[kind - 1]
            name = self.by_slot.get(slot) if slot >= 0 else None
            other = self.by_slot.get(from_slot) if from_slot >= 0 else None
            if event == "unshadow":
                name, other = other, None
            out.append(self._log(event, name, other, rundir.TRANSITION_REASONS[why], cycle=cycle, t_ns=t_ns,
                                 seq=seq if seq >= 0 else None))
            if event in ("shadow", "canary"):
                self.last_shadow = name if event == "shadow" else other   # whose figures the loop now counts
        return out

    def name_of(self, slot):
        return self.by_slot.get(slot) if slot >= 0 else None

    # ------------------------------------------------------------------ requests
    def handle(self, req) -> dict:
        """One control request -> its reply (never raises)."""
        op = req.get("op") if isinstance(req, dict) else None
        try:
            if not isinstance(req, dict):
                raise Refused("bad_request", "a request is a msgpack map with an \"op\" (docs/protocol.md)")
            if op not in OPS:
                raise Refused("unknown_op", f"unknown op {op!r}; use one of {', '.join(OPS)}")
            self.poll()
            message, cycle = getattr(self, "_op_" + op)(req)
            reply = {"ok": True, "op": op, "message": message, "error": None, "cycle": cycle}
        except Refused as e:
            reply = {"ok": False, "op": op, "message": str(e), "error": e.code, "cycle": None}
        except Exception as e:          # a bug here must not take the control socket down
            reply = {"ok": False, "op": op, "message": f"internal error: {e!r}", "error": "bad_request", "cycle": None}
        if op == "load" and not reply["ok"] and isinstance(req, dict):
            self._log("refused", None, None, f"load {req.get('name')!r}: {reply['message']}")
        reply["status"] = self.status()
        return reply

    def _name(self, req, resident=True):
        from control_node.config import POLICY_NAME_RULE, valid_policy_name
        name = req.get("name")
        if not valid_policy_name(name):
            raise Refused("bad_name", f"policy name {name!r} is not valid: {POLICY_NAME_RULE}")
        if resident and name not in self.residents:
            raise Refused("not_resident", f"no policy named {name!r} is loaded (resident: "
                          f"{', '.join(sorted(self.residents))}). Fix: `control-node policy load {name} FILE` first")
        return name

    def _op_load(self, req):
        from control_node.config import resolve_safe_action
        from control_node.kernels import ConsistencyError, ModelFileError
        from control_node.kernels.isolated_load import IsolatedLoadError, load_isolated
        name = self._name(req, resident=False)
        if name in self.residents:
            raise Refused("already_resident", f"a policy named {name!r} is already loaded (from "
                          f"{self.residents[name]['path']}). Fix: unload it first, or load under another name")
        if len(self.residents) >= self.max_policies:
            raise Refused("too_many", f"{len(self.residents)} policies are resident, [lifecycle] max_policies = "
                          f"{self.max_policies}. Fix: unload one (`control-node policy unload NAME`)")
        path = req.get("path")
        if not isinstance(path, str) or not os.path.isfile(path):
            raise Refused("no_file", f"no model file {path!r} on the node's host. Fix: give a path the node can "
                          "read (the CLI sends it absolute)")
        # read and verified in a process of its own (kernels/isolated_load.py: not in this locked, real-time
        # process), bounded by the configured policy memory; then laid out and proven here, off the loop
        try:
            policy = load_isolated(path, self.max_bytes, isa=self.cfg["policy"]["isa"])
        except (IsolatedLoadError, ModelFileError, ConsistencyError) as e:
            raise Refused("load_failed", str(e)) from None
        except Exception as e:
            raise Refused("load_failed", f"cannot load {path}: {e}") from None
        loop = self.loop
        slot_plan = None
        if loop.legged is not None:     # its own recipe, checked to read the same frame and drive the same joints
            from control_node.deploy import slot_plan as legged_slot_plan
            from control_node.errors import UserError
            try:
                slot_plan = legged_slot_plan(self.cfg, policy, int(loop.decimation), loop.legged)
            except UserError as e:
                raise Refused("size_mismatch", f"{path}: {e}") from None
        elif policy.n_features != loop.n_features:
            frames = int(self.cfg["policy"]["history"])
            raise Refused("size_mismatch", f"{path} takes {policy.n_features} inputs; this node's stream gives "
                          f"{loop.n_features} ({frames} frame(s) x {loop.n_features // frames} features)")
        if bool(policy.continuous) != bool(loop.continuous):
            raise Refused("size_mismatch", f"{path} is an {'continuous' if policy.continuous else 'argmax'} policy; "
                          f"this node publishes {'action vectors' if loop.continuous else 'classes'} (protocol "
                          f"v{2 if loop.continuous else 1}) to its robot")
        if policy.n_actions != loop.n_actions:
            raise Refused("size_mismatch", f"{path} has {policy.n_actions} actions; the running policy has "
                          f"{loop.n_actions}")
        used = sum(r["nbytes"] for r in self.residents.values())
        if used + policy.nbytes > self.max_bytes:
            raise Refused("memory", f"{path} needs {policy.nbytes / 2**20:.1f} MB; {used / 2**20:.1f} of "
                          f"[lifecycle] max_resident_mb = {self.max_bytes / 2**20:g} MB are in use. Fix: unload "
                          "a policy or raise the limit")
        try:
            safe = resolve_safe_action(self.cfg["watchdog"]["safe_action"], policy, self.source)
        except Exception as e:
            raise Refused("size_mismatch", f"{path}: the node's watchdog.safe_action does not fit it: {e}") from None
        slot = next(s for s in range(rundir.MAX_POLICIES) if s not in self.by_slot)
        if slot_plan is not None:
            loop.legged.set_slot_obs(slot, slot_plan)
        loop.set_slot(slot, policy, safe_u=safe["u"], safe_class=safe["class"] or 0)
        self._add(name, slot, policy, path)
        self._log("load", name, None, "request")
        return (f"loaded {name} from {path}: {policy} (proven against its reference; "
                f"{policy.nbytes / 1024:.0f} KiB, slot {slot})"), None

    def _wait(self, kind, slot=-1):
        """Post a request to the loop and wait until it took it; returns the result code."""
        if not self.running:
            raise Refused("loop_not_running", "the loop is not running (starting or stopping); try again")
        seq = self.loop.post_request(TRANSITION_CODES[kind], slot)
        deadline = time.monotonic() + 2.0
        while True:
            res = self.loop.request_done(seq)
            if res is not None:
                return res
            if time.monotonic() > deadline or not self.running:
                raise Refused("timeout", "the loop did not take the request within 2 s (is it stalled?)")
            time.sleep(0.0005)

    def _after(self, kind):
        """The log entry the loop wrote for the request just done."""
        for e in reversed(self.poll()):
            if e["event"] == kind or (kind == "rollback" and e["event"] in ("rollback", "auto_rollback")):
                return e
        return None

    def _op_activate(self, req):
        name = self._name(req)
        canary = bool(req.get("canary", False))
        loop = self.loop
        if self.name_of(loop.active) == name:
            raise Refused("already_active", f"{name} is already the active policy")
        if canary and loop.canary:
            raise Refused("canary_running", f"a canary ({self.name_of(loop.active)}) is running. Fix: wait for it "
                          "to be promoted or rolled back, or `control-node policy rollback`")
        prev = self.name_of(loop.active)
        self._wait("canary" if canary else "activate", self.residents[name]["slot"])
        e = self._after("canary" if canary else "activate")
        cycle = e["cycle"] if e else None
        if canary:
            r = self.rules
            return (f"{name} is the active policy from cycle {cycle} as a canary, {prev} in shadow; it is rolled "
                    f"back on a non-finite output, more than {r['max_over_budget']} policy ticks over "
                    f"{r['cycle_time_budget_ns'] / 1e3:g} us, or more than {r['max_disagree']:.0%} disagreement in "
                    f"a window of {r['window_ticks']} ticks; promoted after {r['canary_ticks']} policy ticks"), cycle
        return f"{name} is the active policy from cycle {cycle} (was {prev})", cycle

    def _op_shadow(self, req):
        name = self._name(req)
        loop = self.loop
        if loop.canary:
            raise Refused("canary_running", f"the canary {self.name_of(loop.active)} uses the shadow to compare "
                          "against the previous policy. Fix: wait for it, or roll back")
        if self.name_of(loop.active) == name:
            raise Refused("already_active", f"{name} is the active policy; shadow another one")
        self._wait("shadow", self.residents[name]["slot"])
        e = self._after("shadow")
        return f"{name} runs in shadow from cycle {e['cycle'] if e else None}", e["cycle"] if e else None

    def _op_unshadow(self, req):
        loop = self.loop
        if loop.shadow < 0:
            raise Refused("no_shadow", "no shadow policy is running")
        if loop.canary:
            raise Refused("canary_running", "the shadow is the canary's yardstick. Fix: wait for the canary, or "
                          "roll back")
        name = self.name_of(loop.shadow)
        self._wait("unshadow")
        e = self._after("unshadow")
        return f"{name} no longer runs in shadow (from cycle {e['cycle'] if e else None})", e["cycle"] if e else None

    def _op_rollback(self, req):
        loop = self.loop
        if loop.previous < 0:
            raise Refused("no_previous", "there is no previous policy to roll back to")
        was = self.name_of(loop.active)
        res = self._wait("rollback")
        if res == rundir.TRANSITION_REASONS.index("no_previous"):
            raise Refused("no_previous", "there is no previous policy to roll back to")
        e = self._after("rollback")
        return (f"rolled back from {was} to {self.name_of(loop.active)} at cycle {e['cycle'] if e else None}",
                e["cycle"] if e else None)

    def _op_unload(self, req):
        name = self._name(req)
        slot = self.residents[name]["slot"]
        if slot in self.loop.slots_in_use():
            role = ("active" if slot == self.loop.active else "shadow" if slot == self.loop.shadow
                    else "the canary's previous (rollback target)")
            raise Refused("in_use", f"{name} is the {role} policy. Fix: activate or unshadow another one first")
        if slot == self.loop.previous:
            self.loop.forget_previous()     # rollback has nowhere to go now (not a slot a later load reuses)
        self.poll()
        self.loop.clear_slot(slot)
        self._log("unload", name, None, "request")
        with self._lock:
            del self.by_slot[slot]
            del self.residents[name]
        return f"unloaded {name} (slot {slot} free)", None

    def _op_status(self, req):
        return "status", int(self.loop.cycles)

    def _op_mode(self, req):
        """A legged node's mode (passive, damping, stand, policy), taken by the loop at a cycle boundary."""
        from control_node.loop import legged as L
        lc = self.loop.legged
        if lc is None:
            raise Refused("not_legged", "this node runs no [legged] recipe: modes are for legged deploys "
                          "(docs/legged.md)")
        mode = req.get("mode")
        if mode not in L.MODES:
            raise Refused("bad_request", f"mode {mode!r}: use one of {', '.join(L.MODES)}")
        if not self.running:
            raise Refused("loop_not_running", "the loop is not running (starting or stopping); try again")
        was = lc.mode
        try:
            seq = lc.post_mode(mode)
        except RuntimeError:
            raise Refused("timeout", "the previous mode request is still pending (is the loop stalled?)") from None
        deadline = time.monotonic() + 2.0
        while (res := lc.mode_done(seq)) is None:
            if time.monotonic() > deadline or not self.running:
                raise Refused("timeout", "the loop did not take the mode request within 2 s; it stays posted and "
                              "is taken at the loop's next cycle (with the sensor clock: the next frame's)")
            time.sleep(0.0005)
        if res == L.REQ_NO_STAND:
            raise Refused("mode_refused", "policy refused: the stand has not completed. Fix: `control-node mode "
                          "stand` and wait for it (modes.stand_time), or set [legged.modes] policy_without_stand "
                          "= true")
        cycle = int(self.loop.cycles)
        return f"mode {lc.mode} from about cycle {cycle} (was {was})", cycle

    # ------------------------------------------------------------------ views
    def shadow_figures(self, arrays=None):
        """The shadow's figures: since it started (loop counters) and, from the ring (``arrays``: the
        ordered ring; None: the last cycles of the live ring), the distance and cost percentiles."""
        loop = self.loop
        ticks = int(loop.shadow_ticks)
        if arrays is None:
            n = int(min(loop.cycles, loop.capacity, 20000))
            end = int(loop.cycles) - 1           # the newest record may be mid-write
            idx = np.arange(end - n, end) % loop.capacity if n > 1 else np.zeros(0, dtype=np.int64)
            code, dist, cost = (loop.ring["shadow"][idx], loop.ring["shadow_dist"][idx], loop.ring["shadow_ns"][idx])
        else:
            code, dist, cost = arrays["shadow"], arrays["shadow_dist"], arrays["shadow_ns"]
        ran = code != 0
        d = dist[ran & (dist >= 0)].astype(np.float64)
        return {"policy": self.name_of(loop.shadow) or self.last_shadow, "running": loop.shadow >= 0, "ticks": ticks, "disagree": int(loop.shadow_disagree),
                "disagree_rate": (int(loop.shadow_disagree) / ticks) if ticks else None,
                "non_finite": int(loop.shadow_nonfinite),
                "cost_ns": {"mean": (int(loop.shadow_ns_sum) / ticks) if ticks else None,
                            "max": int(loop.shadow_ns_max) if ticks else None,
                            "ring": rundir.describe(cost[ran & (cost >= 0)])},
                "distance": ({k: float(v) for k, v in zip(("p50", "p90", "p99"), np.percentile(d, [50, 90, 99]))}
                             | {"max": float(d.max()), "count": int(d.size)}) if d.size else None,
                "distance_threshold": self.rules["shadow_distance"] if loop.continuous else None}

    def _policies(self):
        loop = self.loop
        out = []
        for r in sorted(self.residents.values(), key=lambda r: r["slot"]):
            role = ("active" if r["slot"] == loop.active else "shadow" if r["slot"] == loop.shadow
                    else "previous" if r["slot"] == loop.previous else "resident")
            out.append({k: v for k, v in r.items() if k != "policy"} | {"role": role})
        return out

    def status(self) -> dict:
        """The `control-node policy status` view: active, previous, shadow, canary, residents, log tail."""
        loop = self.loop
        with self._lock:
            tail = list(self.log[-STATUS_TRANSITIONS:])
            count = self._count()
            policies = self._policies()
            resident_bytes = int(sum(r["nbytes"] for r in self.residents.values()))
        canary = None
        if loop.canary:
            canary = {"policy": self.name_of(loop.active), "previous": self.name_of(loop.previous),
                      "ticks_done": int(loop.canary_done), "ticks_to_promote": self.rules["canary_ticks"],
                      "over_budget": int(loop.canary_over), "window_ticks": int(loop.window_ticks),
                      "window_disagree": int(loop.window_disagree)}
        return {"active": self.name_of(loop.active), "previous": self.name_of(loop.previous),
                "shadow": self.name_of(loop.shadow), "canary": canary, "cycle": int(loop.cycles),
                "policies": policies, "resident_bytes": resident_bytes,
                "max_resident_bytes": self.max_bytes, "max_policies": self.max_policies, "rules": self.rules,
                "shadow_figures": self.shadow_figures() if loop.shadow >= 0 or loop.shadow_ticks else None,
                "transitions": tail, "transition_count": count,
                "legged": ({"mode": loop.legged.mode, "stand_done": loop.legged.stand_done,
                            "output": loop.legged.output} if loop.legged is not None else None)}

    def brief(self) -> dict:
        """What each diagnostics snapshot carries (and so the record stream): names, the shadow's counts
        and the last transitions (each numbered ``n``: a reader drops the ones it has)."""
        loop = self.loop
        with self._lock:
            tail = list(self.log[-STATUS_TRANSITIONS:])
            count = self._count()
            resident = sorted(self.residents)
        ticks = int(loop.shadow_ticks)
        return {"active": self.name_of(loop.active), "previous": self.name_of(loop.previous),
                "shadow": self.name_of(loop.shadow), "canary": bool(loop.canary),
                "resident": resident,
                "shadow_ticks": ticks, "shadow_disagree": int(loop.shadow_disagree),
                "shadow_cost_mean_ns": (int(loop.shadow_ns_sum) / ticks) if ticks else None,
                "transitions": tail, "transition_count": count}

    def summary(self, arrays) -> dict:
        """summary.json ``lifecycle``: residents, the whole transition log, the shadow's figures."""
        self.poll()
        st = self.status()
        with self._lock:
            log = list(self.log)
        st["transitions"] = log
        st["transitions_dropped"] = self.log_dropped
        st["shadow_figures"] = self.shadow_figures(arrays)
        return st


def _stem(path) -> str:
    from control_node.config import valid_policy_name
    stem = os.path.splitext(os.path.basename(str(path)))[0] or "policy"
    stem = "".join(c if c.isalnum() or c in "_.-" else "_" for c in stem)[:64]
    return stem if valid_policy_name(stem) else "policy"


class ControlThread(threading.Thread):
    """Serves the control REP socket: one request, one reply, and polls the loop's transitions meanwhile.
    Runs off the loop's core (like the diagnostics thread)."""

    def __init__(self, lifecycle: Lifecycle, sock, loop_cpu):
        super().__init__(name="lifecycle", daemon=True)
        self.lifecycle, self.sock, self.loop_cpu = lifecycle, sock, loop_cpu
        self.finished = threading.Event()

    def run(self):
        import zmq

        from control_node.loop.realtime import leave_core, name_thread
        name_thread("cn-lifecycle")
        leave_core(self.loop_cpu)
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while not self.finished.is_set():
            if not poller.poll(20):
                self.lifecycle.poll()
                continue
            try:
                raw = self.sock.recv(zmq.NOBLOCK)
            except zmq.ZMQError:
                continue
            try:
                req = msgpack.unpackb(raw, raw=False)
            except Exception:
                req = None
            reply = self.lifecycle.handle(req)
            try:
                self.sock.send(msgpack.packb(reply, use_bin_type=True, default=str))
            except zmq.ZMQError:
                pass


class PolicyClient:
    """A client of a node's control endpoint (REQ): ``request({"op": ...})`` -> the reply dict.

    ``curve``: client CURVE options (``security.client_curve``) or None. A request that gets no reply
    within ``timeout`` s raises :class:`control_node.errors.UserError` (the socket is then rebuilt, as
    REQ must be after a lost reply)."""

    def __init__(self, endpoint: str, curve=None, timeout: float = 10.0):
        import zmq
        self.endpoint, self.curve, self.timeout = endpoint, curve, timeout
        self.ctx = zmq.Context.instance()
        self.sock = None

    def _connect(self):
        import zmq

        from control_node.security import configure_client
        self.sock = self.ctx.socket(zmq.REQ)
        self.sock.setsockopt(zmq.LINGER, 0)
        # REQ's send blocks while it has no connection: a CURVE handshake the node refuses drops the
        # connection and reconnects, so without a send timeout a refused client could wait forever
        self.sock.setsockopt(zmq.SNDTIMEO, max(1, int(self.timeout * 1000)))
        configure_client(self.sock, self.curve)
        self.sock.connect(self.endpoint)

    def request(self, msg: dict) -> dict:
        import zmq

        from control_node.errors import UserError
        if self.sock is None:
            self._connect()
        try:
            self.sock.send(msgpack.packb(msg, use_bin_type=True))
            replied = self.sock.poll(int(self.timeout * 1000), zmq.POLLIN)
        except zmq.Again:                   # not even sent within the timeout: no connection
            replied = False
        if not replied:
            self.close()
            raise UserError(f"no reply from a node's control endpoint {self.endpoint} within {self.timeout:g} s. "
                            "Fix: start the node (`control-node run` / `launch`), check [endpoints] control in "
                            "--config, and with CURVE that this client's key is in the node's allowed_clients")
        return msgpack.unpackb(self.sock.recv(), raw=False)

    def close(self):
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
