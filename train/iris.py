"""Train the iris policy and export a verified model file.

``control-node train`` lands here. The data ships with the package (control_node.sim's iris.csv, scikit-learn's copy; no download).
"""
from __future__ import annotations

import os

import numpy as np

from control_node.kernels.model_file import ModelSpec, save_model
from control_node.kernels.reference import check_consistency, reference_predict
from control_node.train.numpy_mlp import train_mlp

DEFAULT_OUT = os.path.join("models", "iris.npz")


def load_iris_split(test_size=0.3, seed=0):
    """Stratified split of iris: ``(X_train, X_test, y_train, y_test, feature_names, class_names)``."""
    from sklearn.model_selection import train_test_split
    from control_node.sim.streams import iris_data
    data = iris_data()
    Xtr, Xte, ytr, yte = train_test_split(data.X, data.y.astype(np.int64), test_size=test_size,
                                          random_state=seed, stratify=data.y)
    return Xtr, Xte, ytr, yte, list(data.feature_names), list(data.class_names)


def train_iris(hidden=(16,), dtype="float64", seed=0, trainer="numpy", epochs=400):
    """Train on the iris train split; returns a verified-ready :class:`ModelSpec`."""
    Xtr, Xte, ytr, yte, features, classes = load_iris_split(seed=seed)
    mean = Xtr.mean(axis=0)
    scale = Xtr.std(axis=0)
    scale[scale == 0] = 1.0
    if trainer == "numpy":
        layers = train_mlp((Xtr - mean) / scale, ytr, hidden=tuple(hidden), n_classes=len(classes),
                           epochs=epochs, seed=seed)
    elif trainer == "sklearn":
        from sklearn.neural_network import MLPClassifier
        clf = MLPClassifier(hidden_layer_sizes=tuple(hidden), max_iter=2000, random_state=seed)
        clf.fit((Xtr - mean) / scale, ytr)
        layers = list(zip(clf.coefs_, clf.intercepts_))
    else:
        raise ValueError(f"trainer must be 'numpy' or 'sklearn', not {trainer!r}")
    spec = ModelSpec(layers=layers, mean=mean, scale=scale, classes=classes, feature_names=features,
                     dtype=dtype, check_X=np.vstack([Xtr, Xte]), trainer=trainer)
    spec.train_accuracy = float((reference_predict(spec, Xtr) == ytr).mean())
    spec.test_accuracy = float((reference_predict(spec, Xte) == yte).mean())
    return spec


def spec_from_sklearn(clf, check_X, feature_names=None, dtype="float64", mean=None, scale=None):
    """Wrap a fitted ``MLPClassifier`` (ReLU hidden layers) as a :class:`ModelSpec`.

    The classifier is assumed to take inputs normalised with ``mean``/``scale``
    (identity when not given). Class names come from ``clf.classes_``.
    """
    if getattr(clf, "activation", "relu") != "relu":
        raise ValueError(f"MLPClassifier activation is {clf.activation!r}; the kernel runs 'relu' only. "
                         "Refit with activation='relu'.")
    if getattr(clf, "out_activation_", "softmax") not in ("softmax", "logistic") or len(clf.classes_) < 2:
        raise ValueError("only multi-class (softmax) MLPClassifier models are supported")
    if len(clf.classes_) == 2:
        raise ValueError("binary MLPClassifier has a single logistic output; export needs >= 3 classes")
    d = clf.coefs_[0].shape[0]
    return ModelSpec(layers=list(zip(clf.coefs_, clf.intercepts_)),
                     mean=np.zeros(d) if mean is None else mean,
                     scale=np.ones(d) if scale is None else scale,
                     classes=[str(c) for c in clf.classes_],
                     feature_names=feature_names or [f"x{i}" for i in range(d)],
                     dtype=dtype, check_X=check_X, trainer="sklearn")


def export_verified(spec, out, weights="f32", tolerance=None):
    """Verify the compiled kernel against the reference, then write the file."""
    from control_node.kernels import Policy
    from control_node.kernels.importers.proof import store_weights
    # weights: f16 / bf16 / int8 storage, its error against float32 measured and kept (kernels/weights.py)
    spec = store_weights(spec, weights, tolerance=tolerance, policy_class=Policy, file=str(out))
    report = check_consistency(Policy(spec), spec)
    save_model(spec, out)
    report["spec"] = spec
    return report
