"""Builds the Cython extensions; all metadata lives in pyproject.toml.

Flags: -O3, no fast-math. The kernel's vector code is written on GCC vector types in
kernels/mlp_core.h + mlp_body.h, which compile an AVX-512, an AVX2+FMA+F16C (via `#pragma GCC target`)
and an SSE2 baseline copy and pick one at load time (or the one `Policy(spec, isa=...)` names), so the
default build runs on any x86-64. CONTROL_NODE_NATIVE=1 builds a single -march=native copy instead (for the
machine that builds it only: not portable, do not ship it).
"""
import os
import shutil
import sys

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

native = os.environ.get("CONTROL_NODE_NATIVE", "") not in ("", "0")
cflags = ["-O3", "-fno-math-errno", "-fno-trapping-math", "-Wno-unused-function"]
macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
if native:
    cflags.append("-march=native")
    macros.append(("MLP_NATIVE", "1"))
if sys.platform == "win32":
    cflags = ["/O2", "/openmp:experimental"]

# Cython finds a cimported .pxd by its import name (control_node/kernels/_policy.pxd) on its include
# path, but the repository keeps it in kernels/ (pyproject maps kernels/ to control_node.kernels).
# Stage it under its import name in build/ for the compiler; nothing staged is installed.
STAGE = os.path.join("build", "cython-include")
_pkg = os.path.join(STAGE, "control_node", "kernels")
os.makedirs(_pkg, exist_ok=True)
for _d in (os.path.join(STAGE, "control_node"), _pkg):
    open(os.path.join(_d, "__init__.pxd"), "a").close()
shutil.copyfile(os.path.join("kernels", "_policy.pxd"), os.path.join(_pkg, "_policy.pxd"))

# the kernel's C: a change to any of them rebuilds both extensions (mlp_body.h: the vector body, included once
# per (dtype, ISA) copy by mlp_core.h)
KERNEL_HEADERS = ["kernels/mlp_core.h", "kernels/mlp_body.h", "kernels/vmath.h"]
# the legged units' C and their declarations (the loop cimports _legged.pxd: a change rebuilds both)
LEGGED_HEADERS = ["control_node/loop/obs_terms.h", "control_node/loop/actuator.h", "control_node/loop/_legged.pxd"]
extensions = [
    Extension("control_node.kernels._policy", ["kernels/_policy.pyx"], depends=KERNEL_HEADERS,
              include_dirs=[numpy.get_include(), "kernels"], extra_compile_args=cflags, define_macros=macros),
    Extension("control_node.loop._rtloop", ["control_node/loop/_rtloop.pyx"],
              depends=KERNEL_HEADERS + LEGGED_HEADERS,
              include_dirs=[numpy.get_include(), "kernels", "control_node/loop"],
              extra_compile_args=cflags, define_macros=macros),
    # the legged deploy units (issue 45): observation recipe and actuator, C headers beside their thin wrapper
    Extension("control_node.loop._legged", ["control_node/loop/_legged.pyx"],
              depends=LEGGED_HEADERS + KERNEL_HEADERS,
              include_dirs=[numpy.get_include(), "kernels", "control_node/loop"],
              extra_compile_args=cflags, define_macros=macros),
    # bench policy / bench recurrent's floor probe (timed read, multiply-add and clock loops): built with the
    # package so that a wheel measures floors without a compiler; its vector copies pick themselves at run time
    Extension("control_node.bench._floor_probe", ["bench/_floor_probe.pyx"], include_dirs=["bench/c"],
              depends=["bench/c/floor_probe.h"], extra_compile_args=cflags),
]

# CONTROL_NODE_BUILD_ONLY=name[,name]: build only these extensions (tests/test_kernel_builds.py's scratch builds
# check the kernel alone and need not compile the loop and the floor probe again)
only = [n for n in os.environ.get("CONTROL_NODE_BUILD_ONLY", "").split(",") if n]
unknown = set(only) - {e.name for e in extensions}
if unknown:
    sys.exit(f"CONTROL_NODE_BUILD_ONLY names no extension: {sorted(unknown)}; "
             f"known: {[e.name for e in extensions]}")
if only:
    extensions = [e for e in extensions if e.name in only]

setup(ext_modules=cythonize(extensions, include_path=[STAGE], compiler_directives={"language_level": "3"},
                            quiet=True))
