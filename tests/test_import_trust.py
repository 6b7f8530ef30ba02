"""TorchScript import trusts no class name (issue #21): every module, torch.nn's leaves included, is read from its
inlined forward graph; torch.jit.trace exports import like torch.jit.script ones; the proof's edge samples catch a
mapping that is wrong only where a clip or a saturation acts. All exports are made here with the installed torch."""
from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

from control_node.kernels.importers import ImportRefused, describe, import_policy

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::torch.jit.TracerWarning")


def _save(module, path, how="script", n_in=4):
    module = module.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if how == "script":
            m = torch.jit.script(module)
        else:
            with torch.no_grad():
                m = torch.jit.trace(module, torch.randn(1, n_in))
        m.save(str(path))
    return str(path)


def imp(path, **kw):
    from control_node.kernels import Policy
    kw.setdefault("n_random", 300)
    return import_policy(path, kernel=Policy, **kw)


def refused(path, *patterns, absent=(), **kw):
    with pytest.raises(ImportRefused) as e:
        imp(path, **kw)
    msg = str(e.value)
    for p in patterns:
        assert p in msg, msg
    for p in absent:
        assert p not in msg, msg
    return msg


def torch_act(module, X):
    with torch.no_grad():
        return module(torch.from_numpy(np.asarray(X)).float()).double().numpy()


def kernel_act(spec, X):
    from control_node.kernels import Policy
    pol = Policy(spec)
    return np.array([pol.act(x) for x in X])


class Normalizer(nn.Module):                  # rsl_rl's EmpiricalNormalization: buffers, eps, forward
    def __init__(self, n, clip=None):
        super().__init__()
        self.eps = 1e-2
        self.clip = clip
        self.register_buffer("_mean", torch.linspace(-1, 1, n)[None])
        self.register_buffer("_var", torch.linspace(0.2, 2, n)[None] ** 2)
        self.register_buffer("_std", torch.linspace(0.2, 2, n)[None])

    def forward(self, x):
        if self.training:                     # script: a prim::If on the saved `training` flag (False)
            x = x * 0.0
        z = (x - self._mean) / (self._std + self.eps)
        if self.clip is not None:
            z = torch.clamp(z, -self.clip, self.clip)
        return z


class Exporter(nn.Module):                    # IsaacLab's _TorchPolicyExporter: actor(normalizer(x)) [+ clamp]
    def __init__(self, actor, normalizer=None, clip_actions=None):
        super().__init__()
        self.normalizer = normalizer if normalizer is not None else nn.Identity()
        self.actor = actor
        self.clip_actions = clip_actions

    def forward(self, x):
        a = self.actor(self.normalizer(x))
        if self.clip_actions is not None:
            a = torch.clamp(a, -self.clip_actions, self.clip_actions)
        return a


def _mlp(n_in=4, hidden=(16, 16), n_out=2, act=nn.ELU):
    torch.manual_seed(0)
    layers, w = [], n_in
    for h in hidden:
        layers += [nn.Linear(w, h), act()]
        w = h
    return nn.Sequential(*layers, nn.Linear(w, n_out))


def _edges(n=4):
    mean, std = np.linspace(-1, 1, n), np.linspace(0.2, 2, n) + 1e-2
    return np.array([mean + k * std * e for k in (-50, -8, 8, 50) for e in np.eye(n)] +
                    [mean + k * std for k in (-50, 50)] + [mean])


# -- 1. dropout: the refusal names the aten op of the inlined function call ------------------------------------------
@pytest.mark.parametrize("how", ["script", "trace"])
def test_dropout_refusal_names_aten_dropout_not_the_call(tmp_path, how):
    m = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.ELU(), nn.Linear(8, 2))
    refused(_save(m, tmp_path / "dropout.pt", how), "node aten::dropout in submodule '1' (Dropout)", "p=0.1",
            "training=False", absent=("prim::CallFunction",))


# -- 2. torch.nn leaves are read from their graph, not recognised by class name -------------------------------------
class DoublingReLU(nn.ReLU):
    def forward(self, x):
        return x * 2.0


