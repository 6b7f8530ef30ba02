"""control-node import: turn an exported policy (.onnx, TorchScript .pt) into a verified model file.

The verb is named ``import`` (a Python keyword), so its module is ``importer``; cli.py maps the two.
"""

DESCRIPTION = """\
Read an exported policy, recognise the MLP it holds and write a model file the node runs.

Recognised (docs/policies.md has the full list and every refusal):
  ONNX (opset 11+; rsl_rl / IsaacLab, SB3 OnnxableSB3Policy, tf2onnx / Brax): Sub/Div or Sub/Mul input
  normaliser; Gemm (transB 0 or 1, alpha, beta) or MatMul + Add; one activation per layer: Relu, Elu,
  Selu, LeakyRelu, Celu, Tanh, Sigmoid, Softplus, Sigmoid(x)*x = silu; heads: identity, Tanh (squash),
  Split/Slice of the mean half (Brax), Clip (action bounds); extra outputs (value, log_prob) are dropped.
  metadata_props: joint_names -> action names; default_joint_pos / action_scale -> offset / scale only
  with action_type=relative.
  TorchScript: nn.Sequential / rsl_rl MLP of Linear and activation modules; every other module's
  forward is read (normalisers by what they compute, clamps as clips, never by class name)
  (IsaacLab policy.pt, rsl-rl-lib policy.pt, legged_gym policy_1.pt).
Anything else (other operators, recurrent LSTM/GRU policies, NaN weights, ...) is refused whole with a
message naming the node or field; nothing is written. Broken or hostile files are refused the same way
(exit status 2, one line): no tensor larger than 256 MiB ([lifecycle] max_resident_mb) is allocated, and
external data shorter than its tensors is refused before it is read.

Before writing, the import is proved: the model's actions are compared with onnxruntime (1 thread) or
torch (1 thread) on --check-obs rows and 2000 random observations (float32: rtol 2e-4 x max(1, |a|)
per sample; float64: 1e-9), and the compiled kernel is checked against the numpy reference on them.

--weights f16|bf16|int8 stores the weight matrices narrower (observations, activations, state and sums stay in
the model dtype; int8: per-output-channel symmetric, float32 scales). The error against the float32 policy is
measured over the proof's observations and edge samples (max and p99 |action error|, and relative to each
action's range), written into the model file and shown by `policy status`; above --tolerance (default 1e-3 of
the action range for f16 / bf16, 1e-2 for int8) the import is refused naming the worst action and observation.
f32 (the default) keeps the model dtype: exact.

Deploy contract (issue 45): the policy's side of a legged recipe is read wherever the exporter wrote it and kept
in the model file (field deploy): mjlab's ONNX metadata_props (joint_names, joint_stiffness, joint_damping,
default_joint_pos, action_scale, observation_names, command_names) and unitree_rl_lab's deploy.yaml
(joint_ids_map, step_dt, stiffness, damping, default_joint_pos, the action's scale / offset / clip, the
observation terms with scale, clip and history_length). A node whose [legged] omits these values takes them
from the model; `control-node deploy-config MODEL` prints the node config it implies. What cannot be mapped
(e.g. a base_lin_vel term) is refused naming the key; --no-deploy-contract imports the weights alone."""


