"""Shared fixtures. Keep this small: helpers used by more than one test module only."""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import tempfile

# One BLAS / OpenMP thread in every test process and child: three workers share two cores, and OpenBLAS's
# pool, sized to the cores, spins between calls: the pendulum trainer took 4.5 CPU-s for 2.2 s of work; the
# README command 480 -> 438 CPU-s (303 -> 273 s). The environment reaches the -n workers and every child
# they start; this process may have loaded OpenBLAS already (pytest-randomly imports numpy.random first), so
# its pool is limited in place. The rules tested do not depend on it; speed is bench's, run outside pytest.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402  (scikit-learn's dependency)

threadpool_limits(1)
import pytest

_LOCK_DIR = os.path.join(tempfile.gettempdir(), f"control-node-tests-{os.getuid()}")

# The default {runtime_dir} (the packaged configs' ipc endpoints) of this process and every child it starts: a
# private one per test process, and per test below. With the shared /tmp/control-node-UID a fresh-clone run had
# a ROS 2 launch's node take no frame in 21 s (the bridge sent 1688): another worker's launch of a packaged
# config used the same socket files (libzmq's bind replaces the file, and launch removed it at its end).
_RUNTIME_ROOT = tempfile.mkdtemp(prefix="cn-rt-")
os.environ["XDG_RUNTIME_DIR"] = _RUNTIME_ROOT
atexit.register(shutil.rmtree, _RUNTIME_ROOT, True)