class SigmoidReLU(nn.ReLU):
    def forward(self, x):
        return torch.sigmoid(x)


class GeluReLU(nn.ReLU):
    def forward(self, x):
        return F.gelu(x)


class SwishReLU(nn.ReLU):
    def forward(self, x):
        return x * torch.sigmoid(x)


class HalfLinear(nn.Linear):
    def forward(self, x):
        return F.linear(x, self.weight * 0.5, self.bias)


class ShiftedLinear(nn.Linear):
    def forward(self, x):
        return F.linear(x, self.weight, self.bias) + 1.0


class SquaredLinear(nn.Linear):
    def forward(self, x):
        return F.linear(x, self.weight, self.bias) ** 2


class ELU03(nn.ELU):                          # keeps alpha=1.0 as its attribute, computes alpha=0.3
    def forward(self, x):
        return F.elu(x, alpha=0.3)


class Leaky03(nn.LeakyReLU):                  # negative_slope attribute 0.01, computes 0.3
    def forward(self, x):
        return F.leaky_relu(x, 0.3)


class SteepSoftplus(nn.Softplus):             # beta attribute 1, computes beta=2
    def forward(self, x):
        return F.softplus(x, beta=2.0)


@pytest.mark.parametrize("how", ["script", "trace"])
def test_overridden_relu_subclasses_are_refused_naming_the_op_or_imported_as_what_they_compute(tmp_path, how):
    def seq(act):
        torch.manual_seed(1)
        return nn.Sequential(nn.Linear(4, 8), act, nn.Linear(8, 2))
    refused(_save(seq(DoublingReLU()), tmp_path / "dbl.pt", how), "node aten::mul in submodule '1' (DoublingReLU)")
    refused(_save(seq(GeluReLU()), tmp_path / "gelu.pt", how), "node aten::gelu in submodule '1' (GeluReLU)")
    refused(_save(seq(SwishReLU()), tmp_path / "swish.pt", how), "aten::mul", "(SwishReLU)",
            "values computed from it")
    m = seq(SigmoidReLU())
    spec, proof = imp(_save(m, tmp_path / "sig.pt", how))
    assert spec.activations == ["sigmoid", "identity"] and proof["first_bad"] is None
    X = _edges()
    assert np.abs(kernel_act(spec, X) - torch_act(m, X)).max() < 1e-4


@pytest.mark.parametrize("how", ["script", "trace"])
def test_overridden_linear_subclasses_are_read_from_their_graph(tmp_path, how):
    torch.manual_seed(2)
    half = nn.Sequential(HalfLinear(4, 8), nn.ELU(), ShiftedLinear(8, 2))
    spec, proof = imp(_save(half, tmp_path / "half.pt", how))
    W0 = half[0].weight.detach().double().numpy().T
    assert np.allclose(spec.layers[0][0], 0.5 * W0, atol=1e-7)                  # the weight the graph uses
    assert np.allclose(spec.layers[1][1], half[2].bias.detach().double().numpy() + 1.0, atol=1e-6)
    X = _edges()
    assert np.abs(kernel_act(spec, X) - torch_act(half, X)).max() < 1e-4
    sq = nn.Sequential(nn.Linear(4, 8), nn.ELU(), SquaredLinear(8, 2))
    refused(_save(sq, tmp_path / "sq.pt", how), "node aten::pow in submodule '2' (SquaredLinear)")


@pytest.mark.parametrize("how", ["script", "trace"])
def test_activation_constants_come_from_the_graph_not_the_attributes(tmp_path, how):
    torch.manual_seed(3)
    m = nn.Sequential(nn.Linear(4, 8), ELU03(), nn.Linear(8, 8), Leaky03(), nn.Linear(8, 2))
    assert m[1].alpha == 1.0 and m[3].negative_slope == 0.01
    spec, _ = imp(_save(m, tmp_path / "alphas.pt", how))
    assert spec.activations[:2] == ["elu", "leaky_relu"]
    assert abs(spec.alphas[0] - 0.3) < 1e-12 and abs(spec.alphas[1] - 0.3) < 1e-12
    X = _edges()
    assert np.abs(kernel_act(spec, X) - torch_act(m, X)).max() < 1e-4
    sp = nn.Sequential(nn.Linear(4, 8), SteepSoftplus(), nn.Linear(8, 2))
    refused(_save(sp, tmp_path / "sp.pt", how), "aten::softplus", "beta=2.0", "(SteepSoftplus)")


