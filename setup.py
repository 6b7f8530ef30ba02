"""Builds the Cython extensions; all metadata lives in pyproject.toml.

Flags: -O3, no fast-math. The kernel's vector code is written on GCC vector types in
kernels/mlp_core.h, which compiles an AVX2+FMA copy (via `#pragma GCC target`) and an
SSE2 baseline copy and picks one at load time, so the default build runs on any
x86-64. CONTROL_NODE_NATIVE=1 builds a single -march=native copy instead (for the
machine that builds it only: not portable, do not ship it).
"""
import os
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

extensions = [
    Extension("kernels._policy", ["kernels/_policy.pyx"], include_dirs=[numpy.get_include(), "kernels"],
              extra_compile_args=cflags, define_macros=macros),
    Extension("control_node._rtloop", ["control_node/_rtloop.pyx"],
              include_dirs=[numpy.get_include(), "kernels", "control_node"],
              extra_compile_args=cflags, define_macros=macros),
]

setup(ext_modules=cythonize(extensions, compiler_directives={"language_level": "3"},
                            compile_time_env={}, quiet=True))
