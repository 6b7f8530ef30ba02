"""`control-node train` end to end (subprocess), and the training helpers it uses."""
from __future__ import annotations

import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

from control_node.kernels import Policy, load_model


def run_cli(*args, cwd=None):
    proc = subprocess.run([sys.executable, "-m", "control_node", *map(str, args)],
                          capture_output=True, text=True, timeout=120, cwd=cwd)
    return proc


def train_ok(tmp_path, *args, name="m.npz"):
    out = tmp_path / name
    proc = run_cli("train", "--out", out, *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert out.exists()
    return out, proc.stdout


def accuracies(stdout):
    m = re.search(r"train accuracy ([0-9.]+)\s+test accuracy ([0-9.]+)", stdout)
    assert m, stdout
    return float(m.group(1)), float(m.group(2))


@pytest.mark.parametrize("args, sizes, dtype, trainer", [
    ((), [4, 16, 3], "float64", "numpy"),
    (("--dtype", "f32"), [4, 16, 3], "float32", "numpy"),
    (("--hidden", 16, 16, 16), [4, 16, 16, 16, 3], "float64", "numpy"),
    (("--trainer", "sklearn"), [4, 16, 3], "float64", "sklearn"),
], ids=["default", "f32", "hidden-16x3", "sklearn"])
def test_train_cli(tmp_path, args, sizes, dtype, trainer):
    out, stdout = train_ok(tmp_path, *args)
    train_acc, test_acc = accuracies(stdout)
    assert test_acc >= 0.93, stdout
    assert train_acc >= 0.9, stdout
    assert "kernel matches numpy reference" in stdout
    sha = re.search(r"sha256 ([0-9a-f]{16})", stdout).group(1)
    policy = Policy.load(out)
    assert policy.sha256.startswith(sha)
    assert policy.dtype == dtype and policy.spec.layer_sizes == sizes and policy.spec.trainer == trainer
    assert policy.classes == ["setosa", "versicolor", "virginica"]
    assert policy.spec.test_accuracy == pytest.approx(test_acc, abs=1e-4)
    # the file answers like the recorded accuracy says
    from control_node.train.iris import load_iris_split
    _, Xte, _, yte, _, _ = load_iris_split()
    assert (policy.predict_batch(Xte) == yte).mean() == pytest.approx(test_acc, abs=1e-4)


def test_train_is_deterministic(tmp_path):
    a, out_a = train_ok(tmp_path, "--seed", 3, name="a.npz")
    b, out_b = train_ok(tmp_path, "--seed", 3, name="b.npz")
    assert load_model(a).sha256 == load_model(b).sha256
    assert out_a.replace("a.npz", "") == out_b.replace("b.npz", "")
    c, _ = train_ok(tmp_path, "--seed", 4, name="c.npz")
    assert load_model(c).sha256 != load_model(a).sha256


def test_train_default_out_is_models_dir(tmp_path):
    proc = run_cli("train", "--epochs", 50, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "models" / "iris.npz").exists()


def test_from_sklearn(tmp_path):
    import joblib
    from sklearn.datasets import load_iris
    from sklearn.neural_network import MLPClassifier
    data = load_iris()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = MLPClassifier(hidden_layer_sizes=(10,), max_iter=2000, random_state=0).fit(data.data, data.target)
    pkl = tmp_path / "clf.joblib"
    joblib.dump(clf, pkl)
    out, stdout = train_ok(tmp_path, "--from-sklearn", pkl)
    assert "imported MLPClassifier" in stdout and "[4, 10, 3]" in stdout
    acc = float(re.search(r"accuracy on all of iris ([0-9.]+)", stdout).group(1))
    assert acc == pytest.approx(clf.score(data.data, data.target), abs=1e-4)
    policy = Policy.load(out)
    assert (policy.predict_batch(data.data) == clf.predict(data.data)).all()
    assert policy.spec.trainer == "sklearn"


def test_from_sklearn_rejects_other_activation(tmp_path):
    import joblib
    from sklearn.datasets import load_iris
    from sklearn.neural_network import MLPClassifier
    data = load_iris()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = MLPClassifier(hidden_layer_sizes=(4,), activation="tanh", max_iter=50,
                            random_state=0).fit(data.data, data.target)
    pkl = tmp_path / "clf.joblib"
    joblib.dump(clf, pkl)
    proc = run_cli("train", "--out", tmp_path / "m.npz", "--from-sklearn", pkl, cwd=tmp_path)
    assert proc.returncode != 0
    assert "relu" in proc.stderr
    assert not (tmp_path / "m.npz").exists()


def test_numpy_trainer_is_bit_deterministic():
    from control_node.train.iris import load_iris_split
    from control_node.train.numpy_mlp import train_mlp
    Xtr, _, ytr, _, _, _ = load_iris_split()
    Xn = (Xtr - Xtr.mean(0)) / Xtr.std(0)
    a = train_mlp(Xn, ytr, hidden=(8,), epochs=20, seed=1)
    b = train_mlp(Xn, ytr, hidden=(8,), epochs=20, seed=1)
    for (Wa, ba), (Wb, bb) in zip(a, b):
        assert np.array_equal(Wa, Wb) and np.array_equal(ba, bb)