class _FirstSliceDeterministicOutput(nn.Module):       # rsl-rl-lib 5's mean extractor
    def forward(self, mlp_output):
        return mlp_output[..., 0, :]


class _SecondSlice(_FirstSliceDeterministicOutput):   # the same class name chain, the other half
    def forward(self, mlp_output):
        return mlp_output[..., 1, :]


class _ScaledFirstSlice(_FirstSliceDeterministicOutput):
    def forward(self, mlp_output):
        return mlp_output[..., 0, :] * 3.0


class Heteroscedastic(nn.Module):
    def __init__(self, out):
        super().__init__()
        torch.manual_seed(4)
        self.mlp = nn.Sequential(nn.Linear(4, 8), nn.ELU(), nn.Linear(8, 6), nn.Unflatten(-1, (2, 3)))
        self.deterministic_output = out

    def forward(self, x):
        return self.deterministic_output(self.mlp(x))


@pytest.mark.parametrize("how", ["script", "trace"])
def test_unflatten_and_the_first_slice_are_read_from_their_graph(tmp_path, how):
    for out, cols in ((_FirstSliceDeterministicOutput(), slice(0, 3)), (_SecondSlice(), slice(3, 6))):
        m = Heteroscedastic(out)
        spec, proof = imp(_save(m, tmp_path / "het.pt", how))
        W = m.mlp[2].weight.detach().double().numpy().T
        assert spec.layer_sizes == [4, 8, 3] and np.allclose(spec.layers[-1][0], W[:, cols], atol=1e-7)
        assert ("mean half" in proof["recognised"]["head"]) == (cols.start == 0)
        X = _edges()
        assert np.abs(kernel_act(spec, X) - torch_act(m, X)).max() < 1e-4
    refused(_save(Heteroscedastic(_ScaledFirstSlice()), tmp_path / "scaled.pt", how),
            "node aten::mul in submodule 'deterministic_output' (_ScaledFirstSlice)")


# -- 3. torch.jit.trace exports ------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["trace", "script"])
@pytest.mark.parametrize("form", ["plain", "normaliser", "normaliser+clamps"])
def test_isaaclab_rsl_rl_style_mlps_import_traced_or_scripted_and_agree_with_torch(tmp_path, how, form):
    norm = None if form == "plain" else Normalizer(4, clip=5.0 if "clamps" in form else None)
    m = Exporter(_mlp(hidden=(32, 16)), norm, clip_actions=0.5 if "clamps" in form else None)
    spec, proof = imp(_save(m, tmp_path / f"{form}.pt", how))
    assert spec.layer_sizes == [4, 32, 16, 2] and spec.activations == ["elu", "elu", "identity"]
    assert proof["first_bad"] is None and proof["edge_samples"] > 0
    assert proof["kernel"]["edge_samples"] == proof["edge_samples"]
    if norm is not None:
        assert np.allclose(spec.mean, np.linspace(-1, 1, 4), atol=1e-6)
        assert np.allclose(spec.scale, np.linspace(0.2, 2, 4) + 1e-2, atol=1e-6)
    if "clamps" in form:
        assert np.allclose(spec.norm_clip_high, 5.0) and np.allclose(spec.action_high, 0.5)
    X = _edges()
    want = torch_act(m, X)
    assert np.abs(kernel_act(spec, X) - want).max() < 1e-4
    if "clamps" in form:
        assert np.isclose(np.abs(want).max(), 0.5)                                # the clamp acts on these rows


