"""Deploy contracts (issue 45, section 4; decision 5: the contract lives with the model, the robot in the config).

Real files, the real importer, real node processes: mjlab-style ONNX metadata_props (the shipped quadruped policy
and a small graph made here) and unitree_rl_lab's deploy.yaml read into the model file's ``deploy`` field; keys
that cannot be mapped refused naming the key; a file without a contract keeps its hash; the config
`control-node deploy-config` prints starts a node; a config holding only the robot's side gives the same plans
as a hand-written full recipe, and runs the contract's policy; a value both give differently is refused naming
both."""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

from support.nodeutil import Robot, load_run, start_node, write_node_config
from test_legged_cycle import frames
from control_node.bench.harness import run_cli
from control_node.deploy import with_contract
from control_node.errors import ConfigError
from control_node.kernels import ModelSpec, load_model, save_model
from control_node.kernels.importers import ImportRefused, import_policy
from control_node.kernels.importers.deploy_contract import read_yaml
from control_node.kernels.model_file import DEPLOY_RECIPE_KEYS, content_hash
from control_node.loop import legged as L

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

QUAD_ONNX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "train",
                         "quadruped_policy.onnx")
QUAD_JOINTS = [f"{leg}_{part}_joint" for leg in ("FL", "FR", "RL", "RR") for part in ("hip", "thigh", "calf")]
#: mjlab's velocity task: the command last; 4 joints (a small stand-in for a robot)
JOINTS = ["hip_l", "knee_l", "hip_r", "knee_r"]
MJLAB = {"run_path": "wandb/run/1", "joint_names": ",".join(JOINTS), "joint_stiffness": "20.000,25.000,20.000,25.000",
         "joint_damping": "0.500,0.600,0.500,0.600", "default_joint_pos": "0.100,-0.200,0.100,-0.200",
         "action_scale": "0.500", "command_names": "twist",
         "observation_names": "base_ang_vel,projected_gravity,joint_pos,joint_vel,actions,twist"}
N_IN = 3 + 3 + 4 + 4 + 4 + 3


def mlp_onnx(path, n_in, n_out, metadata=None, seed=0):
    """obs [1, n_in] -> Gemm -> Elu -> Gemm -> actions [1, n_out], as rsl_rl's exporter writes it."""
    rng = np.random.default_rng(seed)
    W0, W1 = rng.normal(0, 0.3, (16, n_in)).astype(np.float32), rng.normal(0, 0.3, (n_out, 16)).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in ((W0, "W0"), (np.zeros(16, np.float32), "b0"),
                                                         (W1, "W1"), (np.zeros(n_out, np.float32), "b1"))]
    nodes = [helper.make_node("Gemm", ["obs", "W0", "b0"], ["h0"], transB=1), helper.make_node("Elu", ["h0"], ["e0"]),
             helper.make_node("Gemm", ["e0", "W1", "b1"], ["actions"], transB=1)]
    g = helper.make_graph(nodes, "actor", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, [1, n_in])],
                          [helper.make_tensor_value_info("actions", TensorProto.FLOAT, [1, n_out])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)], producer_name="pytorch")
    m.ir_version = 7
    for k, v in (metadata or {}).items():
        e = m.metadata_props.add()
        e.key, e.value = k, v
    onnx.save(m, str(path))
    return str(path)


def imp(path, **kw):
    return import_policy(path, n_random=64, contract=True, **kw)[0]


