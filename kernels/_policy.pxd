# cython: language_level=3
"""C-level interface of the policy kernel, for other Cython modules (the node's loop).

The nogil entry points allocate nothing and touch no Python object:

- ``Policy.act_ptr(x, u)``: reads ``n_features`` float64 values at ``x``; a continuous policy writes
  ``n_actions`` float64 actions to ``u`` and returns 0, or -1 when an output is not finite (``u`` is
  then garbage: the caller must act safely); an argmax policy writes the class index to ``u[0]`` and
  returns it (-1: not finite).
- ``Policy.predict_ptr(x)``: argmax policies: the class index, or -1 when the logits are not finite.

Recurrent policies (``Policy.hidden_size > 0``): every ``act_ptr`` / ``predict_ptr`` call is one step:
it advances the state the Policy owns (h, c in its own aligned buffers). A step whose new state is not
finite zeroes the state, adds 1 to ``Policy.state_resets_nonfinite`` (a plain C field: read it from the
loop without the GIL) and returns -1 (act safely; the next step starts from the zero state).

- ``Policy.reset_ptr()``: zero the recurrent state (a no-op for a feed-forward policy). Call it when the
  policy (re)starts: at activation, after a hold / safe period, at an episode start.
"""
from libc.stdint cimport int64_t


cdef extern from "mlp_core.h" nogil:
    enum: MLP_MAX_LAYERS

    # mlp_core.h MLP_FIELDS as mlp_desc: a policy's fields with every pointer of the model dtype untyped. The
    # loader fills one for either dtype; mlp_kernel_init copies it into the typed struct (mlp_f64 / mlp_f32,
    # which Cython never names) inside an mlp_model, the policy's storage.
    ctypedef struct mlp_desc:
        int n_layers
        int dims[MLP_MAX_LAYERS + 1]
        int pdims[MLP_MAX_LAYERS + 1]
        int dot_form[MLP_MAX_LAYERS]
        int small_layout
        int specialised
        const char *isa
        const double *mean
        const double *scale
        const void *W[MLP_MAX_LAYERS]
        const void *b[MLP_MAX_LAYERS]
        void *act[MLP_MAX_LAYERS + 1]
        int act_code[MLP_MAX_LAYERS]
        double alpha[MLP_MAX_LAYERS]
        int pre
        const double *obs_scale
        const double *obs_lo
        const double *obs_hi
        const double *norm_lo
        const double *norm_hi
        int head
        int squash
        const double *act_lo
        const double *act_hi
        const double *act_off
        const double *act_scale
        int rnn
        int n_obs
        void *xin
        int H
        int pH
        int pg
        const void *Wx
        const void *Wh
        const void *bx
        const void *bh
        void *gx
        void *gh
        void *h
        void *c
        int64_t *resets
        int wkind
        const float *ws[MLP_MAX_LAYERS]
        const float *wsx
        const float *wsh
        int isa_want

    ctypedef struct mlp_model:       # a C union of the two typed structs: opaque here
        pass

    int mlp_small_rule(const mlp_desc *d, int itemsize)
    const char *mlp_isa()
    const char *mlp_isa_missing(int want)
    enum: MLP_W_NATIVE
    enum: MLP_W_F16
    enum: MLP_W_BF16
    enum: MLP_W_INT8
    enum: MLP_ISA_AUTO
    enum: MLP_ISA_PORTABLE
    enum: MLP_ISA_AVX2
    enum: MLP_ISA_AVX512
    float mlp_stream_read(const float *p, size_t n, int want)
    enum: MLP_HEAD_ARGMAX
    enum: MLP_HEAD_CONTINUOUS
    enum: MLP_RNN_NONE
    enum: MLP_RNN_LSTM
    enum: MLP_RNN_GRU
    enum: MLP_PANEL_BYTES

    # The policy's handle (mlp_core.h): the dtype is settled once, when mlp_kernel_init picks the copy;
    # every call after goes through it, never branching on the dtype.
    ctypedef struct mlp_kernel:
        void *m
        int (*act)(void *m, const double *x, double *u) noexcept nogil
        int (*forward)(void *m, const double *x) noexcept nogil
        void (*forward_batch)(void *m, const double *X, Py_ssize_t n, Py_ssize_t row_stride,
                              int64_t *out) noexcept nogil
        int64_t (*chain)(void *m, const double *X, Py_ssize_t n_rows, Py_ssize_t row_stride,
                         Py_ssize_t iters) noexcept nogil
        void (*reset)(void *m) noexcept nogil
        const void *logits
        const char *isa
        int specialised
        int itemsize

    void mlp_kernel_init(mlp_model *m, const mlp_desc *d, int itemsize, mlp_kernel *k)


cdef class Policy:
    cdef mlp_kernel _k           # the one handle every call goes through (settled in __cinit__)
    cdef mlp_model _m            # the typed struct the handle drives
    cdef readonly int n_features
    cdef readonly int n_classes
    cdef readonly int n_actions
    cdef readonly bint continuous
    cdef readonly object spec
    cdef object _arrays          # keeps every buffer the C struct points into alive
    cdef object _bound           # the caller-owned input registered by bind_input
    cdef const double *_bound_ptr

    cdef object _u               # act()'s output buffer (float64, n_actions)
    cdef double *_u_ptr
    cdef readonly int hidden_size                    # H of the recurrent layer, 0 without one
    cdef readonly int64_t state_resets_nonfinite     # steps whose state was not finite (reset to zero)
    cdef object _state           # (h, c): the recurrent state buffers (c None for a GRU), or None
    cdef public object copy_choice  # how the vector copy was chosen (kernels/dispatch.py), None: not recorded

    cdef int act_ptr(self, const double *x, double *u) noexcept nogil
    cdef void reset_ptr(self) noexcept nogil
    cdef int predict_ptr(self, const double *x) noexcept nogil
    cdef const void *logits_ptr(self) noexcept nogil
    cdef const double *_input_ptr(self, object x) except NULL
    cdef double *_output_ptr(self, object out) except NULL
