"""The kernel's other builds, compiled for real in a scratch copy and checked against the numpy
reference: the opt-in native build (CONTROL_NODE_NATIVE=1, one -march=native copy) and a clang build
of the default dispatching one. The default gcc build is what every other test runs."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))



def build_and_check(tmp_path, env_extra):
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), copy / name)
    for pkg in ("kernels", "control_node", "train", "sim", "bench", "configs"):
        shutil.copytree(os.path.join(ROOT, pkg), copy / pkg,
                        ignore=shutil.ignore_patterns("*.so", "*.c", "__pycache__", "*.html"))
    # only the kernel: the check below loads nothing else (the loop and the floor probe would double the time);
    # no debug information (-g from Python's flags): the code is the same and the compile takes a third less
    # (gcc, the default build: 24 s -> 16 s)
    env = dict(os.environ, CONTROL_NODE_BUILD_ONLY="control_node.kernels._policy", **env_extra)
    env["CFLAGS"] = (env.get("CFLAGS", "") + " -g0").strip()
    b = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=copy, env=env,
                       capture_output=True, text=True, timeout=600)
    assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-3000:]
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "support", "children", "kernel_build_check.py"),
                        str(copy), os.path.join(ROOT, "tests")],
                       cwd=copy, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(" ok") == 14 + 6, r.stdout     # float storages, then the narrow ones
    so = next((copy / "kernels").glob("_policy*.so"))      # the file kernel_build_check.py loaded
    compilers = subprocess.run(["readelf", "-p", ".comment", str(so)], capture_output=True, text=True).stdout
    return r.stdout, compilers


@pytest.mark.slow
def test_native_build_matches_reference(tmp_path):
    out, _ = build_and_check(tmp_path, {"CONTROL_NODE_NATIVE": "1"})
    assert " native " in out and "specialised" in out and "generic" in out


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("clang") or shutil.which("clang-14")),
                    reason="no clang on PATH (apt-get install clang; .ci/run installs it when root)")
def test_clang_build_matches_reference(tmp_path):
    cc = shutil.which("clang") or shutil.which("clang-14")
    out, compilers = build_and_check(tmp_path, {"CC": cc, "LDSHARED": f"{cc} -shared"})
    assert "specialised" in out and "generic" in out
    assert "clang" in compilers, compilers            # the extension really was compiled by clang
