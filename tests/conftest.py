"""Shared fixtures. Keep this small: helpers used by more than one test module only."""
from __future__ import annotations

import numpy as np
import pytest


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


@pytest.fixture(scope="session")
def iris_spec():
    """The default iris policy (4 -> 16 -> 3, float64, seed 0), trained once per session."""
    from control_node.train.iris import train_iris
    return train_iris()


@pytest.fixture(scope="session")
def iris_model_path(iris_spec, tmp_path_factory):
    """A verified model file for :func:`iris_spec`."""
    from control_node.train.iris import export_verified
    path = tmp_path_factory.mktemp("models") / "iris.npz"
    export_verified(iris_spec, path)
    return path


@pytest.fixture(scope="session")
def policy(iris_model_path):
    """The compiled policy for :func:`iris_model_path`."""
    from control_node.kernels import Policy
    return Policy.load(iris_model_path)


@pytest.fixture(autouse=True)
def _reap_nodes():
    """A failed test must not leave a SCHED_FIFO node spinning on the loop core: every node the test
    started (not those of module-scoped fixtures, started before it) is killed after it."""
    from control_node.bench.harness import NodeProcess
    since = len(NodeProcess.started)
    yield
    NodeProcess.reap(since)
