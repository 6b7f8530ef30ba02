# cython: boundscheck=False, wraparound=False
"""Timed loops that measure this core's floor (bench/c/floor_probe.h); bench/floor.py drives them.

Each function returns per-sample timings as a float64 array; the loops and the clock reads are in C, so
no Python call sits inside a timed sample.
"""
import numpy as np

cdef extern from "floor_probe.h" nogil:
    int FP_ISA_SSE2, FP_ISA_AVX2, FP_ISA_AVX512, FP_CHAINS
    int fp_isa_supported(int isa)
    int fp_vector_bytes(int isa)
    float fp_read_ns(int isa, const float *p, size_t n, int passes, int samples, double *out)
    double fp_fma_ns(int isa, int f64, long iters, int samples, double *out)
    unsigned long long fp_add_chain_ns(long iters, int samples, double *out)
    int FP_W_F16, FP_W_BF16, FP_W_INT8
    double fp_widen_ns(int isa, int kind, const void *w, long n, long iters, int samples, double *out)

#: the kernels' names for the vector copies (kernels/mlp_core.h's mlp_isa), widest first
ISAS = {"avx512": FP_ISA_AVX512, "avx2+fma": FP_ISA_AVX2, "sse2": FP_ISA_SSE2}
CHAINS = FP_CHAINS


def supported() -> list:
    """The vector copies this CPU runs, widest first."""
    return [name for name, code in ISAS.items() if fp_isa_supported(code)]


def vector_bytes(str isa) -> int:
    return fp_vector_bytes(_code(isa))


cdef int _code(str isa) except -1:
    if isa not in ISAS:
        raise ValueError(f"isa: {isa!r} is not one of {', '.join(ISAS)}")
    if not fp_isa_supported(ISAS[isa]):
        raise ValueError(f"isa: this CPU does not run the {isa} copy (it runs: {', '.join(supported())})")
    return ISAS[isa]


def read_ns(const float[::1] buf, str isa, int passes, int samples):
    """ns per pass of reading ``buf`` (float32, 64-byte aligned, a multiple of 128 values) once in order, with
    ``isa``'s vectors; ``passes`` passes per sample after a warm-up pass."""
    cdef int code = _code(isa)
    if buf.shape[0] == 0 or buf.shape[0] % 128 or (<size_t> &buf[0]) % 64:
        raise ValueError("buf: a 64-byte aligned float32 array of a multiple of 128 values")
    if passes < 1 or samples < 1:
        raise ValueError("passes and samples: at least 1")
    out = np.empty(samples)
    cdef double[::1] o = out
    with nogil:
        fp_read_ns(code, &buf[0], buf.shape[0], passes, samples, &o[0])
    return out


def fma_ns(str isa, str dtype, long iters, int samples):
    """ns per iteration of the multiply-add loop (``CHAINS`` vector multiply-adds of ``isa``'s width on
    ``dtype``, float32 or float64), one sample per ``iters`` iterations, after a warm-up sample."""
    cdef int code = _code(isa)
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype: {dtype!r} is not float32 or float64")
    if iters < 1 or samples < 1:
        raise ValueError("iters and samples: at least 1")
    cdef int f64 = dtype == "float64"
    out = np.empty(samples)
    cdef double[::1] o = out
    with nogil:
        fp_fma_ns(code, f64, iters, samples, &o[0])
    return out


def add_chain_ns(long iters, int samples):
    """ns per add of a chain of dependent register adds (one per cycle: the reciprocal is the clock in GHz),
    ``iters`` x 16 adds per sample, after a warm-up sample."""
    if iters < 1 or samples < 1:
        raise ValueError("iters and samples: at least 1")
    out = np.empty(samples)
    cdef double[::1] o = out
    with nogil:
        fp_add_chain_ns(iters, samples, &o[0])
    return out


#: the narrow weight storages whose widening the probe times (kernels/weights.py's names)
WIDEN = {"f16": FP_W_F16, "bf16": FP_W_BF16, "int8": FP_W_INT8}
WIDEN_VALUES = FP_CHAINS * 16 * 8   # stored values: whole groups of FP_CHAINS vectors of any width (<= 16)


def widen_ns(str isa, str storage, long iters, int samples):
    """ns per widened float32 vector multiply-add (``storage`` weights read from a small buffer, widened as
    the kernels widen them, multiply-added into ``CHAINS`` accumulators), ``iters`` passes over the buffer per
    sample, after a warm-up sample; all -1 where the copy has no widening loop (SSE2)."""
    cdef int code = _code(isa)
    if storage not in WIDEN:
        raise ValueError(f"storage: {storage!r} is not one of {', '.join(WIDEN)}")
    if iters < 1 or samples < 1:
        raise ValueError("iters and samples: at least 1")
    # values that keep the sums finite and normal: f16 / bf16 1.0 (their bits), int8 1
    buf = np.full(WIDEN_VALUES, 1, dtype=np.int8) if storage == "int8" else np.full(
        WIDEN_VALUES, 0x3c00 if storage == "f16" else 0x3f80, dtype=np.uint16)
    cdef const unsigned char[::1] b = buf.view(np.uint8)
    out = np.empty(samples)
    cdef double[::1] o = out
    cdef int kind = WIDEN[storage]
    cdef long n = WIDEN_VALUES
    with nogil:
        fp_widen_ns(code, kind, &b[0], n, iters, samples, &o[0])
    return out
