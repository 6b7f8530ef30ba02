"""control-node doctor: fake /proc and /sys trees (built here from dicts) for a well-tuned RT box, a badly
tuned VM and unreadable files; then this real machine (runs, every check has a verdict, --json parses,
the exit code matches the verdicts, machine_facts() is cheap)."""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time

import pytest

from control_node import procfs
from control_node.diagnosis import doctor
from control_node.diagnosis.doctor import CHECKS, VERDICTS, Ctx, check, machine_facts, run_checks, run_doctor
from control_node.diagnosis.doctor.privileges import PROBE
from control_node.verbs import doctor as verb

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_tree(root, files: dict):
    """Write ``{"proc/cmdline": "text", "proc/config.gz": b"gz bytes", "dir/": None}`` under ``root``."""
    for rel, content in files.items():
        path = os.path.join(root, rel)
        if content is None:
            os.makedirs(path, exist_ok=True)
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(content if isinstance(content, bytes) else content.encode())
    return str(root)


def stat_line(cpu, user, system, idle, steal):
    return f"cpu{cpu} {user} 0 {system} {idle} 0 0 0 {steal} 0 0\n"


def kthread(pid, comm, cpus, flags=0x00208040):
    """/proc/PID/stat and status of a kernel thread (PF_KTHREAD in field 9) allowed on ``cpus``."""
    return {f"proc/{pid}/stat": f"{pid} ({comm}) S 2 0 0 0 -1 {flags} 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0\n",
            f"proc/{pid}/status": f"Name:\t{comm}\nCpus_allowed_list:\t{cpus}\n"}


LIMITS = ("Limit                     Soft Limit           Hard Limit           Units     \n"
          "Max locked memory         {memlock:<20} {memlock:<20} bytes     \n"
          "Max realtime priority     {rtprio:<20} {rtprio:<20}                \n")

GOOD_CONFIG = "\n".join(["CONFIG_PREEMPT_RT=y", "CONFIG_HZ_1000=y", "CONFIG_HZ=1000", "CONFIG_HIGH_RES_TIMERS=y",
                         "CONFIG_NO_HZ_FULL=y", "CONFIG_RCU_NOCB_CPU=y", "CONFIG_OSNOISE_TRACER=y",
                         "CONFIG_TIMERLAT_TRACER=y", ""])


