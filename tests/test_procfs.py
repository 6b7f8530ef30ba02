"""control_node.procfs, the one reader of /proc and /sys: its parsers on this machine's real files (checked
against what the OS says through other calls), on trees under tmp_path holding copies of those files and
edge cases written in the kernel's format (stride groups, CPUs offline, a 3-CPU interrupts table, arm64
lines, a VM and a bare-metal tree), malformed files named with their line; and doctor and the why-late
report agreeing on VM-ness over the same trees."""
from __future__ import annotations

import os
import shutil

import pytest

from control_node import procfs
from control_node.diagnosis.attribution import _core_counts, virtual_machine
from control_node.diagnosis.doctor import run_doctor
from control_node.procfs import (PF_KTHREAD, CpuTimes, Procfs, ProcfsError, StatSampler, format_cpulist,
                                 parse_counter_table, parse_cpulist, parse_hexmask, parse_stat, parse_task_stat)


def write_tree(root, files: dict) -> str:
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return str(root)


# ------------------------------------------------------------------------------------------ CPU lists

def test_cpulists_in_the_kernels_format():
    assert parse_cpulist("0-3,5,8-11:2/4") == {0, 1, 2, 3, 5, 8, 9}
    assert parse_cpulist("0-15:2/4") == {0, 1, 4, 5, 8, 9, 12, 13}          # bitmap_parselist's groups
    assert parse_cpulist("1-7:1/2") == {1, 3, 5, 7}
    assert parse_cpulist("0-1,3\n") == {0, 1, 3}                             # one CPU offline, newline kept
    assert parse_cpulist("") == set() and parse_cpulist("\n") == set() and parse_cpulist("(null)") == set()
    assert parse_cpulist("all", max_cpu=3) == {0, 1, 2, 3}
    assert parse_cpulist("2-N", max_cpu=4) == {2, 3, 4}
    assert format_cpulist({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8" and format_cpulist([]) == ""
    for cpus in ({0}, {0, 2, 4}, set(range(64)), {1, 3, 5, 6, 7, 63}):
        assert parse_cpulist(format_cpulist(cpus)) == cpus
    assert parse_hexmask("00000000,00000005") == {0, 2} and parse_hexmask("3\n") == {0, 1}


@pytest.mark.parametrize("bad", ["3-1", "a", "0-3:5/4", "0-3:1/0", "1,,x", "0--2", "all", "2-N"])
def test_a_malformed_cpulist_is_named(bad):
    with pytest.raises(ProcfsError, match=r"^/sys/x/online: "):
        parse_cpulist(bad, where="/sys/x/online")


def test_this_machines_cpu_lists():
    fs = Procfs()
    online, err = fs.online_cpus()
    assert err is None and online
    status, err = fs.status("self")
    assert err is None
    assert parse_cpulist(status["Cpus_allowed_list"]) == os.sched_getaffinity(0)
    assert os.sched_getaffinity(0) <= online
    for c in sorted(online):
        sib, err = fs.cpulist(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list")
        assert err is None and c in sib
    for irq in fs.irqs():
        cpus, err = fs.irq_affinity(irq)
        assert cpus is not None, err
        assert cpus <= online | set(range(max(online) + 1, 4096)), irq      # a mask may name absent CPUs


# ---------------------------------------------------------------------------- interrupts, softirqs

THREE_CPU_INTERRUPTS = """\
            CPU0       CPU1       CPU2       
   0:         44          0          0   IO-APIC   2-edge      timer
   1:          0          9          0   IO-APIC   1-edge      i8042
  24:       1200        300          0  PCI-MSI 512000-edge      ahci[0000:00:1f.2]
  25:          0          0         77  IR-PCI-MSI 1048576-edge      eth0-rx-0
 NMI:          0          0          0   Non-maskable interrupts
 LOC:      12345      23456      34567   Local timer interrupts
 IWI:          0          1          0   IRQ work interrupts
 ERR:          0
 MIS:          0
"""

ARM64_INTERRUPTS = """\
           CPU0       CPU1       CPU2       
 11:      23070      21947      22196     GICv3  27 Level     arch_timer
 14:          0          0          0     GICv3 115 Level     ttyS0
IPI0:       1234       2345       3456       Rescheduling interrupts
IPI1:         11         22         33       Function call interrupts
Err:          0
"""


def test_a_three_cpu_interrupts_table():
    t = parse_counter_table(THREE_CPU_INTERRUPTS)
    assert t.cpus == (0, 1, 2) and len(t.rows) == 9
    eth = next(r for r in t.rows if r.name == "25")
    assert eth.numbered and eth.counts == {0: 0, 1: 0, 2: 77} and eth.device == "eth0-rx-0"
    assert eth.desc == "IR-PCI-MSI 1048576-edge eth0-rx-0"
    loc = next(r for r in t.rows if r.name == "LOC")
    assert not loc.numbered and loc.counts == {0: 12345, 1: 23456, 2: 34567}
    assert loc.desc == "Local timer interrupts"
    err = next(r for r in t.rows if r.name == "ERR")
    assert err.counts == {0: 0} and err.desc == ""                        # one column only
    on2 = t.on_cpu(2)
    assert on2["25 IR-PCI-MSI 1048576-edge eth0-rx-0"] == 77 and on2["LOC"] == 34567
    assert "ERR" not in on2 and t.on_cpu(0)["ERR"] == 0 and t.on_cpu(3) is None
    arm = parse_counter_table(ARM64_INTERRUPTS)
    assert arm.cpus == (0, 1, 2)
    assert [r.name for r in arm.rows] == ["11", "14", "IPI0", "IPI1", "Err"]
    assert arm.rows[0].device == "arch_timer" and arm.on_cpu(1)["IPI0"] == 2345


def test_an_offline_cpu_has_no_column():
    text = ("           CPU0       CPU2       \n"
            "  24:        100        200   IO-APIC   5-edge      ACPI:Ged\n"
            " LOC:       1000       2000   Local timer interrupts\n")
    t = parse_counter_table(text)
    assert t.cpus == (0, 2) and t.on_cpu(1) is None and t.on_cpu(2) == {"24 IO-APIC 5-edge ACPI:Ged": 200,
                                                                           "LOC": 2000}


@pytest.mark.parametrize("text,line", [("", None), ("garbage here\n", 1), ("   CPU0\n  24 100\n", 2),
                                       ("   CPU0\n one two: 3\n", 2)])
def test_a_malformed_table_names_the_file_and_line(text, line):
    with pytest.raises(ProcfsError) as e:
        parse_counter_table(text, "/proc/interrupts")
    assert e.value.path == "/proc/interrupts" and e.value.line == line
    assert str(e.value).startswith("/proc/interrupts" + (f":{line}: " if line else ": "))


def test_this_machines_interrupts_and_softirqs():
    fs = Procfs()
    online, _ = fs.online_cpus()
    for read, must in ((fs.interrupts, "LOC"), (fs.softirqs, "TIMER")):
        t, err = read()
        assert err is None and set(t.cpus) == online
        names = {r.name for r in t.rows}
        assert must in names or "IPI0" in names, names
        for c in t.cpus:
            counts = t.on_cpu(c)
            assert counts and all(v >= 0 for v in counts.values())
    softirqs, _ = fs.softirqs()
    assert {r.name for r in softirqs.rows} >= {"HI", "TIMER", "NET_RX", "SCHED", "RCU"}
    assert all(len(r.counts) == len(softirqs.cpus) for r in softirqs.rows)


def test_the_why_late_counts_come_from_procfs(tmp_path):
    root = write_tree(tmp_path, {"proc/interrupts": THREE_CPU_INTERRUPTS,
                                 "proc/softirqs": "  CPU0 CPU1 CPU2\n  TIMER:  1 2 3\n  RCU: 4 5 6\n",
                                 "proc/stat": "cpu  3 0 3 3 0 0 0 3 0 0\ncpu0 1 0 1 1 0 0 0 1 0 0\n"
                                              "cpu1 1 0 1 1 0 0 0 1 0 0\ncpu2 1 0 1 1 0 9 8 7 0 0\n"})
    c = _core_counts(Procfs(root), 2)
    assert c["softirqs"] == {"TIMER": 3, "RCU": 6} and c["interrupts"]["LOC"] == 34567
    assert c["stat"] == CpuTimes(2, 1, 0, 1, 1, 0, 9, 8, 7)
    c = _core_counts(Procfs(tmp_path / "nothing"), 2)
    assert c == {"interrupts": None, "softirqs": None, "stat": None}


# ----------------------------------------------------------------------------------------- /proc/stat

def test_stat_lines_and_a_malformed_one():
    s = parse_stat("cpu  10 0 10 10 0 0 0 10 0 0\ncpu0 5 1 5 5 2 3 4 6 7 8\ncpu3 5 0 5 5 0 0 0 4 0 0\nintr 1 2\n")
    assert set(s) == {0, 3}                                             # CPUs 1-2 offline: no line
    assert s[0] == CpuTimes(0, 5, 1, 5, 5, 2, 3, 4, 6) and s[0].total == 31
    with pytest.raises(ProcfsError, match=r"^/proc/stat:2: cpu0 has 4 values"):
        parse_stat("cpu  1 2 3 4\ncpu0 1 2 3 4\n")
    with pytest.raises(ProcfsError, match=r"^/proc/stat: no cpuN lines"):
        parse_stat("intr 1 2\n")


def test_this_machines_stat_and_the_sampler(tmp_path):
    fs = Procfs()
    stat, err = fs.stat()
    online, _ = fs.online_cpus()
    assert err is None and set(stat) == online
    cpu = max(online)
    with open("/proc/stat") as f:
        fields = next(line for line in f if line.startswith(f"cpu{cpu} ")).split()[1:9]
    now = StatSampler(cpu)
    try:
        first = now.read()
        assert first.cpu == cpu and first.total >= sum(int(v) for v in fields)    # ticks only grow
        assert now.read().total >= first.total
    finally:
        now.close()
    # a tree's /proc/stat rewritten between reads: the sampler reads it again from the start
    root = write_tree(tmp_path, {"proc/stat": "cpu  0 0 0 0 0 0 0 0\ncpu1 1 0 1 1 0 0 0 2 0 0\n"})
    s = StatSampler(1, root)
    try:
        assert s.read().steal == 2
        with open(os.path.join(root, "proc/stat"), "r+") as f:
            f.write("cpu  0 0 0 0 0 0 0 0\ncpu1 1 0 1 1 0 0 0 9 0 0\n")
        assert s.read().steal == 9
        assert StatSampler(5, root).read() is None                          # no such CPU line
    finally:
        s.close()


# ------------------------------------------------------------------------------- tasks and kthreads

def test_task_stat_with_a_comm_holding_parentheses_and_spaces():
    text = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 " + " ".join(["0"] * 12) + " 98765 " + \
        " ".join(["0"] * 30) + "\n"
    st = parse_task_stat(text)
    assert st.pid == 4242 and st.comm == "my (odd) name" and st.state == "S"
    assert st.flags == 4194560 and not st.kthread and st.start_time == 98765
    with pytest.raises(ProcfsError, match=r"^/proc/7/stat:1: "):
        parse_task_stat("7 (x) S 1 2\n", "/proc/7/stat")


def test_this_machines_tasks_and_kernel_threads():
    fs = Procfs()
    me, err = fs.task(os.getpid())
    assert err is None and me.pid == os.getpid() and not me.kthread and me.start_time > 0
    assert fs.comm(os.getpid()) == me.comm
    assert os.getpid() in fs.pids() and os.getpid() in fs.tids(os.getpid())
    kthreadd, _ = fs.task(2)
    if kthreadd is None or kthreadd.comm != "kthreadd":
        pytest.skip("no kthreadd at pid 2 (a PID namespace): no kernel threads visible")
    assert kthreadd.kthread and kthreadd.flags & PF_KTHREAD
    kts = fs.kernel_threads()
    assert any(k.pid == 2 for k in kts) and all(k.pid != os.getpid() for k in kts)
    status, _ = fs.status(2)
    assert status.get("Kthread", "1") == "1"                            # the kernel's own word agrees
    online, _ = fs.online_cpus()
    assert any(k.cpus == {max(online)} for k in kts)                     # per-CPU ones (ksoftirqd/N)


def test_kernel_threads_in_a_tree(tmp_path):
    def stat(pid, comm, flags):
        return f"{pid} ({comm}) S 2 0 0 0 -1 {flags} " + " ".join(["0"] * 12) + " 5 " + " ".join(["0"] * 30) + "\n"
    root = write_tree(tmp_path, {
        "proc/2/stat": stat(2, "kthreadd", 0x00208040), "proc/2/status": "Name:\tkthreadd\nCpus_allowed_list:\t0-3\n",
        "proc/21/stat": stat(21, "ksoftirqd/1", 0x04208040), "proc/21/status": "Cpus_allowed_list:\t1\n",
        "proc/40/stat": stat(40, "kswapd0", 0x00a20840), "proc/40/status": "Name:\tkswapd0\n",
        "proc/100/stat": stat(100, "python", 0x00400100), "proc/100/status": "Cpus_allowed_list:\t0-3\n",
        "proc/self/status": "Cpus_allowed_list:\t0-3\n"})
    kts = {k.pid: k for k in Procfs(root).kernel_threads()}
    assert set(kts) == {2, 21, 40}
    assert kts[21].cpus == {1} and kts[2].cpus == {0, 1, 2, 3} and kts[40].cpus is None   # unreadable list


# --------------------------------------------------------------------------------- cpuinfo and VMs

X86_CPUINFO = ("processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme tsc constant_tsc {hv}\n\n"
               "processor\t: 1\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme tsc constant_tsc {hv}\n\n")
ARM_CPUINFO = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm\nCPU implementer\t: 0x41\n\n"

VM_TREES = {   # name: (files, vm)
    "bare metal x86": ({"proc/cpuinfo": X86_CPUINFO.format(hv=""),
                        "sys/class/dmi/id/sys_vendor": "Dell Inc.\n",
                        "sys/class/dmi/id/product_name": "PowerEdge R650\n"}, False),
    "bare metal arm64": ({"proc/cpuinfo": ARM_CPUINFO}, False),
    "KVM guest (CPU flag)": ({"proc/cpuinfo": X86_CPUINFO.format(hv="hypervisor")}, True),
    "Xen guest (/sys/hypervisor)": ({"proc/cpuinfo": X86_CPUINFO.format(hv=""), "sys/hypervisor/type": "xen\n"}, True),
    "arm64 guest (DMI only)": ({"proc/cpuinfo": ARM_CPUINFO, "sys/class/dmi/id/sys_vendor": "QEMU\n",
                                "sys/class/dmi/id/product_name": "KVM Virtual Machine\n"}, True),
    "nothing readable": ({}, None),
}


def test_cpuinfo():
    x86 = procfs.parse_cpuinfo(X86_CPUINFO.format(hv="hypervisor"))
    assert len(x86.processors) == 2 and "hypervisor" in x86.flags and "constant_tsc" in x86.flags
    assert procfs.parse_cpuinfo("processor\t: 0\nmodel name\t: AMD EPYC 9R14\n\n").model == "AMD EPYC 9R14"
    arm = procfs.parse_cpuinfo(ARM_CPUINFO)
    assert arm.flags == {"fp", "asimd", "evtstrm"} and arm.processors[0]["CPU implementer"] == "0x41"
    info, err = Procfs().cpuinfo()
    assert err is None
    assert len([p for p in info.processors if "processor" in p]) == len(Procfs().online_cpus()[0])
    with open("/proc/cpuinfo") as f:
        names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    assert info.model == (names[0] if names else "")


@pytest.mark.parametrize("name", sorted(VM_TREES))
def test_doctor_and_the_why_late_report_agree_on_vm_ness(tmp_path, name):
    files, vm = VM_TREES[name]
    root = write_tree(tmp_path, files)
    assert Procfs(root).virtualization().vm is vm
    doctor_says = run_doctor(root=root, sample=0, probe_privileges=False)["machine"]["virtualized"]
    why_late_says = virtual_machine(root)
    assert doctor_says is vm
    assert why_late_says["vm"] is bool(vm) and why_late_says["detail"]   # unknown counts as not a VM there


def test_this_machine_vm_ness_is_one_answer():
    v = Procfs().virtualization()
    assert v.vm is not None and v.how
    assert virtual_machine()["vm"] == v.vm
    with open("/proc/cpuinfo") as f:
        if "hypervisor" in f.read().split():
            assert v.vm                                                  # the flag alone decides it


# --------------------------------------------------------------------------- copies of the real files

def test_copies_of_this_machines_files_parse_the_same(tmp_path):
    """The real files copied into a tree: read through the root prefix they give what the live ones
    give (stable parts: the CPU columns, row names, CPU lists, flags)."""
    live = Procfs()
    for rel in ("proc/interrupts", "proc/softirqs", "proc/stat", "proc/cpuinfo", "sys/devices/system/cpu/online",
                "proc/self/status", "proc/self/limits"):
        os.makedirs(os.path.join(tmp_path, os.path.dirname(rel)), exist_ok=True)
        with open("/" + rel, "rb") as src, open(os.path.join(tmp_path, rel), "wb") as dst:
            shutil.copyfileobj(src, dst)
    tree = Procfs(tmp_path)
    for name in ("interrupts", "softirqs"):
        a, _ = getattr(live, name)()
        b, err = getattr(tree, name)()
        assert err is None and a.cpus == b.cpus and [r.name for r in a.rows] == [r.name for r in b.rows]
    assert set(tree.stat()[0]) == set(live.stat()[0])
    assert tree.online_cpus() == live.online_cpus()
    assert tree.cpuinfo()[0].flags == live.cpuinfo()[0].flags
    assert tree.virtualization().vm == live.virtualization().vm
    assert tree.limits()[0]["Max locked memory"] and "Cpus_allowed_list" in tree.status()[0]


def test_a_missing_or_malformed_file_is_a_reason_not_a_traceback(tmp_path):
    root = write_tree(tmp_path, {"proc/interrupts": "   CPU0\n  24 100\n", "proc/stat": "cpu0 1 2\n",
                                 "sys/devices/system/cpu/online": "0-x\n"})
    fs = Procfs(root)
    assert fs.interrupts() == (None, "/proc/interrupts:2: not `NAME: counts`: '24 100'")
    assert fs.stat()[1] == "/proc/stat:1: cpu0 has 2 values, not 8 or more numbers (the 8th is steal)"
    assert fs.online_cpus()[1].startswith("/sys/devices/system/cpu/online: '0-x'")
    assert fs.softirqs() == (None, "/proc/softirqs does not exist")
    os.makedirs(os.path.join(root, "proc/cpuinfo"))
    assert fs.cpuinfo() == (None, "/proc/cpuinfo: Is a directory")


# ------------------------------------------------------------------------ mounts, swaps, cmdline

def test_mounts_swaps_and_the_command_line():
    mounts = procfs.parse_mounts("sysfs /sys sysfs rw,nosuid 0 0\n"
                                 "tracefs /sys/kernel/tracing tracefs rw 0 0\n"
                                 "/dev/sdb1 /media/my\\040disk ext4 rw 0 0\n")
    assert [m.fstype for m in mounts] == ["sysfs", "tracefs", "ext4"] and mounts[2].path == "/media/my disk"
    with pytest.raises(ProcfsError, match=r"^/proc/mounts:2: "):
        procfs.parse_mounts("sysfs /sys sysfs rw 0 0\nbroken\n")
    swaps = procfs.parse_swaps("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
                               "/swap.img                               file\t\t4194300\t\t10240\t\t-2\n"
                               "/dev/zram0                              partition\t8388604\t\t0\t\t100\n")
    assert swaps == [procfs.Swap("/swap.img", 4194300, 10240), procfs.Swap("/dev/zram0", 8388604, 0)]
    assert procfs.parse_swaps("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n") == []
    with pytest.raises(ProcfsError, match=r"^/proc/swaps:2: "):
        procfs.parse_swaps("Filename Type Size Used Priority\n/swap.img file big 0 -2\n")
    params = procfs.parse_cmdline("BOOT_IMAGE=/vmlinuz root=/dev/sda1 quiet isolcpus=managed_irq,domain,1 "
                                  "-- isolcpus=0\n")
    assert params == {"BOOT_IMAGE": "/vmlinuz", "root": "/dev/sda1", "quiet": "", "isolcpus": "managed_irq,domain,1"}


def test_this_machines_mounts_swaps_and_command_line():
    fs = Procfs()
    mounts, err = fs.mounts()
    assert err is None and any(m.path == "/" for m in mounts) and any(m.fstype == "proc" for m in mounts)
    assert {m.path for m in mounts if m.fstype == "proc"} >= {"/proc"}
    swaps, err = fs.swaps()
    assert err is None and all(s.size_kb > 0 and s.used_kb >= 0 for s in swaps)
    params, err = fs.cmdline()
    with open("/proc/cmdline") as f:
        first = f.read().split()
    assert err is None and (not first or first[0].partition("=")[0] in params)


def test_the_why_late_recorder_reads_through_a_root(tmp_path):
    """The recorder's evidence (VM verdict, interrupt/softirq counts on the core, steal over the run) comes
    from the tree it is given: counts rise between start and stop, the VM verdict is the tree's."""
    from control_node.diagnosis.attribution import USER_HZ, Recorder
    files, _ = VM_TREES["KVM guest (CPU flag)"]
    stat = "cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 1 0 1 1 0 0 0 0 0 0\ncpu1 1 0 1 1 0 0 0 0 0 0\ncpu2 1 0 1 1 0 0 0 {} 0 0\n"
    root = write_tree(tmp_path, {**files, "proc/interrupts": THREE_CPU_INTERRUPTS, "proc/stat": stat.format(100),
                                 "proc/softirqs": "  CPU0 CPU1 CPU2\n  TIMER:  1 2 3\n  RCU: 4 5 6\n"})
    rec = Recorder(2, os.getpid(), tracing=False, root=root).start()
    try:
        assert rec.evidence["virtual_machine"]["vm"] is True and rec.evidence["steal"]["granted"]
        write_tree(tmp_path, {"proc/interrupts": THREE_CPU_INTERRUPTS.replace("34567", "34600"),
                              "proc/softirqs": "  CPU0 CPU1 CPU2\n  TIMER:  1 2 13\n  RCU: 4 5 6\n",
                              "proc/stat": stat.format(150)})
    finally:
        rec.stop()
    ev = rec.evidence
    assert ev["interrupts"] == {"granted": True, "on_core_during_run": {"LOC": 33}}
    assert ev["softirqs"] == {"granted": True, "on_core_during_run": {"TIMER": 10}}
    assert ev["steal"]["run_total_ms"] == pytest.approx(50 * 1e3 / USER_HZ)
    rec = Recorder(5, os.getpid(), tracing=False, root=root).start()          # a CPU the tree does not have
    rec.stop()
    assert not rec.evidence["steal"]["granted"] and not rec.evidence["interrupts"]["granted"]
