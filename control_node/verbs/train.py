"""control-node train: train the iris policy (or import an MLPClassifier) and export a verified model file."""


def register(sub):
    t = sub.add_parser("train", help="train the iris policy (or import an MLPClassifier) and export a verified model file",
                       description="Train an MLP on iris (shipped with scikit-learn) with the plain numpy reference "
                                   "loop, check that the compiled kernel gives the same answers, and write a model file.")
    t.add_argument("--out", default="models/iris.npz", help="model file to write (default: %(default)s)")
    t.add_argument("--hidden", type=int, nargs="+", default=[16], metavar="N",
                   help="hidden layer widths, e.g. --hidden 32 32 (default: 16)")
    t.add_argument("--dtype", choices=["f64", "f32"], default="f64",
                   help="compute dtype of the kernel (default: %(default)s)")
    t.add_argument("--seed", type=int, default=0, help="seed for split, init and batches (default: %(default)s)")
    t.add_argument("--epochs", type=int, default=400, help="training epochs (default: %(default)s)")
    t.add_argument("--trainer", choices=["numpy", "sklearn"], default="numpy",
                   help="numpy reference loop, or scikit-learn's MLPClassifier (default: %(default)s)")
    t.add_argument("--from-sklearn", metavar="FILE",
                   help="export an existing fitted MLPClassifier (joblib/pickle file) instead of training; "
                        "it must take raw iris-shaped inputs (4 features)")
    return t


def run(args):
    import joblib

    from control_node.kernels.reference import reference_predict
    from control_node.train.iris import export_verified, spec_from_sklearn, train_iris
    dtype = {"f64": "float64", "f32": "float32"}[args.dtype]
    if args.from_sklearn:
        from sklearn.datasets import load_iris
        data = load_iris()
        from control_node.errors import UserError
        try:
            clf = joblib.load(args.from_sklearn)
            spec = spec_from_sklearn(clf, check_X=data.data, dtype=dtype,
                                     feature_names=[str(f) for f in data.feature_names])
        except (OSError, ValueError, AttributeError, EOFError) as e:
            raise UserError(f"--from-sklearn {args.from_sklearn}: {e}") from None
        if len(spec.classes) == 3:
            spec.test_accuracy = float((reference_predict(spec, data.data) == data.target).mean())
        print(f"imported MLPClassifier from {args.from_sklearn}: layers {spec.layer_sizes}; "
              f"accuracy on all of iris {spec.test_accuracy:.4f}")
    else:
        spec = train_iris(hidden=args.hidden, dtype=dtype, seed=args.seed, trainer=args.trainer,
                          epochs=args.epochs)
        print(f"trained {spec.trainer} MLP {' -> '.join(map(str, spec.layer_sizes))} ({spec.dtype}, seed {args.seed})")
        print(f"train accuracy {spec.train_accuracy:.4f}   test accuracy {spec.test_accuracy:.4f}")
    report = export_verified(spec, args.out)
    print(f"kernel matches numpy reference on {report['checked']} samples (rtol {report['rtol']:g})")
    print(f"wrote {args.out} (sha256 {spec.sha256[:16]})")
    return 0