def good_rt_box() -> dict:
    """PREEMPT_RT, isolcpus=1 nohz_full=1, tsc, no THP, IRQs off core 1, no swap, everything granted."""
    cpu = "sys/devices/system/cpu"
    files = {
        "proc/sys/kernel/version": "#1 SMP PREEMPT_RT Thu Jan  1 00:00:00 UTC 2026\n",
        "proc/sys/kernel/osrelease": "6.12.0-rt\n",
        "sys/kernel/realtime": "1\n",
        "boot/config-6.12.0-rt": GOOD_CONFIG,
        "proc/cmdline": "BOOT_IMAGE=/vmlinuz root=/dev/sda1 isolcpus=managed_irq,domain,1 nohz_full=1 rcu_nocbs=1 "
                        "irqaffinity=0 -- isolcpus=0\n",
        "proc/cpuinfo": "processor\t: 0\nflags\t\t: fpu tsc constant_tsc nonstop_tsc\n\n",
        f"{cpu}/online": "0-1\n",
        f"{cpu}/isolated": "1\n",
        f"{cpu}/nohz_full": "1\n",
        "sys/devices/system/clocksource/clocksource0/current_clocksource": "tsc\n",
        "sys/devices/system/clocksource/clocksource0/available_clocksource": "tsc hpet acpi_pm \n",
        f"{cpu}/cpuidle/current_driver": "intel_idle\n",
        f"{cpu}/cpuidle/current_governor_ro": "menu\n",
        f"{cpu}/cpu1/cpufreq/scaling_governor": "performance\n",
        f"{cpu}/cpu1/cpufreq/scaling_driver": "intel_pstate\n",
        f"{cpu}/cpu1/topology/thread_siblings_list": "1\n",
        "dev/cpu_dma_latency": b"\0\0\0\0",
        "sys/kernel/mm/transparent_hugepage/enabled": "always madvise [never]\n",
        "sys/kernel/mm/transparent_hugepage/defrag": "always defer defer+madvise madvise [never]\n",
        "proc/sys/kernel/sched_rt_runtime_us": "-1\n",
        "proc/sys/kernel/sched_rt_period_us": "1000000\n",
        "proc/swaps": "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n",
        "proc/sys/vm/swappiness": "10\n",
        "proc/self/status": "Name:\tpython\nCpus_allowed_list:\t0-1\nCapEff:\t000001ffffffffff\n",
        "proc/self/limits": LIMITS.format(memlock="unlimited", rtprio=99),
        "proc/interrupts": ("           CPU0       CPU1       \n"
                            " 24:       5000          0  IR-PCI-MSI 1-edge      eth0-rx\n"
                            " 25:        300          0  IR-PCI-MSI 2-edge      nvme0q0\n"
                            "LOC:     100000        250   Local timer interrupts\n"),
        "proc/irq/24/smp_affinity_list": "0\n",
        "proc/irq/25/smp_affinity_list": "0\n",
        "proc/irq/default_smp_affinity": "1\n",
        "proc/stat": "cpu  2000 0 200 20000 0 0 0 0 0 0\n" + stat_line(0, 1000, 100, 10000, 0)
                     + stat_line(1, 1000, 100, 10000, 0),
        "proc/mounts": "sysfs /sys sysfs rw 0 0\ntracefs /sys/kernel/tracing tracefs rw 0 0\n",
        "sys/kernel/tracing/available_tracers": "timerlat osnoise function nop\n",
        "proc/1/stat": "1 (systemd) S 0 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 1 0 0\n",
        "proc/1/status": "Name:\tsystemd\nCpus_allowed_list:\t0-1\n",
    }
    for i in range(4):
        files[f"{cpu}/cpu1/cpuidle/state{i}/name"] = ["POLL", "C1", "C1E", "C6"][i] + "\n"
        files[f"{cpu}/cpu1/cpuidle/state{i}/latency"] = f"{[0, 2, 10, 170][i]}\n"
        files[f"{cpu}/cpu1/cpuidle/state{i}/disable"] = "0\n"
    files.update(kthread(2, "kthreadd", "0"))
    files.update(kthread(30, "kswapd0", "0"))
    files.update(kthread(31, "khugepaged", "0"))
    files.update(kthread(21, "ksoftirqd/1", "1"))
    files.update(kthread(22, "migration/1", "1"))
    return files


BAD_CONFIG = "\n".join(["CONFIG_PREEMPT_DYNAMIC=y", "CONFIG_PREEMPT_VOLUNTARY=y", "# CONFIG_PREEMPT_NONE is not set",
                        "# CONFIG_PREEMPT is not set", "CONFIG_HZ=250", "CONFIG_HIGH_RES_TIMERS=y",
                        "# CONFIG_NO_HZ_FULL is not set", "CONFIG_HALTPOLL_CPUIDLE=y",
                        "# CONFIG_OSNOISE_TRACER is not set", "# CONFIG_TIMERLAT_TRACER is not set", ""])


