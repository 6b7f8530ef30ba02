"""Prometheus metrics of a running node: ``[diagnostics] prometheus = "127.0.0.1:9100"``.

A small HTTP server (the standard library's; one thread, kept off the loop's core) answers
``GET /metrics`` in the Prometheus text format (version 0.0.4) with the loop's counters, the whole run's
wake-up latency and cycle time quantiles (from the loop's streaming histograms), the policy lifecycle
and whether the loop is running. Every scrape reads the loop's counters as the diagnostics thread does
(plain C fields, read without locks) and builds its reply on this thread: the loop thread is never
touched and nothing is allocated per cycle. Loopback only unless ``prometheus_allow_remote = true``.
After the loop ends the server answers ``control_node_up 0`` with the final counters for
``prometheus_linger_s`` seconds, so a scrape can see how the run ended.
"""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from control_node import rundir

COUNTERS = (   # metric name, loop attribute, help
    ("cycles_total", "cycles", "cycles run"),
    ("deadline_misses_total", "deadline_misses", "cycles that published after their deadline, skipped ticks included"),
    ("skipped_ticks_total", "skipped_ticks", "ticks skipped to catch up after a stall"),
    ("stale_cycles_total", "stale_cycles", "cycles with no valid frame within the watchdog's stale_after"),
    ("safe_actions_total", "safe_actions", "safe actions published"),
    ("superseded_frames_total", "superseded", "valid frames replaced by a newer one before the policy saw them"),
    ("frames_valid_total", "frames_valid", "valid frames received"),
    ("send_failures_total", "send_failures", "actions the PUB socket did not take"),
    ("recv_errors_total", "recv_errors", "receive errors on the sensor socket"),
    ("inference_ticks_total", "inference_ticks", "ticks on which the policy ran"),
    ("shadow_ticks_total", "shadow_ticks", "policy ticks the current shadow policy ran"),
    ("shadow_disagree_total", "shadow_disagree", "shadow ticks that disagreed with the active policy"),
)
QUANTILES = (("0.5", "p50"), ("0.99", "p99"), ("0.999", "p999"))


def _esc(v) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def exposition(loop, lifecycle, running: bool, rate_hz: float) -> str:
    """The /metrics text for ``loop`` (an RtLoop) and ``lifecycle`` (or None)."""
    out = []

    def metric(name, kind, help_, samples):
        out.append(f"# HELP control_node_{name} {help_}")
        out.append(f"# TYPE control_node_{name} {kind}")
        for labels, value in samples:
            lab = "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items()) + "}" if labels else ""
            out.append(f"control_node_{name}{lab} {value}")

    metric("up", "gauge", "1 while the loop runs, 0 after it ended", [({}, int(running))])
    metric("rate_hz", "gauge", "configured loop rate", [({}, rate_hz)])
    for name, attr, help_ in COUNTERS:
        metric(name, "counter", help_, [({}, int(getattr(loop, attr)))])
    metric("rejected_frames_total", "counter", "frames rejected, by reason",
           [({"reason": k}, v) for k, v in loop.rejected_counts().items()])
    for row, name in ((0, "wake_latency_seconds"), (1, "cycle_time_seconds")):
        d = rundir.describe_hist(loop.histograms[row])
        samples = [({"quantile": q}, (d[k] or 0) / 1e9) for q, k in QUANTILES]
        out.append(f"# HELP control_node_{name} whole run, from the loop's streaming histogram (bucket lower bounds)")
        out.append(f"# TYPE control_node_{name} summary")
        for labels, value in samples:
            out.append(f'control_node_{name}{{quantile="{labels["quantile"]}"}} {value}')
        out.append(f"control_node_{name}_count {d['count']}")
        out.append(f"control_node_{name}_sum {(d['mean'] or 0) * d['count'] / 1e9}")
        metric(name.replace("_seconds", "_max_seconds"), "gauge", "largest so far", [({}, (d["max"] or 0) / 1e9)])
    if lifecycle is not None:
        b = lifecycle.brief()
        metric("policy_info", "gauge", "the active and shadow policies",
               [({"active": b["active"] or "", "shadow": b["shadow"] or "", "canary": str(b["canary"]).lower()}, 1)])
        metric("policy_transitions_total", "counter", "policy transitions logged (load, activate, rollback, ...)",
               [({}, b["transition_count"])])
        metric("policies_resident", "gauge", "policies loaded", [({}, len(b["resident"]))])
    return "\n".join(out) + "\n"


class MetricsServer:
    """Serves :func:`exposition` on ``host:port`` from its own thread (``start``/``stop``)."""

    def __init__(self, address: str, loop, lifecycle, rate_hz: float, loop_cpu=None):
        host, _, port = address.rpartition(":")
        self.host, self.port = host.strip("[]") or "127.0.0.1", int(port)
        self.loop, self.lifecycle, self.rate_hz, self.loop_cpu = loop, lifecycle, rate_hz, loop_cpu
        self.running = True
        server = self

        class Handler(BaseHTTPRequestHandler):
            # a client that connects and sends nothing (or stops reading) is dropped after this, so stop()
            # never waits longer for the scrapes in flight
            timeout = 2.0

            def do_GET(self):
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404, "try /metrics")
                    return
                body = exposition(server.loop, server.lifecycle, server.running, server.rate_hz).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):      # no per-scrape log lines
                pass

        self.httpd = ThreadingHTTPServer((self.host, self.port), Handler)
        # scrapes in flight finish before stop() returns (server_close joins their threads): as daemon threads
        # they died with the process mid-response, and a last scrape read a truncated body (IncompleteRead)
        self.httpd.daemon_threads = False
        self.thread = threading.Thread(target=self._serve, name="cn-metrics", daemon=True)

    def _serve(self):
        from control_node.loop.realtime import leave_core, name_thread
        name_thread("cn-metrics")
        leave_core(self.loop_cpu)
        self.httpd.serve_forever(poll_interval=0.2)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)