def test_traced_recurrent_exporter_is_refused_naming_why(tmp_path):
    class LSTMExporter(nn.Module):
        def __init__(self, H=8):
            super().__init__()
            self.memory = nn.LSTM(4, H)
            self.actor = nn.Sequential(nn.Linear(H, 2))
            self.register_buffer("hidden_state", torch.zeros(1, 1, H))
            self.register_buffer("cell_state", torch.zeros(1, 1, H))

        def forward(self, x):
            out, (h, c) = self.memory(x.unsqueeze(0), (self.hidden_state, self.cell_state))
            self.hidden_state[:] = h
            self.cell_state[:] = c
            return self.actor(out.squeeze(0))
    refused(_save(LSTMExporter(), tmp_path / "lstm.pt", "trace"), "submodule 'memory' (LSTM)", "traced nn.LSTM",
            "torch.jit.script")
    spec, _ = imp(_save(LSTMExporter(), tmp_path / "lstm_s.pt", "script"))     # scripted, it imports
    assert spec.recurrent == "lstm"


# -- 4. the proof's edge samples -----------------------------------------------------------------------------------
def _clamping(tmp_path, norm_clip=20.0, clip_actions=None, how="script"):
    m = Exporter(_mlp(hidden=(16,)), Normalizer(4, clip=norm_clip), clip_actions=clip_actions).eval()
    path = _save(m, tmp_path / "clamping.pt", how)
    return m, path


def test_edge_samples_reach_every_clip_and_are_reported(tmp_path):
    from control_node.kernels.importers import proof as P
    m, path = _clamping(tmp_path, norm_clip=20.0, clip_actions=1.5)
    spec, proof = imp(path)
    E, labels = P.edge_samples(spec)
    assert len(E) == len(labels) == proof["edge_samples"] == proof["kernel"]["edge_samples"]
    Z = (E - spec.mean) / spec.scale
    assert np.abs(Z).max() >= 50 and (np.abs(Z) > 20).any(axis=1).sum() >= 8
    assert any("just outside the norm_clip high 20" in lab for lab in labels)
    assert any("just inside the norm_clip low -20" in lab for lab in labels)
    kinds = proof["edge_kinds"]
    assert set(kinds) == {"one feature at +-k std", "all features at +-k std", "norm_clip bounds",
                          "action extremes and clip crossings"}
    assert kinds["one feature at +-k std"] == 2 * 3 * 4
    # the action's clip is crossed by the edge rows, and straddled by the bisection rows
    pre = P._pre_head(spec, E)
    assert (pre > 1.5).any() or (pre < -1.5).any()
    cross = [i for i, lab in enumerate(labels) if "the clip of action" in lab]
    assert cross and len(cross) % 2 == 0
    for i, o in zip(cross[::2], cross[1::2]):
        j = int(labels[i].split("action ")[1].split()[0])
        assert abs(pre[i, j]) < 1.5 < abs(pre[o, j]) and abs(abs(pre[o, j]) - 1.5) < 0.1
    assert "proved against torch" in describe(spec, proof)


def _wrong(spec, **fields):
    w = copy.deepcopy(spec)
    for k, v in fields.items():
        setattr(w, k, np.full_like(np.asarray(getattr(spec, k), dtype=np.float64), v))
    return w


def test_a_mapping_wrong_only_beyond_20_std_passes_random_samples_and_fails_the_edge_samples(tmp_path):
    """A spec that ignores the normaliser's clamp at +-20 std agrees with torch on the proof's random observations
    (3 std around the mean) and on the caller's typical rows, and differs from it at the edge samples."""
    from control_node.kernels.importers import proof as P
    from control_node.kernels.importers import torchscript as T
    from control_node.kernels.reference import random_inputs
    m, path = _clamping(tmp_path, norm_clip=20.0)
    spec, _ = imp(path)
    wrong = _wrong(spec, norm_clip_low=-np.inf, norm_clip_high=np.inf)
    runtime = P.torch_runtime(T.load(path), "float32")
    X = random_inputs(wrong, 2000, 0)
    ok = P.prove("clamping.pt", wrong, runtime, X, "float32", edges=False)      # random samples only: passes
    assert ok["first_bad"] is None and ok["edge_samples"] == 0
    with pytest.raises(ImportRefused) as e:
        P.prove("clamping.pt", wrong, runtime, X, "float32")
    assert "proof edge sample" in str(e.value) and "std" in e.value.proof["first_bad"]["edge"]
    assert P.prove("clamping.pt", spec, runtime, X, "float32")["first_bad"] is None   # the right spec passes