def bad_vm() -> dict:
    """kvm-clock, THP always, RT throttling at its default, IRQs on the loop core, steal 12%, swap on, an
    unprivileged user."""
    cpu = "sys/devices/system/cpu"
    files = {
        "proc/sys/kernel/version": "#1 SMP PREEMPT_DYNAMIC Mon Jun  2 00:00:00 UTC 2025\n",
        "proc/sys/kernel/osrelease": "6.8.0-generic\n",
        "proc/config.gz": gzip.compress(BAD_CONFIG.encode()),
        "proc/cmdline": "BOOT_IMAGE=/vmlinuz root=/dev/vda1 console=ttyS0\n",
        "proc/cpuinfo": "processor\t: 0\nflags\t\t: fpu tsc hypervisor\n\n",
        f"{cpu}/online": "0-1\n",
        "sys/devices/system/clocksource/clocksource0/current_clocksource": "kvm-clock\n",
        "sys/devices/system/clocksource/clocksource0/available_clocksource": "kvm-clock tsc acpi_pm \n",
        f"{cpu}/cpuidle/current_driver": "none\n",
        f"{cpu}/cpuidle/current_governor_ro": "menu\n",
        f"{cpu}/cpu1/topology/thread_siblings_list": "0-1\n",
        "sys/kernel/mm/transparent_hugepage/enabled": "[always] madvise never\n",
        "sys/kernel/mm/transparent_hugepage/defrag": "[always] defer defer+madvise madvise never\n",
        "proc/sys/kernel/sched_rt_runtime_us": "950000\n",
        "proc/sys/kernel/sched_rt_period_us": "1000000\n",
        "proc/swaps": ("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
                       "/swap.img                               file\t\t4194300\t\t10240\t\t-2\n"),
        "proc/sys/vm/swappiness": "60\n",
        "proc/self/status": "Name:\tpython\nCpus_allowed_list:\t0-1\nCapEff:\t0000000000000000\n",
        "proc/self/limits": LIMITS.format(memlock=8388608, rtprio=0),
        "proc/interrupts": ("           CPU0       CPU1       \n"
                            " 24:         10       5123  PCI-MSIX-0000:00:03.0   1-edge      virtio2-input.0\n"
                            " 25:       9000          0  PCI-MSIX-0000:00:03.0   2-edge      virtio2-output.0\n"
                            " 26:       4000          0  IO-APIC   4-edge      ttyS0\n"
                            "LOC:     100000     200000   Local timer interrupts\n"
                            "RES:       3000       4000   Rescheduling interrupts\n"),
        "proc/irq/24/smp_affinity_list": "0-1\n",
        "proc/irq/25/smp_affinity_list": "0-1\n",
        "proc/irq/26/smp_affinity_list": "0\n",
        "proc/irq/default_smp_affinity": "3\n",
        # steal 12% of each CPU's time since boot (the 8th value)
        "proc/stat": "cpu  1600 0 400 1520 0 0 0 480 0 0\n" + stat_line(0, 800, 200, 760, 240)
                     + stat_line(1, 800, 200, 760, 240),
        "proc/mounts": "sysfs /sys sysfs rw 0 0\nproc /proc proc rw 0 0\n",
    }
    files.update(kthread(2, "kthreadd", "0-1"))
    files.update(kthread(40, "kswapd0", "0-1"))
    files.update(kthread(41, "khugepaged", "0-1"))
    files.update(kthread(42, "kworker/u8:1-events_unbound", "0-1"))
    files.update(kthread(21, "ksoftirqd/1", "1"))
    return files


def by_check(result) -> dict:
    return {c["check"]: c for c in result["checks"]}


def assert_well_formed(result):
    assert result["checks"]
    for c in result["checks"]:
        assert set(c) >= {"check", "value", "verdict", "detail", "fix"}, c
        assert c["verdict"] in VERDICTS, c
        if c["verdict"] in ("warn", "bad"):
            assert c["fix"], f"{c['check']} is {c['verdict']} without a fix"
        if c["verdict"] == "unknown":
            assert c["detail"], f"{c['check']} is unknown without a reason"
    counts = {v: sum(c["verdict"] == v for c in result["checks"]) for v in VERDICTS}
    assert result["summary"]["line"] == f"{counts['bad']} bad, {counts['warn']} warn, {counts['ok']} ok, " \
                                        f"{counts['unknown']} unknown"
    assert result["exit_code"] == doctor.exit_code(result) == (1 if counts["bad"] else 0)


def test_a_well_tuned_rt_box_has_nothing_bad(tmp_path):
    root = make_tree(tmp_path, good_rt_box())
    r = run_doctor(root=root, sample=0, probe_privileges=False)
    assert_well_formed(r)
    assert r["loop_cpu"] == 1                                 # "last" = the highest CPU of Cpus_allowed_list
    c = by_check(r)
    not_ok = {k: (v["verdict"], v["value"], v["detail"]) for k, v in c.items() if v["verdict"] != "ok"}
    assert not_ok == {}, not_ok
    assert r["summary"]["bad"] == 0 and r["exit_code"] == 0
    assert c["preemption"]["value"] == "PREEMPT_RT"
    assert "1000" in c["HZ"]["value"]
    assert c["isolcpus"]["value"] == "isolcpus=managed_irq,domain,1"      # the args after `--` are init's
    assert "held at 0" in c["cpuidle"]["detail"] or "holds it at 0" in c["cpuidle"]["detail"]
    assert c["IRQs on the loop core"]["value"] == "none"
    assert "osnoise" in c["tracefs"]["value"]
    assert "bound to core 1" in c["kthreads on the loop core"]["detail"]
    assert r["machine"]["preempt"] == "rt" and r["machine"]["clocksource"] == "tsc"


