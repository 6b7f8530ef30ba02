"""The privilege probe doctor runs as a child (``python -I -S probe_privileges.py CPU PRIORITY``): it tries
affinity to CPU, mlockall, /dev/cpu_dma_latency and SCHED_FIFO at PRIORITY, then exits, so nothing stays
changed. Prints {name: [granted, error]} as JSON. Standard library only (it runs with -I -S)."""
import ctypes
import json
import os
import struct
import sys


def attempt(out, name, fn):
    try:
        fn()
        out[name] = [True, ""]
    except (OSError, ValueError, AttributeError) as e:
        out[name] = [False, (e.strerror if isinstance(e, OSError) and e.strerror else str(e))]


def mlock():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mlockall(3) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    libc.munlockall()


def dma():
    fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
    try:
        os.write(fd, struct.pack("i", 0))
    finally:
        os.close(fd)


def main(argv):
    cpu, prio = int(argv[1]), int(argv[2])

    def fifo():
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(prio))
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))

    out = {}
    attempt(out, "affinity", lambda: os.sched_setaffinity(0, {cpu}))
    attempt(out, "mlockall", mlock)
    attempt(out, "cpu_dma_latency", dma)
    attempt(out, "sched_fifo", fifo)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv)
