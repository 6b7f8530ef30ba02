"""The libzmq entry points the compiled loop calls.

The loop calls libzmq directly (no GIL, no Python objects). Rather than linking
against the privately named libzmq inside pyzmq's wheel at build time (fragile
across pyzmq upgrades), we look up, at run time, the very library that pyzmq
loaded into this process and take the addresses of five stable C functions.
"""
from __future__ import annotations

import ctypes
import os

from control_node.errors import UserError

LIBZMQ_FUNCTIONS = ("zmq_recv", "zmq_send", "zmq_getsockopt", "zmq_errno", "zmq_poll")


def _loaded_libzmq_path() -> str:
    import zmq.backend.cython  # noqa: F401  (loads libzmq into the process)
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if "libzmq" in os.path.basename(path):
                return path
    raise UserError("cannot find the libzmq that pyzmq loaded (no 'libzmq' in /proc/self/maps); "
                    "reinstall pyzmq")


def libzmq_functions() -> dict:
    """Addresses (ints) of the libzmq functions the loop uses, from pyzmq's own libzmq."""
    lib = ctypes.CDLL(_loaded_libzmq_path(), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    return {name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in LIBZMQ_FUNCTIONS}