def test_a_badly_tuned_vm_names_each_problem_and_its_fix(tmp_path):
    root = make_tree(tmp_path, bad_vm())
    r = run_doctor(root=root, sample=0, probe_privileges=False)
    assert_well_formed(r)
    c = by_check(r)
    expect = {   # check: (verdict, a piece of the fix)
        "preemption": ("bad", "preempt=full"),
        "clocksource": ("warn", "echo tsc > /sys/devices/system/clocksource/clocksource0/current_clocksource"),
        "THP enabled": ("warn", "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled"),
        "THP defrag": ("warn", "defer+madvise"),
        "RT throttling": ("warn", "kernel.sched_rt_runtime_us=-1"),
        "IRQs on the loop core": ("bad", "echo 0 > /proc/irq/$i/smp_affinity_list"),
        "steal since boot": ("bad", "dedicated"),
        "swap": ("warn", "swapoff -a"),
        "sched_fifo": ("bad", "rtprio"),
        "mlockall": ("warn", "memlock"),
        "cpu_dma_latency": ("warn", "udev"),
        "cpuidle": ("warn", "cpuidle_haltpoll.force=1"),
        "SMT siblings": ("warn", "smt/control"),
        "isolcpus": ("warn", "isolcpus="),
        "nohz_full": ("warn", "nohz_full=1"),
        "rcu_nocbs": ("warn", "rcu_nocbs=1"),
        "irqaffinity": ("warn", "irqaffinity=0"),
        "kthreads on the loop core": ("warn", "taskset -pc 0"),
        "tracefs": ("warn", "mount -t tracefs"),
    }
    for name, (verdict, fix) in expect.items():
        assert c[name]["verdict"] == verdict, (name, c[name])
        assert fix in c[name]["fix"], (name, c[name]["fix"])
    assert c["preemption"]["value"] == "voluntary"                # PREEMPT_DYNAMIC, boot default from the config
    assert "CONFIG_PREEMPT_VOLUNTARY" in c["preemption"]["detail"]
    assert c["cpufreq governor"] == {**c["cpufreq governor"], "value": "no cpufreq (VM: host decides)",
                                     "verdict": "unknown"}
    assert c["steal since boot"]["value"] == "cpu0 12.00%, cpu1 12.00%"
    irq = c["IRQs on the loop core"]
    assert "2 IRQs may land on core 1, 1 has fired there" == irq["value"]
    assert "24 virtio2-input.0 (5123 so far)" in irq["detail"] and "25 virtio2-output.0" in irq["detail"]
    assert "ttyS0" not in irq["detail"]                           # its affinity is core 0 only
    assert "LOC 200000" in irq["detail"]                          # per-CPU counts on the loop core
    kt = c["kthreads on the loop core"]
    assert "kswapd0" in kt["detail"] and "khugepaged" in kt["detail"]
    assert "40 41" in kt["fix"] and "42" not in kt["fix"].split("done")[0]   # kworkers: the workqueue cpumask
    assert "this kernel lacks CONFIG_NO_HZ_FULL" in c["nohz_full"]["detail"]
    assert "CONFIG_OSNOISE_TRACER" in c["tracefs"]["detail"]
    assert r["exit_code"] == 1
    text = doctor.format_text(r)
    assert text.rstrip().endswith(r["summary"]["line"] + " (privileges from capabilities/limits, not tried)")
    assert "fix: " in text and "INTERRUPTS" in text


