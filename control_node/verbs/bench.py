"""control-node bench WHAT: benchmarks that compare against peers side by side in one run.

Each benchmark is ``bench/<what>.py`` with ``main(argv) -> int``.
"""
import importlib

BENCHMARKS = {
    "kernel": "per-sample policy inference: kernel vs numpy, scikit-learn, onnxruntime, torch",
    "policy": "continuous robot policies (rsl_rl, G1, SB3 PPO, SAC): kernel vs onnxruntime, TorchScript, numpy",
    "recurrent": "recurrent policies (LSTM/GRU + MLP: rsl_rl LSTM 256, Unitree G1 LSTM 64): kernel vs onnxruntime, "
                 "TorchScript, state carried",
    "control": "pendulum control score against added delay and missed policy ticks (why jitter matters)",
    "loop": "1 kHz loop wake-up latency and round trip: node vs cyclictest vs a naive Python loop",
    "replay": "lockstep replay throughput through the node vs a bare pyzmq echo",
    "soak": "long run at 1 kHz with the simulator: RSS, file descriptors, misses",
    "switch": "1000 policy switches during a 1 kHz run vs none, side by side; the shadow policy's cost per shape",
    "bridge": "ROS 2 round trip through bridge ros2 + the node (sensor and timer clock) vs a plain rclpy echo node; "
              "bridge CPU, node misses with and without it",
    "isolation": "the launch demo with [realtime] isolate off and on, and cyclictest under the same load; why late",
    "legged": "the legged deploy path's cost: the recipe and the actuator in ns beside the kernel (12 and 29 "
              "joints), and the 1 kHz loop with and without it",
    "live": "the pendulum launch demo with the Foxglove live view and 0, 1, 4 viewers vs none: misses, cycle time "
            "p99, the live view's CPU",
}


def register(sub):
    b = sub.add_parser("bench", help="benchmarks, side by side against peers in one run",
                       description="Benchmarks. " + "; ".join(f"{k}: {v}" for k, v in BENCHMARKS.items())
                       + ". Pass --help after the name for its options.")
    b.add_argument("what", choices=sorted(BENCHMARKS), help="which benchmark")
    b.add_argument("rest", nargs="...", help="options for that benchmark (see `control-node bench WHAT --help`)")
    return b


def run(args):
    try:
        module = importlib.import_module(f"control_node.bench.{args.what}")
    except ModuleNotFoundError as e:
        if e.name == f"control_node.bench.{args.what}":
            raise SystemExit(f"control-node bench: '{args.what}' is not built yet")
        raise
    return module.main(args.rest)