# unitree_rl_lab's deploy.yaml (utils/export_deploy_cfg.py, yaml.dump(default_flow_style=None)): SDK order
# R, L (motors 0-1 right leg, 2-3 left), the policy's (articulation) order L, R: joint_ids_map [2, 3, 0, 1]
DEPLOY_YAML = """\
joint_ids_map: [2, 3, 0, 1]
step_dt: 0.02
stiffness: [30.0, 35.0, 20.0,
  25.0]
damping: [0.7, 0.8, 0.5, 0.6]
default_joint_pos: [0.1, -0.2, 0.1, -0.2]
commands:
  base_velocity:
    ranges:
      lin_vel_x: [-0.5, 1.0]
      heading: null
actions:
  JointPositionAction:
    clip:
    - [-1.0, 1.0]
    - [-2.0, 0.5]
    - [-1.0, 1.0]
    - [-2.0, 0.5]
    joint_names: [.*]
    scale: [0.25, 0.25, 0.25, 0.25]
    offset: [0.1, -0.2, 0.1, -0.2]
    joint_ids: null
observations:
  base_ang_vel:
    params: {}
    clip: null
    scale: [0.2, 0.2, 0.2]
    history_length: 2
  projected_gravity:
    params: {}
    clip: null
    scale: [1.0, 1.0, 1.0]
    history_length: 2
  velocity_commands:
    params: {command_name: base_velocity}
    clip: [-1.0, 1.0]
    scale: [1.0, 1.0, 1.0]
    history_length: 2
  joint_pos_rel:
    params: {}
    clip: null
    scale: [1.0, 1.0, 1.0, 1.0]
    history_length: 2
  joint_vel_rel:
    params: {}
    clip: null
    scale: [0.05, 0.05, 0.05, 0.05]
    history_length: 2
  last_action:
    params: {}
    clip: null
    scale: [1.0, 1.0, 1.0, 1.0]
    history_length: 2
  gait_phase:
    params: {period: 0.6}
    clip: null
    scale: [1.0, 1.0]
    history_length: 1
"""
N_IN_YAML = (3 + 3 + 3 + 4 + 4 + 4) * 2 + 2


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The shipped quadruped and the small mjlab graph, imported with their contracts (model files)."""
    d = tmp_path_factory.mktemp("contract")
    quad = imp(QUAD_ONNX)
    save_model(quad, d / "quad.npz")
    small = imp(mlp_onnx(d / "mjlab.onnx", N_IN, 4, MJLAB))
    save_model(small, d / "mjlab.npz")
    return {"quad": str(d / "quad.npz"), "mjlab": str(d / "mjlab.npz"), "dir": d}


def test_the_contract_keys_are_recipe_keys():
    for k, subs in DEPLOY_RECIPE_KEYS.items():
        assert k in L.TOP_KEYS
        allowed = {"joints": {"policy", "robot", "actuators"}, "observation": L.OBS_KEYS, "action": L.ACTION_KEYS,
                   "actuator": L.ACTUATOR_KEYS}.get(k, set())
        assert set(subs or ()) <= allowed, k


def test_mjlab_metadata_props_are_read_into_the_model_file(models):
    spec = load_model(models["mjlab"])
    r = spec.deploy["recipe"]
    assert r["joints"]["policy"] == JOINTS and r["default_pos"] == [0.1, -0.2, 0.1, -0.2]
    assert r["actuator"] == {"kp": [20.0, 25.0, 20.0, 25.0], "kd": [0.5, 0.6, 0.5, 0.6]}
    assert r["action"] == {"scale": [0.5] * 4} and "policy_dt" not in r
    assert [t["kind"] for t in r["observation"]["terms"]] == ["gyro", "projected_gravity", "joint_pos_rel",
                                                              "joint_vel", "last_action", "command"]
    assert r["observation"]["n_commands"] == 3       # what the other terms leave of the 21 inputs
    assert spec.deploy["from"]["keys"]["actuator.kp"] == "metadata_props 'joint_stiffness'"
    q = load_model(models["quad"]).deploy
    assert q["recipe"]["policy_dt"] == 0.02 and q["recipe"]["joints"]["policy"] == QUAD_JOINTS
    assert q["recipe"]["observation"]["terms"][-1] == {"kind": "gait_clock", "name": "gait_phase", "period": 0.5,
                                                       "form": "sin_cos"}
    assert q["info"]["quat_order"] == "wxyz" and len(q["info"]["effort_limit"]) == 12


def test_unitree_deploy_yaml_is_read_into_the_model_file(tmp_path):
    (tmp_path / "exported").mkdir()
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "deploy.yaml").write_text(DEPLOY_YAML)
    path = mlp_onnx(tmp_path / "exported" / "policy.onnx", N_IN_YAML, 4)
    spec = imp(path)                                   # found at ../params/deploy.yaml, as unitree_rl_lab lays out
    save_model(spec, tmp_path / "u.npz")
    r = load_model(tmp_path / "u.npz").deploy["recipe"]
    assert r["joints"]["policy"] == ["sdk_2", "sdk_3", "sdk_0", "sdk_1"]
    assert r["actuator"]["kp"] == [20.0, 25.0, 30.0, 35.0] and r["actuator"]["kd"] == [0.5, 0.6, 0.7, 0.8]
    assert r["actuator"]["q_lo"] == [-1.0, -2.0, -1.0, -2.0] and r["action"]["clip_to_limits"] is True
    assert r["policy_dt"] == 0.02 and r["action"]["scale"] == [0.25] * 4
    terms = r["observation"]["terms"]
    assert [(t["kind"], t.get("history", 1)) for t in terms] == [
        ("gyro", 2), ("projected_gravity", 2), ("command", 2), ("joint_pos_rel", 2), ("joint_vel", 2),
        ("last_action", 2), ("gait_clock", 1)]
    assert terms[0]["scale"] == 0.2 and terms[2]["clip"] == [-1.0, 1.0] and terms[-1]["period"] == 0.6
    named = imp(path, sdk_joints=["R_hip", "R_knee", "L_hip", "L_knee"])
    assert named.deploy["recipe"]["joints"]["policy"] == ["L_hip", "L_knee", "R_hip", "R_knee"]
    # the robot side in motor order builds: the plans take the contract's joints by name
    recipe = with_contract({"joints": {"robot": ["sdk_0", "sdk_1", "sdk_2", "sdk_3"]},
                            "observation": {"quat_order": "wxyz"}, "actuator": {"tau_max": 30.0}}, spec.deploy)
    op, ap = L.build_plans(recipe, N_IN_YAML, 4)
    assert ap.sens_map.tolist() == [2, 3, 0, 1] and ap.clip_target
    yaml = pytest.importorskip("yaml")
    assert read_yaml(DEPLOY_YAML) == yaml.safe_load(DEPLOY_YAML)


@pytest.mark.parametrize("edit,key", [
    (lambda y: y.replace("  gait_phase:", "  base_lin_vel:\n    params: {}\n    clip: null\n    scale: [1.0, 1.0]\n"
                         "    history_length: 1\n  gait_phase:"), "observations.base_lin_vel"),
    (lambda y: y.replace("params: {period: 0.6}", "params: {period: 0.6, command_name: x}"),
     "observations.gait_phase.params.command_name"),
    (lambda y: y.replace("offset: [0.1, -0.2, 0.1, -0.2]", "offset: [0.0, 0.0, 0.0, 0.0]"),
     "actions.JointPositionAction.offset"),
    (lambda y: y + "sdk_joint_ids_map: [0, 1]\n", "sdk_joint_ids_map"),
    (lambda y: y.replace("joint_ids: null", "joint_ids: [0, 1]"), "actions.JointPositionAction.joint_ids"),
    (lambda y: y.replace("step_dt: 0.02", "step_dt: &a 0.02"), "line 2"),
])
def test_deploy_yaml_keys_that_cannot_be_mapped_are_refused_naming_the_key(tmp_path, edit, key):
    (tmp_path / "deploy.yaml").write_text(edit(DEPLOY_YAML))
    path = mlp_onnx(tmp_path / "policy.onnx", N_IN_YAML, 4)
    with pytest.raises(ImportRefused) as e:
        imp(path)
    assert key in str(e.value) and "Fix:" in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_an_unmappable_metadata_key_is_refused_by_the_cli_and_nothing_is_written(tmp_path):
    meta = {**MJLAB, "observation_names": "base_lin_vel,base_ang_vel,projected_gravity,joint_pos,joint_vel,actions"}
    path = mlp_onnx(tmp_path / "lin.onnx", N_IN, 4, meta)
    p = run_cli("import", path, "--out", tmp_path / "lin.npz", "--n-random", "16")
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1, p.stdout + p.stderr
    assert "metadata_props 'observation_names'" in lines[0] and "base_lin_vel" in lines[0] and "Fix:" in lines[0]
    assert not os.path.exists(tmp_path / "lin.npz")
    with pytest.raises(ImportRefused, match="metadata_props 'joint_stiffness'"):
        imp(mlp_onnx(tmp_path / "k.onnx", N_IN, 4, {**MJLAB, "joint_stiffness": "20,20"}))
    with pytest.raises(ImportRefused, match="metadata_props 'observation_names'.*terms add up to 21 inputs.*the model takes 20"):
        imp(mlp_onnx(tmp_path / "w.onnx", N_IN - 1, 4, {**MJLAB, "observation_dims": "3,3,4,4,4,3"}))


def test_a_file_without_a_contract_keeps_its_hash(models):
    """A spec without ``deploy`` hashes as before the field existed (the hash below is the previous build's,
    kernels/model_file.py at ceaddc7~1); a contract changes the hash (it changes what the robot does)."""
    W0 = (np.arange(21 * 8).reshape(21, 8) % 7 - 3) / 10.0
    W1 = (np.arange(8 * 4).reshape(8, 4) % 5 - 2) / 10.0
    spec = ModelSpec(layers=[(W0, np.zeros(8)), (W1, np.full(4, 0.1))], mean=0.0, scale=1.0, classes=[],
                     feature_names=[f"o{i}" for i in range(21)], dtype="float32", activations=["elu", "identity"],
                     head="continuous", action_names=["a", "b", "c", "d"])
    assert spec.sha256 == "720e40f5ef736511723126f92c2145be2588880ab3e9bd40f2b483600a3dac78"
    withc = load_model(models["mjlab"])
    bare = dataclasses.replace(withc, deploy=None, sha256="")
    assert bare.sha256 != withc.sha256 and content_hash(withc) == withc.sha256
    save_model(bare, models["dir"] / "bare.npz")
    assert load_model(models["dir"] / "bare.npz").deploy is None
    assert import_policy(models["dir"] / "mjlab.onnx", n_random=64)[0].sha256 == bare.sha256   # contract=False
    # an edited contract is refused by the hash
    import zipfile
    src, dst = models["mjlab"], models["dir"] / "edited.npz"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item)
            if item.filename == "deploy.npy":
                data = data.replace("20.0".encode("utf-32-le"), "40.0".encode("utf-32-le"))
            zout.writestr(item, data)
    with pytest.raises(Exception, match="sha256"):
        load_model(dst)


@pytest.mark.parametrize("which", ["quad", "mjlab"])
def test_the_printed_config_starts_a_node(tmp_path, models, which):
    p = run_cli("deploy-config", models[which], "--output", "impedance" if which == "mjlab" else "torque")
    assert p.returncode == 0, p.stderr
    assert "# CHECK" in p.stdout and "contract <- metadata_props 'joint_stiffness'" in p.stdout
    cfg = tmp_path / "node.toml"
    write_node_config(str(cfg), str(tmp_path), p.stdout)
    r = run_cli("run", "--config", cfg, "--model", models[which], "--duration", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    runs = os.listdir(tmp_path / "runs")
    summary, _ = load_run(os.path.join(tmp_path, "runs", runs[0]))
    spec = load_model(models[which])
    assert summary["legged"]["joints"]["policy"] == spec.deploy["recipe"]["joints"]["policy"]


def _robot_side():
    """The quadruped's robot side only: sensor order FL, FR, RL, RR as MuJoCo's qpos, actuators FR, FL, RR, RL."""
    acts = [f"{leg}_{p}_joint" for leg in ("FR", "FL", "RR", "RL") for p in ("hip", "thigh", "calf")]
    return {"joints": {"robot": QUAD_JOINTS, "actuators": acts}, "observation": {"quat_order": "wxyz"},
            "actuator": {"tau_max": [23.7, 23.7, 45.0] * 4}, "modes": {"stand_time": 0.05}}


def test_contract_plus_robot_side_equals_the_hand_written_recipe(models):
    spec = load_model(models["quad"])
    full = {**_robot_side(),
            "default_pos": [0.0, 0.8, -1.6] * 4, "policy_dt": 0.02,
            "observation": {"quat_order": "wxyz", "n_commands": 3, "terms": [
                {"kind": "base_ang_vel"}, {"kind": "projected_gravity"}, {"kind": "velocity_commands"},
                {"kind": "joint_pos_rel"}, {"kind": "joint_vel"}, {"kind": "actions"},
                {"kind": "gait_clock", "period": 0.5, "form": "sin_cos"}]},
            "action": {"scale": 0.25},
            "actuator": {"kp": 50.0, "kd": 1.5, "tau_max": [23.7, 23.7, 45.0] * 4}}
    full["joints"] = {**full["joints"], "policy": QUAD_JOINTS}
    a = L.build_plans(full, 47, 12)
    b = L.build_plans(with_contract(_robot_side(), spec.deploy, "test", 47, 12), 47, 12)
    for pa, pb in zip(a, b):
        for f in dataclasses.fields(pa):
            x, y = getattr(pa, f.name), getattr(pb, f.name)
            if f.name == "specs":
                x, y = [{k: v for k, v in s.items() if k != "name"} for s in x], \
                    [{k: v for k, v in s.items() if k != "name"} for s in y]
            if isinstance(x, np.ndarray):
                np.testing.assert_array_equal(x, y, err_msg=f.name)
            else:
                assert x == y, f.name
    # the same values given twice agree; a different one is refused naming both
    with_contract(full, spec.deploy, "test", 47, 12)
    for edit, key in ((lambda r: r["actuator"].update(kd=2.0), "legged.actuator.kd"),
                      (lambda r: r["observation"]["terms"].pop(0), "legged.observation.terms"),
                      (lambda r: r.update(default_pos=0.0), "legged.default_pos")):
        r = json.loads(json.dumps(full))
        edit(r)
        with pytest.raises(ConfigError) as e:
            with_contract(r, spec.deploy, "test", 47, 12)
        assert e.value.field == key and "deploy contract" in str(e.value), str(e.value)


def _legged_toml(d, prefix="legged"):
    out = []
    scal = {k: v for k, v in d.items() if not isinstance(v, dict)}
    if scal or prefix == "legged":
        out.append(f"[{prefix}]")
        out += [f"{k} = {json.dumps(v)}" for k, v in scal.items()]
    for k, v in d.items():
        if isinstance(v, dict):
            out += _legged_toml(v, f"{prefix}.{k}")
    return out


LOOP = "[loop]\nrate_hz = 1000.0\npolicy_rate_hz = 50.0\n[watchdog]\nstale_after_ms = 1000.0\n"


def test_a_node_with_only_the_robot_side_runs_the_contracts_policy(tmp_path, models):
    side = _robot_side()
    side["modes"].update(policy_without_stand=True)
    extra = LOOP + "\n".join(_legged_toml({**side, "sequence": [[0.0, "policy"]]})) + "\n"
    node, cfg = start_node(tmp_path, models["quad"], extra=extra)
    spec = load_model(models["quad"])
    op, _ = L.build_plans(with_contract(_robot_side(), spec.deploy, "t", 47, 12), 47, 12)
    fr = frames(op, 40, seed=3, q0_robot=np.array([0.0, 0.8, -1.6] * 4))
    robot = Robot(node.endpoints)
    try:
        robot.connect(fr[0])
        for k in range(1, 40):
            robot.wait_answer(robot.send(fr[k]), timeout=5.0)
    finally:
        robot.close()
        rc, out, err, run_dir = node.stop()
    assert rc == 0, err
    summary, _ = load_run(run_dir)
    lg = summary["legged"]
    assert [(t["to"], t["reason"]) for t in lg["transitions"]] == [("policy", "request")]
    assert lg["joints"]["policy"] == QUAD_JOINTS and lg["joints"]["actuators"] == side["joints"]["actuators"]
    assert lg["cycles_by_mode"]["policy"] > 0 and summary["policy_rate"]["inference_ticks"] > 0


def test_a_conflict_between_config_and_contract_is_refused_naming_both(tmp_path, models):
    side = _robot_side()
    side["actuator"]["kp"] = 40.0
    cfg = tmp_path / "node.toml"
    write_node_config(str(cfg), str(tmp_path), LOOP + "\n".join(_legged_toml(side)) + "\n")
    p = run_cli("run", "--config", cfg, "--model", models["quad"], "--duration", "1")
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1, p.stdout + p.stderr
    assert "field 'legged.actuator.kp'" in lines[0] and "metadata_props 'joint_stiffness'" in lines[0]
    assert "Fix:" in lines[0] and not os.path.exists(tmp_path / "runs")
    # the contract's policy_dt against the node's policy rate
    write_node_config(str(cfg), str(tmp_path), LOOP.replace("50.0", "100.0") + "\n".join(_legged_toml(
        _robot_side())) + "\n")
    p = run_cli("run", "--config", cfg, "--model", models["quad"], "--duration", "1")
    assert p.returncode == 2 and "loop.policy_rate_hz" in p.stderr and "policy_dt = 0.02" in p.stderr, p.stderr