def test_cpu_override_moves_the_per_core_checks(tmp_path):
    root = make_tree(tmp_path, good_rt_box())
    c = by_check(run_doctor(root=root, cpu=0, sample=0, probe_privileges=False))
    assert c["loop core"]["value"].startswith("core 0")
    assert c["isolcpus"]["verdict"] == "warn"                      # isolcpus=1 does not cover core 0
    assert c["IRQs on the loop core"]["verdict"] == "bad"           # eth0-rx and nvme0q0 fire on core 0
    assert "24 eth0-rx (5000 so far)" in c["IRQs on the loop core"]["detail"]
    c = by_check(run_doctor(root=root, cpu=5, sample=0, probe_privileges=False))
    assert c["loop core"]["verdict"] == "bad" and "affinity" in c["loop core"]["detail"]


def test_command_line_cpu_lists_with_stride_groups(tmp_path):
    """isolcpus/nohz_full in the kernel's group syntax (a-b:used/size): core 3 of 1-3:1/2 is covered,
    core 2 is not."""
    files = good_rt_box()
    files["proc/cmdline"] = "root=/dev/sda1 isolcpus=managed_irq,domain,1-3:1/2 nohz_full=1-3:1/2\n"
    files["sys/devices/system/cpu/online"] = "0-3\n"
    files["proc/self/status"] = files["proc/self/status"].replace("0-1", "0-3")
    root = make_tree(tmp_path, files)
    c = by_check(run_doctor(root=root, sample=0, probe_privileges=False))
    assert c["loop core"]["value"].startswith("core 3")
    assert c["isolcpus"]["verdict"] == "ok" and c["nohz_full"]["verdict"] == "ok"
    assert c["rcu_nocbs"]["value"] == "implied by nohz_full=1-3:1/2"
    c = by_check(run_doctor(root=root, cpu=2, sample=0, probe_privileges=False))
    assert c["isolcpus"]["verdict"] == "warn" and c["nohz_full"]["verdict"] == "warn"


def test_live_steal_sample(tmp_path):
    root = make_tree(tmp_path, good_rt_box())
    stat = os.path.join(root, "proc/stat")

    def sleep(seconds):      # one second passes: cpu1 loses 30 of its 100 ticks to the host
        with open(stat, "w") as f:
            f.write("cpu  0 0 0 0 0 0 0 0 0 0\n" + stat_line(0, 1050, 100, 10050, 0)
                    + stat_line(1, 1050, 100, 10020, 30))

    c = by_check(run_doctor(root=root, sample=1.0, probe_privileges=False, sleep=sleep))
    live = c["steal live (1 s)"]
    assert live["value"] == "cpu0 0.0%, cpu1 30.0%" and live["verdict"] == "bad" and live["fix"]
    r = run_doctor(root=root, sample=0, probe_privileges=False)
    assert not any(x["check"].startswith("steal live") for x in r["checks"])


def test_unreadable_and_missing_files_are_unknown_with_the_reason(tmp_path, monkeypatch):
    files = bad_vm()
    del files["proc/swaps"]                                     # missing
    files["proc/interrupts"] = None                             # a directory where a file should be
    root = make_tree(tmp_path, files)
    denied = {os.path.join(root, p) for p in ("sys/devices/system/clocksource/clocksource0/current_clocksource",
                                              "proc/sys/kernel/sched_rt_runtime_us")}
    real_open = open

    def fake_open(path, *a, **kw):          # what a non-root user meets on a 0400 file
        if os.fspath(path) in denied:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_open(path, *a, **kw)

    monkeypatch.setattr(procfs, "open", fake_open, raising=False)     # every read goes through procfs
    r = run_doctor(root=root, sample=0, probe_privileges=False)
    assert_well_formed(r)
    c = by_check(r)
    assert c["swap"]["verdict"] == "unknown" and c["swap"]["detail"] == "/proc/swaps does not exist"
    assert c["clocksource"]["verdict"] == "unknown"
    assert "current_clocksource: Permission denied" in c["clocksource"]["detail"]
    assert c["RT throttling"]["verdict"] == "unknown" and "Permission denied" in c["RT throttling"]["detail"]
    assert c["IRQs on the loop core"]["verdict"] == "unknown"
    assert "/proc/interrupts: Is a directory" in c["IRQs on the loop core"]["detail"]


