"""control-node launch: start the node, the simulator (or a replay) and optionally the recorder together."""


def register(sub):
    p = sub.add_parser("launch", help="start node + simulator (+ recorder) from a launch config, like ros2 launch",
                       description="Start the node, wait for its ready line, then the simulator (or a replay) and "
                                   "optionally the recorder, each in its own process group with prefixed logs. "
                                   "Stops everything after the duration or on Ctrl-C, reports a child that dies, "
                                   "and prints a jitter summary and the driver's score (accuracy, or the pendulum's "
                                   "control score). Trains the model if it is missing.")
    p.add_argument("config", nargs="?", default=None,
                   help="launch config, also the node's config: a file, or a packaged one by name: demo (the "
                        "default: iris classifier and the gauss stream), pendulum (a continuous policy "
                        "balancing the pendulum simulator) or quadruped (the walking policy made here on the "
                        "MuJoCo quadruped through the node's [legged] recipe; the mujoco extra)")
    p.add_argument("--print-config", action="store_true",
                   help="print the launch config (the packaged one named, default demo) and exit: copy it to "
                        "start your own")
    p.add_argument("--duration", type=float, help="seconds to run (default: [launch].duration, 10)")
    p.add_argument("--record", action="store_true", default=None, help="also start the recorder")
    p.add_argument("--run-dir", help="launch run directory (default: runs/<id>/)")
    p.add_argument("--foxglove", nargs="?", const="", default=None, metavar="HOST:PORT",
                   help="also serve the live view to Foxglove / Lichtblick over WebSocket (`control-node live`, "
                        "the foxglove extra): here, else at the config's [foxglove] listen, else 127.0.0.1:8765. "
                        "A config with [foxglove] listen turns it on without the flag (docs/live.md)")
    return p


def ensure_model(path, task="iris"):
    """Train the ``task``'s policy (iris or pendulum) into ``path`` if it is missing (a demo's first run)."""
    import os

    from control_node.errors import UserError
    from control_node.launch import say
    if os.path.exists(path):
        return
    if task not in ("iris", "pendulum", "pendulum-gru"):
        raise UserError(f"[launch] train = {task!r}: use \"iris\", \"pendulum\" or \"pendulum-gru\" (the model "
                        f"{path} is missing)")
    how = "--task pendulum --recurrent gru" if task == "pendulum-gru" else f"--task {task}"
    say(f"model {path} is missing: training it (control-node train {how})")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if task.startswith("pendulum"):
        from control_node.train import pendulum, pendulum_gru
        train, evaluate, what = ((pendulum_gru.train_pendulum_gru, pendulum_gru.evaluate, "GRU at 50 Hz")
                                 if task == "pendulum-gru" else (pendulum.train_pendulum, pendulum.evaluate, "MLP"))
        spec = train()
        pendulum.export_verified(spec, path)
        say(f"trained {what} {' -> '.join(map(str, spec.layer_sizes))}; offline from hanging: "
            f"{evaluate(spec)[0].line()}; wrote {path}")
        return
    from control_node.train.iris import export_verified, train_iris
    spec = train_iris()
    export_verified(spec, path)
    say(f"trained {' -> '.join(map(str, spec.layer_sizes))}, test accuracy {spec.test_accuracy:.4f}; wrote {path}")


PACKAGED = ("demo", "pendulum", "pendulum_gru", "pendulum_ros2", "quadruped", "quadruped_ros2")


def resolve_config(config):
    """A path as given; a packaged config's name (``demo``, ``pendulum``, with or without .toml) when no
    such file exists here; None for the packaged demo."""
    import os

    from control_node.endpoints import default_config
    if config is None:
        return default_config("demo.toml")
    name = config[:-5] if config.endswith(".toml") else config
    if not os.path.exists(config) and name in PACKAGED:
        return default_config(name + ".toml")
    return config


def run(args):
    from control_node.launch import launch
    config = resolve_config(args.config)
    if args.print_config:
        with open(config) as f:
            print(f.read(), end="")
        return 0
    from control_node.launch import foxglove_listen
    foxglove = foxglove_listen(config, args.foxglove)
    if foxglove is not None:
        from control_node.live.server import require_sdk
        require_sdk()
    return launch(config, duration=args.duration, record=args.record, run_dir=args.run_dir,
                  ensure_model=ensure_model, foxglove=foxglove)
