"""``control-node``: one command, ROS-style verbs.

Each verb's implementation is imported only when that verb runs, so ``--help``
and light verbs start fast.
"""
from __future__ import annotations

import argparse
import sys


def _cmd_train(args):
    import joblib
    import numpy as np

    from train.iris import export_verified, spec_from_sklearn, train_iris
    if args.from_sklearn:
        from sklearn.datasets import load_iris
        clf = joblib.load(args.from_sklearn)
        X = load_iris().data
        spec = spec_from_sklearn(clf, check_X=X, dtype=args.dtype)
        y = np.asarray(load_iris().target)
        from kernels.reference import reference_predict
        spec.train_accuracy = float("nan")
        spec.test_accuracy = float((reference_predict(spec, X) == y).mean()) if len(spec.classes) == 3 else float("nan")
        print(f"imported MLPClassifier from {args.from_sklearn}: layers {spec.layer_sizes}")
    else:
        spec = train_iris(hidden=args.hidden, dtype=args.dtype, seed=args.seed, trainer=args.trainer,
                          epochs=args.epochs)
        print(f"trained {spec.trainer} MLP {' -> '.join(map(str, spec.layer_sizes))} ({spec.dtype}, seed {args.seed})")
        print(f"train accuracy {spec.train_accuracy:.4f}   test accuracy {spec.test_accuracy:.4f}")
    report = export_verified(spec, args.out)
    print(f"kernel matches numpy reference on {report['checked']} samples (rtol {report['rtol']:g})")
    print(f"wrote {args.out} (sha256 {spec.sha256[:16]})")
    return 0


def _cmd_bench(args):
    if args.what == "kernel":
        from bench.kernel import main as bench_main
    else:
        raise SystemExit(f"unknown benchmark {args.what!r}")
    return bench_main(args.rest)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="control-node",
        description="Real-time control-loop node: a fixed-rate loop over ZeroMQ running a compiled MLP policy.",
        epilog="Run `control-node VERB --help` for each verb's options.")
    sub = p.add_subparsers(dest="verb", metavar="VERB", required=True)

    t = sub.add_parser("train", help="train the iris policy (or import an MLPClassifier) and export a verified model file",
                       description="Train an MLP on iris (shipped with scikit-learn) with the plain numpy reference "
                                   "loop, check that the compiled kernel gives the same answers, and write a model file.")
    t.add_argument("--out", default="models/iris.npz", help="model file to write (default: %(default)s)")
    t.add_argument("--hidden", type=int, nargs="+", default=[16], metavar="N",
                   help="hidden layer widths, e.g. --hidden 32 32 (default: 16)")
    t.add_argument("--dtype", choices=["f64", "f32", "float64", "float32"], default="f64",
                   help="compute dtype of the kernel (default: %(default)s)")
    t.add_argument("--seed", type=int, default=0, help="seed for split, init and batches (default: %(default)s)")
    t.add_argument("--epochs", type=int, default=400, help="training epochs (default: %(default)s)")
    t.add_argument("--trainer", choices=["numpy", "sklearn"], default="numpy",
                   help="numpy reference loop, or scikit-learn's MLPClassifier (default: %(default)s)")
    t.add_argument("--from-sklearn", metavar="FILE",
                   help="export an existing fitted MLPClassifier (joblib/pickle file) instead of training; "
                        "it must take raw iris-shaped inputs")
    t.set_defaults(func=_cmd_train)

    b = sub.add_parser("bench", help="benchmarks (kernel, ...): side by side against peers in one run",
                       description="Benchmarks. `control-node bench kernel --help` for options.")
    b.add_argument("what", choices=["kernel"], help="which benchmark")
    b.add_argument("rest", nargs=argparse.REMAINDER, help="options passed to the benchmark")
    b.set_defaults(func=_cmd_bench)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "dtype", None) in ("f64", "f32"):
        args.dtype = {"f64": "float64", "f32": "float32"}[args.dtype]
    from kernels import ConsistencyError, ModelFileError
    try:
        return args.func(args) or 0
    except (ModelFileError, ConsistencyError) as e:
        print(f"control-node {args.verb}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
