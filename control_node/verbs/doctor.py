"""control-node doctor: real-time readiness check of this machine (docs/doctor.md)."""
import argparse


def _cpu(value):
    if value in ("last", "none"):
        return value
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f'{value!r}: use a core number, "last" or "none"') from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{value!r}: a core number is >= 0")
    return n


def _seconds(value):
    s = float(value)
    if not 0 <= s <= 600:
        raise argparse.ArgumentTypeError(f"{value!r}: use 0 to 600 seconds")
    return s


def register(sub):
    d = sub.add_parser(
        "doctor", help="real-time readiness check of this machine: kernel, clock, idle, IRQs, isolation, privileges",
        description="Check this machine for a 1 kHz real-time loop: preemption model, HZ, clocksource, cpuidle and "
                    "/dev/cpu_dma_latency, cpufreq governor and SMT siblings of the loop core, transparent huge "
                    "pages, RT throttling, swap, kernel command-line isolation (isolcpus, nohz_full, rcu_nocbs, "
                    "irqaffinity), IRQs that can land on the loop core, steal time, kernel threads that may run on "
                    "the loop core, the privileges the node would get (tried in a child process, so doctor changes "
                    "nothing) and tracefs. Each check prints what was found, a verdict (ok / warn / bad / unknown = "
                    "could not be read, with the reason) and the fix. The loop core is the node's: [realtime] cpu "
                    "from --config (default \"last\": the highest CPU of the process's affinity mask), or --cpu. "
                    "See docs/doctor.md.",
        epilog="exit status: 0 when no check is bad, 1 when any check is bad, 2 on a usage or config error.")
    d.add_argument("--cpu", type=_cpu, default=None, metavar="N",
                   help='loop core to check: a number, "last" or "none" (default: [realtime] cpu of --config, "last")')
    d.add_argument("--config", metavar="FILE", help="node config whose [realtime] section to use "
                                                    "(default: the packaged node.toml)")
    d.add_argument("--sample", type=_seconds, default=1.0, metavar="S",
                   help="seconds of live steal-time sampling (default: %(default)s; 0 skips it)")
    d.add_argument("--json", action="store_true",
                   help="print the whole result as JSON (checks: [{area, check, value, verdict, detail, fix}], "
                        "summary, machine facts) instead of the table")
    d.add_argument("--root", metavar="DIR", default="/",
                   help="read /proc, /sys, /boot and /dev under DIR instead of / (for testing against a fake tree; "
                        "implies --no-probe)")
    d.add_argument("--restore", action="store_true",
                   help="undo what a node that died without restoring left behind: the affinities and IRQs "
                        "[realtime] isolate moved (its restore file in the runtime directory) and its tracefs "
                        "instance; then exit")
    d.add_argument("--no-probe", action="store_true",
                   help="do not try the privileges in a child process; judge them from the capabilities and limits "
                        "in /proc/self/status and /proc/self/limits")
    return d


def _restore():
    from control_node.diagnosis.attribution import remove_stale_instances
    from control_node.endpoints import runtime_dir
    from control_node.loop.isolation import restore_leftovers
    results = restore_leftovers(runtime_dir())
    for r in results:
        if "error" in r or "skipped" in r:
            print(f"{r['file']}: {r.get('error') or r.get('skipped')}")
        else:
            print(f"{r['file']}: node {r['pid']} (core {r['core']}): {r['threads_restored']} threads and "
                  f"{r['irqs_restored']} IRQs restored, {r['threads_gone']} threads gone since, "
                  f"{r['threads_failed'] + r['irqs_failed']} failed")
    if not results:
        print(f"nothing to restore: no isolation restore file in {runtime_dir()}")
    removed = remove_stale_instances()
    if removed:
        print(f"removed {len(removed)} tracefs instance(s) of dead nodes: {', '.join(removed)}")
    return 1 if any(r.get("threads_failed") or r.get("irqs_failed") or "error" in r for r in results) else 0


def run(args):
    import json
    import os
    import sys

    from control_node.config import load_config
    from control_node.diagnosis import doctor
    from control_node.errors import UserError
    if args.restore:
        return _restore()
    cfg = load_config(args.config)
    rt = cfg["realtime"]
    cpu = args.cpu if args.cpu is not None else rt["cpu"]
    if not os.path.isdir(args.root):
        raise UserError(f"--root {args.root}: not a directory")
    real_root = os.path.realpath(args.root) == "/"
    result = doctor.run_doctor(root=args.root, cpu=cpu, sample=args.sample,
                               probe_privileges=real_root and not args.no_probe,
                               priority=rt["priority"], spin_us=cfg["loop"]["spin_us"])
    if args.json:
        print(json.dumps(result, indent=2))
    elif sys.stdout.isatty():
        doctor.print_rich(result)
    else:
        print(doctor.format_text(result))
    return doctor.exit_code(result)