def test_an_empty_tree_gives_verdicts_not_exceptions(tmp_path):
    r = run_doctor(root=str(tmp_path), sample=0.01, probe_privileges=False, sleep=lambda s: None)
    assert_well_formed(r)
    c = by_check(r)
    assert c["loop core"]["verdict"] == "unknown" and "Cpus_allowed_list" in c["loop core"]["detail"]
    assert c["preemption"]["verdict"] == "unknown"
    assert c["HZ"]["verdict"] == "unknown" and "/proc/config.gz does not exist" in c["HZ"]["detail"]
    # without a loop core the per-core checks do not run: unknown, with why
    for per_core in ("SMT siblings", "cpufreq governor", "IRQs on the loop core", "kthreads on the loop core"):
        assert c[per_core]["verdict"] == "unknown", per_core
        assert c[per_core]["detail"].startswith("the loop core is unknown: no CPU affinity mask"), c[per_core]
    facts = machine_facts(root=str(tmp_path))
    assert facts["preempt"] == "unknown" and facts["clocksource"] == "unknown"


def test_each_check_is_registered_once():
    keys = [(c.area, c.name) for c in CHECKS]
    assert len(keys) == len(set(keys)) and len({id(c.fn) for c in CHECKS}) == len(CHECKS)
    assert {c.area for c in CHECKS} == set(doctor.AREAS)                 # every area has a check
    # every check_* function of the package is registered (none is left out of the run)
    import importlib
    import pkgutil
    for m in pkgutil.iter_modules(doctor.__path__):
        mod = importlib.import_module(f"control_node.diagnosis.doctor.{m.name}")
        for name, fn in vars(mod).items():
            if name.startswith("check_") and callable(fn) and fn.__module__ == mod.__name__:
                assert any(c.fn is fn for c in CHECKS), f"{mod.__name__}.{name} is not registered"
    with pytest.raises(ValueError, match="already registered"):
        check("tracing", "tracefs")(lambda ctx: [])
    with pytest.raises(ValueError, match="already registered"):
        check("tracing", "another name")(CHECKS[0].fn)
    with pytest.raises(ValueError, match="unknown area"):
        check("nowhere", "x")
    assert len(CHECKS) == len(keys)                                       # the refused ones were not added


@pytest.mark.parametrize("tree", [good_rt_box, bad_vm, dict])
def test_checks_give_the_same_verdicts_in_any_order(tmp_path, tree):
    """No check depends on another having run first: each reads only the context, which derives the loop
    core, privileges and kernel config on first use. Shuffled orders give the same report and facts."""
    import random
    root = make_tree(tmp_path, tree())

    def run(order):
        ctx = Ctx(root, cpu=None, sample=1.0, sleep=lambda s: None)
        return run_checks(ctx, order), ctx.facts

    base, base_facts = run(CHECKS)
    assert base
    rng = random.Random(23)
    for _ in range(8):
        order = rng.sample(CHECKS, len(CHECKS))
        got, facts = run(order)
        assert got == base, [c.name for c in order]
        assert facts == base_facts
    assert run(list(reversed(CHECKS)))[0] == base


