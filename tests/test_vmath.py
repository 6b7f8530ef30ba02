"""kernels/vmath.h (vector exp / expm1 / log1p and activations) against libm: builds the C check
kernels/tests_c/vmath_check.c with the project's flags, with cc and (when installed) clang, and runs
it. The check exits non-zero when an error bound of the header's table is exceeded or a NaN / inf /
saturation / signed-zero rule is broken; here we also make sure it covered every function for
both types on every ISA copy it ran, and that the bounds it enforced are the ones vmath.h states."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = os.path.join(ROOT, "kernels", "vmath.h")
SOURCE = os.path.join("kernels", "tests_c", "vmath_check.c")
FLAGS = ["-O3", "-fno-math-errno", "-fno-trapping-math", "-Ikernels"]
FUNCTIONS = ["exp", "expm1", "log1p", "elu", "selu", "celu", "leaky_relu", "tanh", "sigmoid",
             "softplus", "silu"]
TYPES = ["double", "float"]

# "exp                  double sse2   max  0.986 ulp at x=... bound 1.50 ok"
LINE = re.compile(r"^(?P<fn>[a-z0-9_]+)(?:\(alpha=[^)]*\))?\s+(?P<ty>double|float)\s+(?P<isa>\w+)\s+"
                  r"max\s+(?P<err>\S+) ulp at .* bound (?P<bound>[\d.]+) (?P<verdict>ok|FAIL)$")


def header_bounds():
    """{(function, type): bound} from the ACCURACY TABLE comment in vmath.h."""
    text = open(HEADER).read()
    table = text[text.index("ACCURACY TABLE"):text.index("END ACCURACY TABLE")]
    bounds = {}
    for m in re.finditer(r"^\s*\*\s+([a-z0-9_]+)\s+[\d.]+\s+\(([\d.]+)\)\s+[\d.]+\s+\(([\d.]+)\)", table, re.M):
        bounds[(m.group(1), "double")] = float(m.group(2))
        bounds[(m.group(1), "float")] = float(m.group(3))
    return bounds


def test_header_table_lists_every_function():
    assert set(header_bounds()) == {(f, t) for f in FUNCTIONS for t in TYPES}


CLANG = shutil.which("clang")
COMPILERS = [pytest.param("cc", id="cc"),
             pytest.param(CLANG or "clang", id="clang",
                          marks=pytest.mark.skipif(CLANG is None, reason="clang not installed"))]


@pytest.mark.slow
@pytest.mark.parametrize("cc", COMPILERS)
def test_vmath_check(cc, tmp_path):
    exe = tmp_path / "vmath_check"
    b = subprocess.run([cc, *FLAGS, SOURCE, "-o", str(exe), "-lm"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert b.returncode == 0, b.stdout + b.stderr
    r = subprocess.run([str(exe)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert "vmath_check: PASS" in r.stdout, out[-3000:]

    ran = re.findall(r"^isa (\w+): run$", r.stdout, re.M)
    assert "sse2" in ran, r.stdout[:2000]
    seen = {}
    for line in r.stdout.splitlines():
        m = LINE.match(line)
        if m:
            assert m.group("verdict") == "ok", line
            assert float(m.group("err")) <= float(m.group("bound")), line
            seen.setdefault((m.group("fn"), m.group("ty")), set()).add(m.group("isa"))
            # the bound the check enforced is the one the header states
            assert float(m.group("bound")) == header_bounds()[(m.group("fn"), m.group("ty"))], line
    for fn in FUNCTIONS:
        for ty in TYPES:
            assert seen.get((fn, ty), set()) >= set(ran), (fn, ty, seen.get((fn, ty)), ran)