@contextlib.contextmanager
def _machine_lock(exclusive):
    """A readers-writer lock over every test process on the machine (both -n workers, and any other run
    of the suite): a test marked ``machine_exclusive`` runs with no other test beside it; the others share.
    A waiting exclusive test holds the gate, so new shared ones queue behind it instead of starving it."""
    os.makedirs(_LOCK_DIR, exist_ok=True)
    with open(os.path.join(_LOCK_DIR, "gate"), "a") as gate, open(os.path.join(_LOCK_DIR, "machine"), "a") as lk:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lk, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lk, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Around setup, call and teardown (module fixtures' processes included): see _machine_lock. Found by a
    fresh-clone run of `pytest -n 2`: an isolation test moved the other worker's launch off the loop core,
    and the simulator that launch started meanwhile kept that one-core mask."""
    with _machine_lock(item.get_closest_marker("machine_exclusive") is not None):
        yield


def pytest_collection_modifyitems(config, items):
    """Slow tests spread evenly through the run, machine-exclusive tests last; pytest-randomly's order is
    otherwise kept.

    Spread: under -n a worker takes the next test when it is free. Slow tests (compiles, training, long node
    runs) dealt out together leave the cores idle later, while the short ones mostly wait on sockets and
    timers: all slow first took 342 s (-n 3) and 363 s (-n 4) with ~240 idle CPU-s; random order, which
    bunches them by chance, 248-296 s at -n 4 (79 idle CPU-s in the one run measured for it); spread evenly,
    226 and 228 s (60 and 65 idle CPU-s) (main checkout, 2 vCPUs, 2026-12-05).
    Exclusive last: each waits for every shared test in flight to end, then holds the other workers idle
    while it runs; at the end it overlaps the run's own tail."""
    exclusive = [i for i in items if i.get_closest_marker("machine_exclusive") is not None]
    shared = [i for i in items if i.get_closest_marker("machine_exclusive") is None]
    slow = [i for i in shared if i.get_closest_marker("slow") is not None]
    rest = [i for i in shared if i.get_closest_marker("slow") is None]
    spread = []
    for k, item in enumerate(rest):
        # slow test j goes before the rest's item at j * len(rest) / len(slow): an even spacing
        while len(spread) - k < len(slow) and (len(spread) - k) * len(rest) <= k * len(slow):
            spread.append(slow[len(spread) - k])
        spread.append(item)
    spread += slow[len(spread) - len(rest):]
    items[:] = spread + exclusive


def pytest_configure(config):
    """Byte-compile the package once, in the controlling process, before any worker starts: the suite starts
    ~400 Python children (nodes, simulators, the CLI) and with PYTHONDONTWRITEBYTECODE=1 (set on the machines
    here) each compiled the package's sources again, ~0.13 CPU-s per start (node start 0.88 -> 0.72 CPU-s).
    Python still reads a __pycache__ it may not write; an installed package has its own already."""
    if hasattr(config, "workerinput"):
        return
    import compileall
    import importlib.util
    for name in ("control_node", "control_node.kernels", "control_node.train", "control_node.sim",
                 "control_node.bench"):
        try:
            spec = importlib.util.find_spec(name)
        except ImportError:             # not installed: every test then fails on its own, naming it
            return
        for path in spec.submodule_search_locations if spec else ():
            compileall.compile_dir(path, quiet=2)


def random_spec(sizes, dtype="float64", seed=0, weight_scale=1.0):
    """A :class:`kernels.ModelSpec` with random weights for layer widths ``sizes = [n_in, ..., n_out]``."""
    from control_node.kernels import ModelSpec
    rng = np.random.default_rng(seed)
    layers = [(rng.normal(0.0, weight_scale / np.sqrt(n_in), size=(n_in, n_out)),
               rng.normal(0.0, 0.1, size=n_out))
              for n_in, n_out in zip(sizes[:-1], sizes[1:])]
    d = sizes[0]
    return ModelSpec(layers=layers, mean=rng.normal(0.0, 1.0, size=d), scale=rng.uniform(0.5, 2.0, size=d),
                     classes=[f"c{i}" for i in range(sizes[-1])], feature_names=[f"x{i}" for i in range(d)],
                     dtype=dtype, trainer="random")


@pytest.fixture(scope="session")
def make_spec():
    """Factory: ``make_spec([4, 13, 3], dtype="float32", seed=1)`` -> ModelSpec with random weights."""
    return random_spec


def _exported(export_verified, spec, tmp_path_factory, name):
    """``spec`` written by its trainer's ``export_verified`` (checked against the numpy reference) to a fresh
    directory; its path."""
    path = tmp_path_factory.mktemp("models") / name
    export_verified(spec, path)
    return path


@pytest.fixture(scope="session")
def iris_spec():
    """The default iris policy (4 -> 16 -> 3, float64, seed 0), trained once per session."""
    from control_node.train.iris import train_iris
    return train_iris()


@pytest.fixture(scope="session")
def iris_model_path(iris_spec, tmp_path_factory):
    """A verified model file for :func:`iris_spec`."""
    from control_node.train.iris import export_verified
    return _exported(export_verified, iris_spec, tmp_path_factory, "iris.npz")


@pytest.fixture(scope="session")
def policy(iris_model_path):
    """The compiled policy for :func:`iris_model_path`."""
    from control_node.kernels import Policy
    return Policy.load(iris_model_path)


def made_once(tmp_path_factory, name, make):
    """The file ``name``, written by ``make(path)`` once for the whole run: the -n workers share it (the first
    to ask makes it under a lock, the others wait for it), so a policy trained for the run is trained once,
    not once per worker that needs it. ``make`` must give the same file whichever worker calls it (the
    trainers are deterministic: test_train_is_deterministic). Returns its path."""
    base = tmp_path_factory.getbasetemp()
    # a worker's base is <the run's dir>/popen-gwN; without -n the base is the run's own
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / "made-once" / name
    path.parent.mkdir(exist_ok=True)
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            part = path.with_name("part-" + name)       # the same suffix: np.savez adds .npz to a name without
            make(part)
            os.replace(part, path)
    return path


@pytest.fixture(scope="session")
def pendulum_model(tmp_path_factory):
    """The pendulum swing-up policy (`train --task pendulum`'s) as a verified model file (path as a string),
    trained once per run (2 CPU-s)."""
    from control_node.train.pendulum import export_verified, train_pendulum
    return str(made_once(tmp_path_factory, "pendulum.npz", lambda p: export_verified(train_pendulum(), p)))


@pytest.fixture(scope="session")
def pendulum_spec(pendulum_model):
    """:func:`pendulum_model`'s policy, read back from its file."""
    from control_node.kernels import load_model
    return load_model(pendulum_model)


def continuous_spec(dtype="float32", seed=0, sizes=(6, 32, 32, 4), squash=True, weight_scale=1.0):
    """A continuous :class:`kernels.ModelSpec`: ELU hidden layers, identity output, tanh squash, per-action
    offset (a "default pose") and scale, random weights; action names j0..j{n-1}."""
    from control_node.kernels import ModelSpec
    rng = np.random.default_rng(seed)
    layers = [(rng.normal(0.0, weight_scale / np.sqrt(n_in), size=(n_in, n_out)), rng.normal(0.0, 0.1, size=n_out))
              for n_in, n_out in zip(sizes[:-1], sizes[1:])]
    d, n_act = sizes[0], sizes[-1]
    return ModelSpec(layers=layers, mean=rng.normal(0.0, 0.5, size=d), scale=rng.uniform(0.5, 2.0, size=d),
                     classes=[], feature_names=[f"obs{i}" for i in range(d)], dtype=dtype, trainer="random",
                     head="continuous", activations=["elu"] * (len(sizes) - 2) + ["identity"],
                     action_names=[f"j{i}" for i in range(n_act)],
                     action_offset=np.round(rng.uniform(-1.0, 1.0, size=n_act), 3), action_scale=0.25 + 0.1 * np.arange(n_act),
                     squash=squash, check_X=rng.normal(0.0, 1.5, size=(64, d)))


def _save(spec, tmp_path_factory, name):
    from control_node.kernels import Policy, save_model
    path = tmp_path_factory.mktemp("models") / name
    save_model(spec, path)
    Policy.load(path)               # verified against the numpy reference, as the node will
    return path


@pytest.fixture(scope="session")
def make_continuous_spec():
    """Factory: ``make_continuous_spec(dtype="float64", seed=1)`` -> a continuous ModelSpec."""
    return continuous_spec


@pytest.fixture(scope="session")
def continuous_model_path(tmp_path_factory):
    """A verified continuous policy file: 6 -> 32 -> 32 -> 4, ELU, float32, tanh squash, offset/scale."""
    return _save(continuous_spec("float32"), tmp_path_factory, "continuous-f32.npz")


@pytest.fixture(scope="session")
def continuous_f64_model_path(tmp_path_factory):
    """The same shape in float64 (the node's answers equal Policy.act bit for bit)."""
    return _save(continuous_spec("float64", seed=1), tmp_path_factory, "continuous-f64.npz")


@pytest.fixture(scope="session")
def overflow_model_path(tmp_path_factory):
    """A continuous policy whose output overflows for large inputs: 6 -> 4, identity, weights 1e200, no
    squash. Finite for inputs of order 1 (check_X), +-inf for x = 1e200: the kernel returns -1."""
    from control_node.kernels import ModelSpec
    rng = np.random.default_rng(3)
    W = np.where(rng.random((6, 4)) < 0.5, -1.0, 1.0) * 1e200
    spec = ModelSpec(layers=[(W, np.zeros(4))], mean=np.zeros(6), scale=np.ones(6), classes=[],
                     feature_names=[f"obs{i}" for i in range(6)], head="continuous", activations=["identity"],
                     action_names=["a", "b", "c", "d"], action_offset=[0.5, -0.5, 0.0, 1.0], action_scale=1.0,
                     squash=False, check_X=rng.normal(0.0, 1.0, size=(16, 6)), trainer="random")
    return _save(spec, tmp_path_factory, "overflow.npz")


@pytest.fixture(autouse=True)
def _private_runtime_dir(monkeypatch):
    """Each test's own {runtime_dir} (a short path: an ipc socket's path has at most 107 bytes)."""
    d = tempfile.mkdtemp(prefix="t", dir=_RUNTIME_ROOT)
    monkeypatch.setenv("XDG_RUNTIME_DIR", d)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(autouse=True)
def _reap_nodes():
    """A failed test must not leave a SCHED_FIFO node spinning on the loop core: every node the test
    started (not those of module-scoped fixtures, started before it) is killed after it."""
    from control_node.bench.harness import NodeProcess
    since = len(NodeProcess.started)
    yield
    NodeProcess.reap(since)
