"""The scratch build's kernel against the numpy reference (test_kernel_builds): python kernel_build_check.py COPY TESTS.
COPY is the scratch copy whose kernels/_policy*.so was just built; TESTS the tests directory (random_spec)."""
import glob, importlib.util, sys
sys.path[:0] = [sys.argv[2], sys.argv[1]]     # as `python -c` run in COPY had it: tests, then COPY
# the scratch build's compiled kernel stands in for the installed one (the Python around it is the same)
so = glob.glob(sys.argv[1] + "/kernels/_policy*.so")[0]
spec = importlib.util.spec_from_file_location("control_node.kernels._policy", so)
mod = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = mod
spec.loader.exec_module(mod)
from control_node.kernels import Policy, check_consistency
assert sys.modules["control_node.kernels._policy"].__file__ == so
assert Policy.__module__ == "control_node.kernels._policy"
from conftest import random_spec
for sizes in ([4, 16, 3], [4, 13, 3], [8, 24, 8], [7, 32, 5], [12, 200, 3], [1000, 9, 2], [4, 16, 16, 3]):
    for dtype in ("float64", "float32"):
        spec = random_spec(sizes, dtype=dtype, seed=len(sizes))
        p = Policy(spec)
        check_consistency(p, spec, n_random=500)
        print(sizes, dtype, p.isa, p.kernel, "ok")
# narrower weight storages: the build's own loaders (the generic copy's lane-by-lane ones, paired bf16 in panels)
for sizes in ([48, 96, 64, 12],):           # panel layers and a dot-form head
    for dtype in ("float64", "float32"):
        for storage in ("f16", "bf16", "int8"):
            spec = random_spec(sizes, dtype=dtype, seed=len(sizes))
            p = Policy(spec, weights=storage)
            check_consistency(p, spec, n_random=200)
            print(sizes, dtype, storage, p.isa, p.kernel, "ok")