def test_the_privilege_probe_is_a_shipped_file():
    import tomllib
    assert os.path.isfile(PROBE) and PROBE.endswith("probe_privileges.py")
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        st = tomllib.load(f)["tool"]["setuptools"]
    assert "control_node.diagnosis.doctor" in st["packages"]
    assert os.path.basename(PROBE) in st["package-data"]["control_node.diagnosis.doctor"]
    # run as doctor runs it: isolated, no site; it answers every privilege, and leaves this process alone
    p = subprocess.run([sys.executable, "-I", "-S", PROBE, str(max(os.sched_getaffinity(0))), "1"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    answers = json.loads(p.stdout)
    assert set(answers) == {"affinity", "mlockall", "cpu_dma_latency", "sched_fifo"}
    assert all(isinstance(ok, bool) and isinstance(err, str) for ok, err in answers.values())
    assert answers["affinity"] == [True, ""]                              # a core of our own mask


# ----------------------------------------------------------------------------------- the verb and this machine

def parse(argv):
    p = argparse.ArgumentParser(prog="control-node")
    sub = p.add_subparsers(dest="verb", required=True)
    verb.register(sub)
    return p.parse_args(argv)


def test_help_names_every_option(capsys):
    with pytest.raises(SystemExit):
        parse(["doctor", "--help"])
    out = capsys.readouterr().out
    for opt in ("--cpu N", "--sample S", "--json", "--root DIR", "--config FILE", "--no-probe", "exit status"):
        assert opt in out, opt


def test_the_verb_on_fake_trees(tmp_path, capsys):
    good = make_tree(tmp_path / "good", good_rt_box())
    bad = make_tree(tmp_path / "bad", bad_vm())
    assert verb.run(parse(["doctor", "--root", good, "--sample", "0", "--json"])) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["bad"] == 0
    assert verb.run(parse(["doctor", "--root", bad, "--sample", "0"])) == 1
    out = capsys.readouterr().out
    assert "summary: 4 bad" in out and "fix: " in out


def test_this_machine(capsys):
    """The real machine: every check has a verdict, the privilege probes leave this process as it was."""
    before = (os.sched_getaffinity(0), os.sched_getscheduler(0))
    r = run_doctor(sample=0.2)
    assert (os.sched_getaffinity(0), os.sched_getscheduler(0)) == before
    assert_well_formed(r)
    names = {c["check"] for c in r["checks"]}
    for expected in ("preemption", "HZ", "clocksource", "cpuidle", "cpufreq governor", "SMT siblings", "THP enabled",
                     "RT throttling", "swap", "isolcpus", "nohz_full", "IRQs on the loop core", "steal since boot",
                     "steal live (0.2 s)", "kthreads on the loop core", "sched_fifo", "mlockall", "tracefs"):
        assert expected in names, expected
    assert r["privileges_probed"]
    with capsys.disabled():
        print(f"\nthis machine: {r['summary']['line']} (exit {r['exit_code']})")


def test_this_machine_json_and_exit_code_through_a_process():
    code = ("import argparse, sys\nfrom control_node.verbs import doctor\n"
            "p = argparse.ArgumentParser(prog='control-node'); s = p.add_subparsers(dest='verb')\n"
            "doctor.register(s)\na = p.parse_args(sys.argv[1:])\nsys.exit(doctor.run(a))\n")
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-c", code, "doctor", "--json", "--sample", "0"], capture_output=True,
                       text=True, env=env, timeout=120)
    doc = json.loads(p.stdout)
    assert p.returncode == (1 if any(c["verdict"] == "bad" for c in doc["checks"]) else 0), p.stderr
    assert doc["exit_code"] == p.returncode
    from control_node.config import load_config
    spec = load_config()["realtime"]["cpu"]            # the packaged default, "last"
    assert doc["machine"]["loop_cpu"] == (max(os.sched_getaffinity(0)) if spec in ("last", "none") else spec)
    p = subprocess.run([sys.executable, "-c", code, "doctor", "--sample", "0"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.stdout.rstrip().splitlines()[-1] == "summary: " + doc["summary"]["line"]


def test_machine_facts_is_cheap_and_never_raises():
    machine_facts()                                    # first call: nothing cached between calls anyway
    t0 = time.perf_counter()
    facts = machine_facts()
    ms = (time.perf_counter() - t0) * 1e3
    print(f"\nmachine_facts(): {ms:.1f} ms")
    assert ms < 1000
    for key in ("kernel", "preempt", "hz", "clocksource", "loop_cpu", "thp_enabled", "swap_kb",
                "sched_rt_runtime_us", "steal_pct_since_boot", "virtualized", "verdicts"):
        assert key in facts, key
    json.dumps(facts)
    assert machine_facts(root="/nonexistent/root")["preempt"] == "unknown"
    assert "error" not in machine_facts(cpu=99999)


def test_the_terminal_table(tmp_path):
    import io

    from rich.console import Console
    r = run_doctor(root=make_tree(tmp_path, bad_vm()), sample=0, probe_privileges=False)
    buf = io.StringIO()
    doctor.print_rich(r, Console(file=buf, width=160, force_terminal=False, color_system=None))
    out = buf.getvalue()
    assert "[realtime] cpu = last" in out                 # not eaten as rich markup
    assert "INTERRUPTS" in out and "smp_affinity_list" in out
    assert out.rstrip().splitlines()[-1].startswith("summary: " + r["summary"]["line"])
