"""Builds the Cython extensions; all metadata lives in pyproject.toml.

Flags: -O3 and -fopenmp-simd (vectorise `#pragma omp simd` loops without fast-math);
x86-64 dispatch between AVX-512, AVX2+FMA and baseline is done in mlp_core.h with
target_clones, so the default build runs on any x86-64. CONTROL_NODE_NATIVE=1 opts
into -march=native for the machine that builds it (not portable: do not ship it).
"""
import os
import sys

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

native = os.environ.get("CONTROL_NODE_NATIVE", "") not in ("", "0")
cflags = ["-O3", "-fopenmp-simd", "-fno-math-errno", "-fno-trapping-math", "-Wno-unused-function"]
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
