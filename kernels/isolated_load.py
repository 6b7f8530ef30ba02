"""Reading a policy file for a running node in a process of its own (``control-node policy load``).

A running node's memory is locked (``mlockall(MCL_FUTURE)``): every page a reader touches in it is
faulted in and pinned, and a file that made it allocate gigabytes stalled the 1 kHz loop for tens of ms
(the model-file bomb of issue #44). So the node never parses an untrusted file itself while it runs. It
starts this module as a child process, which:

* is a fresh process: no memory lock (``mlockall`` is not inherited across ``execve``), the scheduling
  class and CPU mask of the node's lifecycle thread (off the loop's core), and a data limit
  (``RLIMIT_DATA``) of the bound plus what its interpreter and runtimes already hold;
* reads the file by the format's rules (``.npz`` bounded by its headers; ``.onnx`` / ``.pt`` through the
  importers, each tensor bounded) and proves the kernel against the reference, as ``Policy.load`` does;
* hands over the verified policy as a canonical model file (``model_file.model_bytes``) on its stdout,
  or one line naming what is wrong on its stderr with exit status 2.

The node then reads those bytes with the same bounded reader (at most ``max_bytes`` plus the zip's
overhead are read from the pipe), lays the kernel out and proves it once more on its own copy. Why a
process rather than a thread without the lock: a thread shares the locked address space and the GIL with
the node's other threads, and a reader that crashes (a bug in onnx or torch's parsers) takes only the
child down. What it costs: ~0.2 s of interpreter start per load, off the loop's core.
"""
from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time

#: how long the child may take (an ONNX import with its proof of a large policy takes seconds; a loaded CI
#: machine several times that)
TIMEOUT_S = 120.0
#: the child's stderr kept for the refusal (its last line is the message)
STDERR_KEEP = 64 << 10
#: the child's data limit above what it holds once its runtimes are imported: the file's arrays (bounded by
#: max_bytes), the kernel's copy of the weights and the proof's buffers
DATA_FACTOR = 3
DATA_SLACK = 256 << 20
#: the child's task name (what /proc and a trace show)
LOADER_NAME = "cn-loader"


class IsolatedLoadError(Exception):
    """The child refused the file (``refused``: its one-line reason) or failed (status, stderr tail)."""


def load_isolated(path, max_bytes, timeout=TIMEOUT_S, isa="fastest"):
    """Read, verify and prove the policy in ``path`` in a child process; returns the node's own
    :class:`Policy` of it (proven again here) on the vector copy ``isa`` picks. Raises :class:`IsolatedLoadError`
    with one line."""
    from control_node.kernels import Policy
    from control_node.kernels.model_file import MAX_DIRECTORY_BYTES, load_model
    from control_node.kernels.reference import check_consistency
    path = os.path.abspath(path)
    # the canonical file holds each array once, plus the zip's directory and headers
    limit = int(max_bytes) + MAX_DIRECTORY_BYTES + (1 << 20)
    cmd = [sys.executable, "-m", "control_node.kernels.isolated_load", path, str(int(max_bytes))]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            close_fds=True)
    out, err, why = bytearray(), bytearray(), None
    deadline = time.monotonic() + timeout
    sel = selectors.DefaultSelector()
    try:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        open_pipes = 2
        while open_pipes and why is None:
            left = deadline - time.monotonic()
            if left <= 0:
                why = f"the loader process took more than {timeout:g} s"
                break
            for key, _ in sel.select(min(left, 1.0)):
                chunk = os.read(key.fileobj.fileno(), 1 << 20)
                if not chunk:
                    sel.unregister(key.fileobj)
                    open_pipes -= 1
                    continue
                key.data.extend(chunk)
                if key.data is err and len(err) > STDERR_KEEP:
                    del err[:len(err) - STDERR_KEEP]
                if len(out) > limit:
                    why = f"the loader process handed over more than {limit} bytes"
                    break
    finally:
        sel.close()
        if why is not None:
            proc.kill()
        try:
            rc = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    lines = [ln for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
    if why is not None:
        raise IsolatedLoadError(f"cannot load {path}: {why}; refused")
    if rc == 2 and lines:
        raise IsolatedLoadError(lines[-1])
    if rc != 0:
        how = f"signal {-rc}" if rc < 0 else f"status {rc}"
        raise IsolatedLoadError(f"cannot load {path}: the loader process ended with {how}"
                                + (f": {lines[-1][:300]}" if lines else ""))
    spec = load_model(bytes(out), max_bytes, label=path)
    if isa in ("fastest", "widest"):    # the copy by the node's [policy] isa (kernels/dispatch.py)
        from control_node.kernels.dispatch import policy_for
        policy, choice = policy_for(spec, isa)
    else:
        from control_node.kernels.dispatch import machine_key
        policy = Policy(spec, isa=isa)
        choice = {"setting": isa, "copy": isa, "source": "forced", "isa": policy.isa, "times_ns": None,
                  "machine": machine_key()}
    policy.copy_choice = choice
    check_consistency(policy, policy.spec)
    return policy


def _limit_data(max_bytes):
    """Cap this process's data segment at what it holds now plus the file's bound (x DATA_FACTOR)."""
    import resource
    try:
        with open("/proc/self/status") as f:
            held = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmData:"))
    except (OSError, StopIteration, ValueError):
        return
    cap = held + DATA_FACTOR * int(max_bytes) + DATA_SLACK
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
    except (ValueError, OSError):
        pass


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # the handover goes to the original stdout alone; anything a library prints goes to stderr
    handover = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    path, max_bytes = argv[0], int(argv[1])
    try:
        os.nice(5)
    except OSError:
        pass
    try:                # PR_SET_NAME: the name the why-late trace would show, were it ever on the loop's core
        import ctypes
        ctypes.CDLL(None).prctl(15, LOADER_NAME.encode(), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    from control_node.kernels import ConsistencyError, ModelFileError, Policy
    from control_node.kernels.importers import ImportRefused
    from control_node.kernels.model_file import model_bytes
    if path.lower().endswith((".onnx",)):
        import onnx  # noqa: F401  (its runtimes are held before the data limit is set)
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            pass
    elif path.lower().endswith((".pt", ".pth", ".jit")):
        try:
            import torch  # noqa: F401
        except ImportError:
            pass
    _limit_data(max_bytes)
    try:
        policy = Policy.load(path, max_bytes=max_bytes)
        data = model_bytes(policy.spec)
    except (ModelFileError, ConsistencyError, ImportRefused) as e:
        print(str(e).replace("\n", " "), file=sys.stderr, flush=True)
        return 2
    except MemoryError:
        print(f"cannot load {path}: reading it needed more memory than its bound of {max_bytes} bytes "
              "(max_resident_bytes) allows; refused", file=sys.stderr, flush=True)
        return 2
    except Exception as e:       # whatever the bytes: one line, never a traceback on the node's side
        print(f"cannot load {path}: {type(e).__name__}: {str(e)[:300]}".replace("\n", " "), file=sys.stderr,
              flush=True)
        return 2
    handover.write(data)
    handover.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
