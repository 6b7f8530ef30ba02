"""control-node train: train a policy (iris classifier, or the continuous pendulum controller) and export a
verified model file."""


def register(sub):
    t = sub.add_parser("train", help="train a policy (iris, or the pendulum controller) and export a verified model file",
                       description="Train a policy with plain numpy, check that the compiled kernel gives the same "
                                   "answers, and write a model file. --task iris: an MLP classifier on iris (shipped "
                                   "with scikit-learn), argmax head. --task pendulum: a continuous torque policy "
                                   "(3 -> 64 -> 64 -> 1 tanh, tanh-squashed, 2 N m) imitating an energy swing-up + "
                                   "LQR controller with DAgger, in seconds; for `control-node sim pendulum`. "
                                   "--task pendulum --recurrent gru: the same with a GRU (3 -> 32) before "
                                   "32 -> 1, trained through time at 50 Hz; run it with [loop] policy_rate_hz = 50 "
                                   "(configs/pendulum_gru.toml).")
    t.add_argument("--task", choices=["iris", "pendulum"], default="iris", help="what to train (default: %(default)s)")
    t.add_argument("--out", default=None,
                   help="model file to write (default: models/TASK.npz; models/pendulum-gru.npz with --recurrent gru)")
    t.add_argument("--recurrent", choices=["gru"], default=None,
                   help="pendulum only: a recurrent policy (GRU before the dense layers, 50 Hz steps)")
    t.add_argument("--hidden", type=int, nargs="+", default=None, metavar="N",
                   help="hidden layer widths, e.g. --hidden 32 32 (default: 16 for iris, 64 64 for pendulum; "
                        "with --recurrent: the GRU's size, default 32)")
    t.add_argument("--dtype", choices=["f64", "f32"], default=None,
                   help="compute dtype of the kernel (default: f64 for iris, f32 for pendulum)")
    t.add_argument("--seed", type=int, default=0, help="seed for split, init and batches (default: %(default)s)")
    t.add_argument("--epochs", type=int, default=400, help="training epochs (default: %(default)s)")
    t.add_argument("--trainer", choices=["numpy", "sklearn"], default="numpy",
                   help="numpy reference loop, or scikit-learn's MLPClassifier (default: %(default)s)")
    t.add_argument("--from-sklearn", metavar="FILE",
                   help="export an existing fitted MLPClassifier (joblib/pickle file) instead of training; "
                        "it must take raw iris-shaped inputs (4 features)")
    from control_node.verbs.importer import add_weights_args
    add_weights_args(t)
    return t


def run(args):
    if args.recurrent and args.task != "pendulum":
        from control_node.errors import UserError
        raise UserError(f"--recurrent is for --task pendulum (got --task {args.task})")
    out = args.out or ("models/pendulum-gru.npz" if args.recurrent else f"models/{args.task}.npz")
    if args.task == "pendulum":
        return _pendulum_gru(args, out) if args.recurrent else _pendulum(args, out)
    import joblib

    from control_node.kernels.reference import reference_predict
    from control_node.train.iris import export_verified, spec_from_sklearn, train_iris
    dtype = {"f64": "float64", "f32": "float32"}[args.dtype or "f64"]
    args.hidden = args.hidden or [16]
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
    return _export(export_verified, spec, out, args)


def _export(export_verified, spec, out, args):
    """Prove the kernel, store the weights as --weights asks (error measured), write the model file."""
    from control_node.errors import UserError
    from control_node.kernels.weights import WeightStorageError, describe
    try:
        report = export_verified(spec, out, weights=args.weights, tolerance=args.tolerance)
    except WeightStorageError as e:
        raise UserError(f"--weights {args.weights}: {e}") from None
    spec = report["spec"]
    print(f"kernel matches numpy reference on {report['checked']} samples (rtol {report['rtol']:g})")
    print(f"weights {describe(spec.weights_error)}")
    print(f"wrote {out} (sha256 {spec.sha256[:16]})")
    return 0


def _pendulum(args, out):
    from control_node.train.pendulum import evaluate, train_pendulum
    if args.from_sklearn:
        from control_node.errors import UserError
        raise UserError("--from-sklearn is for --task iris")
    dtype = {"f64": "float64", "f32": "float32"}[args.dtype or "f32"]
    spec = train_pendulum(hidden=tuple(args.hidden or (64, 64)), dtype=dtype, seed=args.seed,
                          log=lambda m: print(m, flush=True))
    print(f"trained pendulum policy {' -> '.join(map(str, spec.layer_sizes))} ({spec.dtype}, seed {args.seed})")
    return _scored_export(spec, evaluate(spec), "50 Hz policy", out, args)


def _scored_export(spec, scores, how, out, args):
    """Print the offline scores from the four starts, prove the kernel, write the model file."""
    from control_node.train.pendulum import export_verified
    for th0, sc in zip(("pi (hanging)", "2.0", "-2.5", "0.3"), scores):
        print(f"offline, {how}, start {th0}: {sc.line()}")
    return _export(export_verified, spec, out, args)


def _pendulum_gru(args, out):
    import time

    from rich.progress import Progress

    from control_node.errors import UserError
    from control_node.train.pendulum_gru import evaluate, train_pendulum_gru
    if args.from_sklearn:
        raise UserError("--from-sklearn is for --task iris")
    if args.hidden and len(args.hidden) != 1:
        raise UserError(f"--hidden {' '.join(map(str, args.hidden))}: with --recurrent give one size, the GRU's "
                        "(e.g. --hidden 32)")
    dtype = {"f64": "float64", "f32": "float32"}[args.dtype or "f32"]
    t0 = time.monotonic()
    with Progress(transient=True) as bar:
        task = bar.add_task("training the GRU (BPTT, DAgger)", total=4)
        spec = train_pendulum_gru(hidden=(args.hidden or [32])[0], dtype=dtype, seed=args.seed,
                                  log=lambda m: bar.console.print(m),
                                  progress=lambda i, n: bar.update(task, completed=i, total=n))
    print(f"trained recurrent pendulum policy GRU {' -> '.join(map(str, spec.layer_sizes))} ({spec.dtype}, seed "
          f"{args.seed}) in {time.monotonic() - t0:.1f} s; run it at 50 Hz ([loop] policy_rate_hz = 50)")
    return _scored_export(spec, evaluate(spec), "compiled kernel at 50 Hz, state carried", out, args)