def register(sub):
    p = sub.add_parser("import", help="turn an exported policy (.onnx, TorchScript .pt) into a verified model file",
                       description=DESCRIPTION, formatter_class=_raw_formatter())
    p.add_argument("file", help="the exported policy: .onnx (external .data next to it), or .pt / .pth / .jit")
    p.add_argument("--out", help="model file to write (default: FILE with its suffix replaced by .npz)")
    p.add_argument("--obs-norm", metavar="FILE",
                   help="observation normalisation kept outside the graph: SB3 VecNormalize .pkl (read without SB3, "
                        "no pickled code runs) or .npz with mean, var [, epsilon=1e-8, clip_obs=10]")
    p.add_argument("--dtype", choices=["float32", "float64"],
                   help="compute dtype of the kernel (default: the graph's, float32 for torch exports)")
    p.add_argument("--check-obs", metavar="FILE.npy",
                   help="raw observations (n, n_features) the proof must include (e.g. logged from the robot)")
    p.add_argument("--n-random", type=int, default=2000, metavar="N",
                   help="random observations in the proof besides --check-obs (default: %(default)s)")
    p.add_argument("--deploy-yaml", metavar="FILE",
                   help="unitree_rl_lab's deploy.yaml of this policy (default: deploy.yaml or params/deploy.yaml "
                        "beside FILE or beside its folder, when there is one)")
    p.add_argument("--sdk-joints", metavar="NAMES",
                   help="comma-separated joint names in the robot SDK's motor order: they name deploy.yaml's "
                        "joints through its joint_ids_map (default: sdk_<motor index>)")
    p.add_argument("--no-deploy-contract", action="store_true",
                   help="do not read the deploy contract (mjlab metadata_props, deploy.yaml) into the model file")
    add_weights_args(p)
    return p


def add_weights_args(p):
    """--weights and --tolerance, shared by import and train."""
    p.add_argument("--weights", choices=["f32", "f16", "bf16", "int8"], default="f32",
                   help="weight storage: f32 = the model dtype, exact (default); f16 / bf16 halve the weight bytes, "
                        "int8 quarters them (per-output-channel scales); the measured error is kept in the file")
    p.add_argument("--tolerance", type=float, default=None, metavar="X",
                   help="largest accepted |action error| vs the float32 policy, as a fraction of the action's range "
                        "(default: 1e-3 for f16 / bf16, 1e-2 for int8)")


def _raw_formatter():
    import argparse
    return argparse.RawDescriptionHelpFormatter


def run(args):
    import os

    import numpy as np

    from control_node.config import defaults
    from control_node.errors import UserError
    from control_node.kernels import Policy, save_model
    from control_node.kernels.importers import describe, import_policy
    check_X = None
    if args.check_obs:
        try:
            check_X = np.load(args.check_obs, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise UserError(f"--check-obs {args.check_obs}: not a readable .npy array ({e}); save one with "
                            "np.save(path, X) for X shaped (n, n_features)") from None
    if args.n_random < 0:
        raise UserError(f"--n-random {args.n_random}: must be >= 0")
    if args.tolerance is not None and not args.tolerance > 0:
        raise UserError(f"--tolerance {args.tolerance}: must be > 0 (a fraction of the action's range, e.g. 1e-3)")
    if args.no_deploy_contract and (args.deploy_yaml or args.sdk_joints):
        raise UserError("--no-deploy-contract with --deploy-yaml / --sdk-joints: pass one or the other")
    if os.path.splitext(args.file)[1].lower() == ".onnx":
        try:        # a broken graph's refusal is one line: onnxruntime's own log lines would add to it
            import onnxruntime
            onnxruntime.set_default_logger_severity(4)
        except ImportError:
            pass
    # no tensor read from the file may be larger than the node's policy memory bound (max_resident_bytes)
    max_bytes = int(defaults()["lifecycle"]["max_resident_mb"] * (1 << 20))
    spec, proof = import_policy(args.file, obs_norm=args.obs_norm, dtype=args.dtype, check_X=check_X,
                                n_random=args.n_random, kernel=Policy, max_bytes=max_bytes, weights=args.weights,
                                tolerance=args.tolerance, contract=not args.no_deploy_contract,
                                deploy_yaml=args.deploy_yaml, sdk_joints=_names(args.sdk_joints))
    out = args.out or os.path.splitext(args.file)[0] + ".npz"
    if os.path.abspath(out) == os.path.abspath(args.file):
        raise UserError(f"--out {out} would overwrite the policy file; pass another path")
    print(describe(spec, proof))
    save_model(spec, out)
    print(f"wrote {out} (sha256 {spec.sha256[:16]}, {len(spec.check_X)} check observations, {spec.weights} weights)")
    return 0


def _names(text):
    """A comma-separated list of names (None for none)."""
    return None if text is None else [n.strip() for n in text.split(",") if n.strip()]