def test_a_dropped_action_clip_reached_only_by_large_observations_is_caught_at_the_edges(tmp_path):
    from control_node.kernels.importers import proof as P
    from control_node.kernels.importers import torchscript as T
    from control_node.kernels.reference import random_inputs
    m0, path0 = _clamping(tmp_path, norm_clip=None)
    spec0, _ = imp(path0)
    typical = np.abs(P._pre_head(spec0, random_inputs(spec0, 20000, 1))).max()
    bound = 1.5 * typical                                       # never reached by 3-std observations
    m, path = _clamping(tmp_path, norm_clip=None, clip_actions=float(bound))
    spec, proof = imp(path)
    assert np.allclose(spec.action_high, bound, rtol=1e-6) and proof["kernel"]["edge_samples"] > 0
    wrong = _wrong(spec, action_low=-np.inf, action_high=np.inf)
    runtime = P.torch_runtime(T.load(path), "float32")
    X = random_inputs(wrong, 2000, 0)
    assert P.prove("c.pt", wrong, runtime, X, "float32", edges=False)["first_bad"] is None
    with pytest.raises(ImportRefused, match="proof edge sample"):
        P.prove("c.pt", wrong, runtime, X, "float32")


def test_import_refuses_a_fold_that_drops_the_observation_clamp(tmp_path, monkeypatch):
    """Through import_policy: an importer that mis-read the clamp at +-20 std is refused by the edge samples."""
    from control_node.kernels.importers import torchscript as T
    real = T.fold

    def drops_norm_clip(file, module):
        folded, dtype = real(file, module)
        folded.norm_clip = None
        return folded, dtype
    _, path = _clamping(tmp_path, norm_clip=20.0, how="trace")
    monkeypatch.setattr(T, "fold", drops_norm_clip)
    msg = refused(path, "proof edge sample", "the import and torch")
    assert "std" in msg or "norm_clip" in msg


class VarNormalizer(nn.Module):              # std computed from the variance at run time, a reciprocal in front
    def __init__(self, n):
        super().__init__()
        self.register_buffer("mean", torch.linspace(-1, 1, n))
        self.register_buffer("var", torch.linspace(0.2, 2, n) ** 2)

    def forward(self, x):
        return (1.0 / torch.sqrt(self.var + 1e-8)) * (x - self.mean)


class Grows(nn.Module):                      # a constant computation larger than the file's tensors
    def forward(self, x):
        return x - torch.ones(4).unsqueeze(1).expand(4, 4).sum(0)


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x))) + x


@pytest.mark.parametrize("how", ["script", "trace"])
def test_constant_computations_are_evaluated_and_branches_refused(tmp_path, how):
    m = Exporter(_mlp(), VarNormalizer(4))
    spec, _ = imp(_save(m, tmp_path / "var.pt", how))
    assert np.allclose(spec.mean, np.linspace(-1, 1, 4), atol=1e-6)
    assert np.allclose(spec.scale, np.linspace(0.2, 2, 4), rtol=1e-5)
    X = _edges()
    assert np.abs(kernel_act(spec, X) - torch_act(m, X)).max() < 1e-4
    refused(_save(Residual(), tmp_path / "res.pt", how), "node aten::add in submodule '(top)' (Residual)",
            "values computed from it")
    if how == "script":                      # trace folds the constants itself
        refused(_save(Exporter(_mlp(), Grows()), tmp_path / "grows.pt", how), "submodule 'normalizer' (Grows)",
                "on constants is not evaluated")
