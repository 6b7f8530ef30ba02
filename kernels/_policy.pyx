# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled policy kernel: the only code here is what must be fast.

Model loading, validation and the consistency proof live in plain Python
(``kernels.model_file``, ``kernels.reference``); this module lays the weights out
for vector loads once, then runs forward passes without allocating.
"""
import numpy as np

cimport numpy as cnp
from libc.stdint cimport int64_t
from libc.string cimport memset

cnp.import_array()

cdef int BLOCK_BYTES = 64
DOT_COST = 1.15     # measured: see _choose_dot_form


cdef object _aligned_zeros(Py_ssize_t n, dtype):
    """Zeroed 1-D array of ``n`` items whose data starts on a 64-byte boundary."""
    itemsize = np.dtype(dtype).itemsize
    raw = np.zeros(n * itemsize + BLOCK_BYTES, dtype=np.uint8)
    offset = (-raw.ctypes.data) % BLOCK_BYTES
    return raw[offset:offset + n * itemsize].view(dtype)


cdef inline int _pad(int n, int lanes):
    return ((n + lanes - 1) // lanes) * lanes


def _choose_dot_form(int n_in, int n_out, int itemsize):
    """Pick the layout for one dense layer, counted in 32-byte vector operations.

    axpy: every input is broadcast (~1/2) and scales a row of outputs padded to whole
    ``MLP_PANEL_BYTES`` panels (n_in x padded-outputs FMAs); dot: a padded dot product per
    output, outputs padded to one vector, plus a transpose-and-add tree (~2 per output vector).
    Narrow heads (16 -> 3) come out dot, wide and square layers axpy. At equal counts the
    axpy panels ran 3-15 % faster than the dot form (its 8 interleaved row streams and
    shuffle trees; 64x64 to 512x512, both dtypes, interleaved C-level timing on Zen 3), so
    the dot form is charged ``DOT_COST``. (Small one-hidden-layer policies skip this: see
    ``mlp_core.h`` MLP_SMALL_RULE.)
    """
    cdef int lanes = 32 // itemsize, block = BLOCK_BYTES // itemsize, panel = MLP_PANEL_BYTES // itemsize
    axpy = n_in * (_pad(n_out, panel) // lanes) + n_in / 2
    dot = _pad(n_out, lanes) * (_pad(n_in, block) // lanes) + 2 * (_pad(n_out, lanes) // lanes)
    return dot * DOT_COST <= axpy


def _in_panels(W, int PW):
    """(n_in, n_out) -> the kernel's panel layout (n_out padded to PW: (panels, n_in, PW)), flat."""
    n_in, n_out = W.shape
    cols = np.zeros((n_in, _pad(n_out, PW)), W.dtype)
    cols[:, :n_out] = W
    return cols.reshape(n_in, -1, PW).transpose(1, 0, 2).ravel()


def _stream_read(cnp.ndarray buf, int want=MLP_ISA_AUTO):
    """Benchmark probe: read ``buf`` (float32, 1-D, 64-byte aligned, a multiple of 128 values) once in order
    at C level (``mlp_stream_read``, the vectors of the copy ``want`` codes (``stream_read_code``); default
    the widest the CPU has): a measured memory floor for weights of that size. Returns their sum."""
    if buf.dtype != np.float32 or buf.ndim != 1 or buf.shape[0] % 128 or cnp.PyArray_DATA(buf) is NULL \
            or (<size_t> cnp.PyArray_DATA(buf)) % BLOCK_BYTES:
        raise ValueError("buf: a 64-byte aligned 1-D float32 array of a multiple of 128 values")
    cdef const float *p = <const float *> cnp.PyArray_DATA(buf)
    cdef size_t n = buf.shape[0]
    cdef float s
    with nogil:
        s = mlp_stream_read(p, n, want)
    return s


_RNN_KIND = {None: MLP_RNN_NONE, "lstm": MLP_RNN_LSTM, "gru": MLP_RNN_GRU}
#: Policy(spec, isa=...) names -> mlp_core.h MLP_ISA_*; None / "auto": the widest copy this CPU runs
ISAS = {None: MLP_ISA_AUTO, "auto": MLP_ISA_AUTO, "sse2": MLP_ISA_PORTABLE, "portable": MLP_ISA_PORTABLE,
        "avx2": MLP_ISA_AVX2, "avx2+fma": MLP_ISA_AVX2, "avx512": MLP_ISA_AVX512}


def _isa_code(isa):
    if isa not in ISAS:
        raise ValueError(f"isa: {isa!r} is not a kernel copy; use one of {', '.join(k for k in ISAS if k)} "
                         "(or None for the widest this CPU runs)")
    return ISAS[isa]


def stream_read_code(isa):
    """``_stream_read``'s ``want`` for the copy ``isa`` (names as for ``Policy``), checked once here, not per
    timed read: ValueError naming the feature this CPU lacks."""
    cdef int want = _isa_code(isa)
    cdef const char *missing = mlp_isa_missing(want)
    if missing is not NULL:
        raise ValueError(f"isa={isa!r}: this CPU (or build) cannot run that copy: it lacks {missing.decode()}")
    return want


def isa_missing(isa):
    """None when this CPU (and build) runs the kernel copy ``isa`` ('sse2' / 'portable', 'avx2', 'avx512'),
    else the first CPU feature it lacks (tests skip on it, naming the feature)."""
    cdef const char *missing = mlp_isa_missing(_isa_code(isa))
    return None if missing == NULL else missing.decode()


def _narrow(cnp.ndarray laid_out, str weights, bint panels=False):
    """A laid-out float weight array -> the same layout in ``weights`` storage, 64-byte aligned. bf16 in
    panels (``panels``: every row a whole number of 32-element groups) is paired: in each group, element j
    (< 16) and element 16 + j share 32-bit word j, low and high half (mlp_core.h MLP_WEIGHTS says why)."""
    from control_node.kernels.weights import stored
    values = stored(laid_out, weights)
    if panels and weights == "bf16":
        if values.size % 32:
            raise RuntimeError(f"kernel layout: {values.size} panel weights are not whole 32-element groups")
        values = values.reshape(-1, 2, 16).transpose(0, 2, 1).ravel()
    out = _aligned_zeros(values.size, values.dtype)
    out[:] = values
    return out

cdef inline void *_data(object a) except? NULL:
    return NULL if a is None else cnp.PyArray_DATA(<cnp.ndarray?> a)


cdef int _fill_shape(mlp_desc *m, dict k, int itemsize) except -1:
    """Set the descriptor's shape and activation fields from ``k``; returns mlp_core.h's small-kernel rule."""
    cdef int l
    m.n_layers = k["n_layers"]
    for l in range(m.n_layers + 1):
        m.dims[l] = k["dims"][l]
        m.pdims[l] = k["pdims"][l]
    for l in range(m.n_layers):
        m.act_code[l] = k["codes"][l]
        m.alpha[l] = k["alphas"][l]
    m.n_obs, m.head, m.squash, m.pre, m.rnn = k["n_obs"], k["head"], k["squash"], k["pre"], k["rnn"]
    m.wkind, m.isa_want = k["wkind"], k["isa_want"]
    if m.isa_want == MLP_ISA_AVX512:      # the small kernels are AVX2: a forced AVX-512 copy runs the generic ones
        return 0
    return mlp_small_rule(m, itemsize)


cdef int _fill_buffers(mlp_desc *m, dict k, int itemsize, int64_t *resets) except -1:
    """Point the descriptor at the buffers in ``k`` (laid out by Policy; k keeps them alive), after checking
    that every buffer has the itemsize the C kernel will read it with (its pointers are untyped here)."""
    cdef int l
    witemsize = {MLP_W_NATIVE: itemsize, MLP_W_F16: 2, MLP_W_BF16: 2, MLP_W_INT8: 1}[m.wkind]
    for a in k["b"] + k["act"] + [k.get(n) for n in ("xin", "bx", "bh", "gx", "gh", "c")]:
        if a is not None and a.itemsize != itemsize:
            raise TypeError(f"kernel layout: a {a.dtype} buffer for a {itemsize * 8}-bit policy")
    for a in k["W"] + [k.get("Wx"), k.get("Wh")]:
        if a is not None and a.itemsize != witemsize:
            raise TypeError(f"kernel layout: {a.dtype} weights for {witemsize}-byte storage")
    for a in k["ws"] + [k.get("wsx"), k.get("wsh")]:
        if a is not None and a.dtype != np.float32:
            raise TypeError("kernel layout: int8 scales must be float32")
    for l in range(m.n_layers):
        m.dot_form[l] = k["dot"][l]
        m.W[l] = _data(k["W"][l])
        m.b[l] = _data(k["b"][l])
        m.ws[l] = <const float *> _data(k["ws"][l])
    for l in range(m.n_layers + 1):
        m.act[l] = _data(k["act"][l])
    m.mean, m.scale = <const double *> _data(k["mean"]), <const double *> _data(k["scale"])
    m.obs_scale, m.obs_lo = <const double *> _data(k["obs_scale"]), <const double *> _data(k["obs_lo"])
    m.obs_hi, m.norm_lo = <const double *> _data(k["obs_hi"]), <const double *> _data(k["norm_lo"])
    m.norm_hi = <const double *> _data(k["norm_hi"])
    m.act_lo, m.act_hi = <const double *> _data(k["act_lo"]), <const double *> _data(k["act_hi"])
    m.act_off, m.act_scale = <const double *> _data(k["act_off"]), <const double *> _data(k["act_scale"])
    m.xin = _data(k["xin"])
    if m.rnn != MLP_RNN_NONE:
        m.H, m.pH, m.pg = k["H"], k["pH"], k["pg"]
        m.Wx, m.Wh, m.bx, m.bh = _data(k["Wx"]), _data(k["Wh"]), _data(k["bx"]), _data(k["bh"])
        m.gx, m.gh, m.h, m.c = _data(k["gx"]), _data(k["gh"]), _data(k["h"]), _data(k["c"])
        m.wsx, m.wsh = <const float *> _data(k.get("wsx")), <const float *> _data(k.get("wsh"))
        m.resets = resets
    m.small_layout = k["small"]
    return 0


cdef class Policy:
    """A loaded policy: pre-process -> [LSTM / GRU] -> (Dense + activation) * layers -> head (argmax or continuous).

    Build with :meth:`Policy.load` (reads a model file, or imports an ``.onnx`` / TorchScript file, and
    verifies the kernel against the numpy reference) or ``Policy(spec)`` from a
    :class:`kernels.model_file.ModelSpec` (no verification). Every buffer is allocated here; calls
    allocate nothing (``act`` returns a new array; ``act_into`` and ``act_bound`` do not).

    Inputs are raw (un-normalised) float64 observations of shape ``(n_features,)``; actions are float64
    of shape ``(n_actions,)`` (an argmax policy has one: the class index).

    ``Policy(spec, isa=None, weights=None)``: ``isa`` picks the kernel copy ('sse2' (alias 'portable'),
    'avx2', 'avx512'; None: the widest this CPU runs; ValueError naming the missing CPU feature when it cannot
    run the one named: see :func:`isa_missing`). ``weights`` stores the weight matrices as 'f32' (the model
    dtype: exact, today's behaviour), 'f16', 'bf16' or 'int8' (per-output-channel symmetric, float32 scales;
    kernels/weights.py), converted in registers at every step; default: ``spec.weights`` ('f32' unless the
    model file says otherwise). Everything else stays in the model dtype.

    Recurrent policies (``recurrent`` 'lstm' / 'gru', ``hidden_size`` H): the Policy owns the state (h, c in
    64-byte aligned buffers allocated here) and every call (``act``, ``act_into``, ``act_bound``, ``act_ptr``,
    ``predict*``, ``logits``; ``act_batch`` / ``predict_batch`` run their rows as one sequence) is one step
    that advances it. ``reset()`` (``reset_ptr()`` from C, nogil) zeroes it; a new Policy starts from zero.
    A step whose new state is not finite resets the state to zero, counts it in
    ``state_resets_nonfinite`` and gives no action (-1 / NaN actions); the next step starts from zero.
    """

    def __cinit__(self, spec, isa=None, weights=None):
        import dataclasses

        from control_node.kernels.model_file import ACTIVATIONS, ModelSpec
        from control_node.kernels.weights import STORAGE, check_storage, quantise
        if not isinstance(spec, ModelSpec):
            raise TypeError("Policy(spec) takes a kernels.model_file.ModelSpec; use Policy.load(path) for a file")
        n_layers = len(spec.layers)
        if not 1 <= n_layers <= MLP_MAX_LAYERS:
            raise ValueError(f"layers: {n_layers} dense layers; the kernel supports 1 to {MLP_MAX_LAYERS}")
        isa_want = _isa_code(isa)
        missing = isa_missing(isa)
        if missing is not None:
            raise ValueError(f"isa={isa!r}: this CPU (or build) cannot run that copy: it lacks {missing}")
        storage = check_storage(spec.weights if weights is None else weights)
        if storage != spec.weights:       # the storage is part of what the policy answers: a new hash
            spec = dataclasses.replace(spec, weights=storage, weights_error=None, sha256="")
        self.spec = spec
        dtype = np.float32 if spec.dtype == "float32" else np.float64
        cdef int itemsize = np.dtype(dtype).itemsize      # all the C side is told of the dtype (mlp_kernel_init)
        cdef mlp_desc desc
        memset(&desc, 0, sizeof(desc))
        cdef int lanes = BLOCK_BYTES // itemsize
        cdef int PW = MLP_PANEL_BYTES // itemsize
        dims = [spec.layers[0][0].shape[0]] + [W.shape[1] for W, _ in spec.layers]   # the dense stack
        n_obs = spec.n_features           # dims[0], or the recurrent layer's input width
        self.n_features = n_obs
        self.n_classes = dims[n_layers]
        self.continuous = spec.head == "continuous"
        k = {"n_layers": n_layers, "dims": dims, "pdims": [_pad(d, lanes) for d in dims], "n_obs": n_obs,
             "codes": [ACTIVATIONS[a][0] for a in spec.activations], "alphas": list(spec.alphas),
             "head": MLP_HEAD_CONTINUOUS if self.continuous else MLP_HEAD_ARGMAX, "squash": spec.squash,
             "pre": spec.has_preprocessing, "rnn": _RNN_KIND[spec.recurrent], "wkind": STORAGE[storage],
             "isa_want": isa_want, "storage": storage}
        # the shape and activation fields first: mlp_core.h's rule says whether the small compile-time-shaped
        # kernels compute this policy, and those take their own layout (an axpy hidden layer, row-major)
        small = _fill_shape(&desc, k, itemsize)
        # padded to 64 bytes for vector loads: pad lanes normalise to (0 - 0) / 1 = 0
        k["mean"] = _aligned_zeros(_pad(n_obs, BLOCK_BYTES // 8), np.float64)
        k["scale"] = _aligned_zeros(_pad(n_obs, BLOCK_BYTES // 8), np.float64)
        k["mean"][:n_obs] = spec.mean
        k["scale"][:] = 1.0
        k["scale"][:n_obs] = spec.scale
        acts = [_aligned_zeros(_pad(d, PW), dtype) for d in dims]     # axpy layers write whole panels
        k["act"], k["dot"], k["W"], k["b"], k["ws"] = acts, [], [], [], []
        for l, (W, b) in enumerate(spec.layers):
            n_in, n_out = W.shape
            W, wscale = quantise(W, storage, f"W{l}")     # f16 / bf16: rounded; int8: integers + scales
            dot = (l == 1) if small else _choose_dot_form(n_in, n_out, itemsize)
            if dot:     # rows padded to 64 bytes of outputs (zero rows): outputs go a vector at a time
                Wp = _aligned_zeros(_pad(n_out, lanes) * _pad(n_in, lanes), dtype)
                Wp.reshape(_pad(n_out, lanes), _pad(n_in, lanes))[:n_out, :n_in] = W.T
            elif small:   # rows padded too (zero rows): the small kernels run over whole padded widths
                Wp = _aligned_zeros(_pad(n_in, lanes) * _pad(n_out, lanes), dtype)
                Wp.reshape(_pad(n_in, lanes), _pad(n_out, lanes))[:n_in, :n_out] = W
            else:   # in panels: each pass of the kernel streams its weights in order
                Wp = _aligned_zeros(n_in * _pad(n_out, PW), dtype)
                Wp[:] = _in_panels(np.asarray(W, dtype), PW)
            bp = _aligned_zeros(_pad(n_out, PW), dtype)
            bp[:n_out] = b
            sp = None
            if wscale is not None:       # laid out as the bias; pad lanes 0 (their sums are 0 too)
                sp = _aligned_zeros(_pad(n_out, PW), np.float32)
                sp[:n_out] = wscale
            k["dot"].append(dot)
            k["W"].append(Wp if storage == "f32" else _narrow(Wp, storage, panels=not (dot or small)))
            k["b"].append(bp)
            k["ws"].append(sp)
        for name, a in zip(("obs_scale", "obs_lo", "obs_hi", "norm_lo", "norm_hi"),
                           (spec.obs_scale, spec.obs_clip_low, spec.obs_clip_high, spec.norm_clip_low,
                            spec.norm_clip_high)):
            k[name] = np.ascontiguousarray(a, dtype=np.float64)
        for name, a in zip(("act_lo", "act_hi", "act_off", "act_scale"),
                           (spec.action_low, spec.action_high, spec.action_offset, spec.action_scale)):
            k[name] = np.ascontiguousarray(a, dtype=np.float64)
        k["xin"] = acts[0]
        self.state_resets_nonfinite = 0
        self.hidden_size = 0
        self._state = None
        if spec.recurrent:
            self._lay_out_recurrent(spec, dtype, lanes, k)
        k["small"] = small
        _fill_buffers(&desc, k, itemsize, &self.state_resets_nonfinite)
        # the dtype is decided here, once: mlp_core.h copies the descriptor into the typed struct, picks the
        # vector copy and, for small shapes, a specialised kernel; every later call goes through the handle
        mlp_kernel_init(&self._m, &desc, itemsize, &self._k)
        picked = self._k.specialised
        if bool(picked) != bool(small):     # the two layouts differ: a mismatch would compute garbage
            raise RuntimeError(f"kernel layout: laid out {'small' if small else 'generic'}, "
                               f"but mlp_core.h picked {'small' if picked else 'generic'} kernels")
        self.n_actions = spec.n_actions
        self._u = _aligned_zeros(_pad(self.n_actions, 8), np.float64)
        self._u_ptr = <double *> cnp.PyArray_DATA(self._u)
        self._arrays = (k, acts[n_layers][:self.n_classes])     # k holds every buffer the struct points into
        self._bound = None
        self._bound_ptr = NULL

    def _lay_out_recurrent(self, spec, dtype, int lanes, dict k):
        """Lay the recurrent layer out for the kernel (mlp_core.h) into ``k``: gate block g of pH = H padded to
        64 bytes at columns g*pH.., G*pH padded to pg (whole 256-byte panels); Wx (n_obs, pg) and Wh (H, pg) in
        axpy form, stored panel by panel ((pg / PW, n_in, PW)); biases (pg,) in the same columns; the gx / gh
        scratch, the padded input xin, the state h (= the dense stack's input buffer, act[0]) and c."""
        from control_node.kernels.model_file import RECURRENT
        cdef int H = spec.hidden_size, G = len(RECURRENT[spec.recurrent]), n_obs = spec.n_features
        cdef int pH = _pad(H, lanes)
        cdef int PW = MLP_PANEL_BYTES // np.dtype(dtype).itemsize
        cdef int pg = _pad(G * pH, PW)
        bx, bh = _aligned_zeros(pg, dtype), _aligned_zeros(pg, dtype)
        Wx_cols, Wh_cols = np.zeros((n_obs, pg), dtype), np.zeros((H, pg), dtype)     # row-major, then in panels
        for g in range(G):           # torch rows g*H .. (g+1)*H - 1 are gate g
            Wx_cols[:, g * pH:g * pH + H] = spec.rnn_W_ih[g * H:(g + 1) * H, :].T
            Wh_cols[:, g * pH:g * pH + H] = spec.rnn_W_hh[g * H:(g + 1) * H, :].T
            bx[g * pH:g * pH + H] = spec.rnn_b_ih[g * H:(g + 1) * H]
            bh[g * pH:g * pH + H] = spec.rnn_b_hh[g * H:(g + 1) * H]
        from control_node.kernels.weights import quantise
        storage = k["storage"]
        Wx_cols, sx = quantise(Wx_cols, storage, "rnn_W_ih")     # channels: the gate outputs (columns here)
        Wh_cols, sh = quantise(Wh_cols, storage, "rnn_W_hh")
        Wx, Wh = _aligned_zeros(n_obs * pg, dtype), _aligned_zeros(H * pg, dtype)
        Wx[:] = _in_panels(Wx_cols, PW)
        Wh[:] = _in_panels(Wh_cols, PW)
        if storage != "f32":
            Wx, Wh = _narrow(Wx, storage, panels=True), _narrow(Wh, storage, panels=True)
        if sx is not None:
            k["wsx"], k["wsh"] = sx.astype(np.float32), sh.astype(np.float32)
        lstm = spec.recurrent == "lstm"
        k.update(H=H, pH=pH, pg=pg, Wx=Wx, Wh=Wh, bx=bx, bh=bh, gx=_aligned_zeros(pg, dtype),
                 gh=_aligned_zeros(pg, dtype), xin=_aligned_zeros(_pad(n_obs, lanes), dtype), h=k["act"][0],
                 c=_aligned_zeros(pH, dtype) if lstm else None)
        self.hidden_size = H
        self._state = (k["h"], k["c"])

    @classmethod
    def load(cls, path, *, verify=True, isa=None, weights=None, max_bytes=None):
        """Read, validate and (by default) verify a model file against the numpy reference.

        ``.onnx`` and TorchScript (``.pt``) files are imported on the fly
        (``control_node.kernels.importers``), proven against onnxruntime / torch.
        Raises ``kernels.ModelFileError`` naming the bad field, an importer's refusal naming the
        node and operator, or ``kernels.ConsistencyError`` naming the first sample where the kernel
        and the reference disagree. ``isa`` and ``weights`` as for ``Policy(spec, ...)`` (weights default:
        what the file says, f32 when it says nothing); kernels.dispatch.load picks the copy by measurement.
        ``max_bytes``: the bound on what the file may make the
        process allocate (a model file's arrays together, an imported file's tensors each), checked before
        allocating: the node's ``[lifecycle] max_resident_mb`` (default 256 MiB).
        """
        from control_node.kernels.model_file import MAX_FILE_BYTES, load_model
        from control_node.kernels.reference import check_consistency
        bound = MAX_FILE_BYTES if max_bytes is None else int(max_bytes)
        if str(path).lower().endswith((".onnx", ".pt", ".pth", ".jit")):
            from control_node.kernels.importers import import_policy
            spec, _proof = import_policy(path, max_bytes=bound)   # refused whole, or proven against its runtime
        else:
            spec = load_model(path, bound)
        policy = cls(spec, isa=isa, weights=weights)
        spec = policy.spec
        if verify:
            check_consistency(policy, spec)
        return policy

    # ---- C level -----------------------------------------------------------------
    cdef int act_ptr(self, const double *x, double *u) noexcept nogil:
        return self._k.act(self._k.m, x, u)

    cdef void reset_ptr(self) noexcept nogil:
        """Zero the recurrent state (nothing for a feed-forward policy)."""
        self._k.reset(self._k.m)

    cdef int predict_ptr(self, const double *x) noexcept nogil:
        return self._k.forward(self._k.m, x)

    cdef const void *logits_ptr(self) noexcept nogil:
        """Logits of the last forward pass (n_classes values of the model dtype)."""
        return self._k.logits

    # ---- Python API --------------------------------------------------------------
    cdef const double *_input_ptr(self, object x) except NULL:
        # Fast path: exact ndarray, float64, 1-D, right length, C-contiguous.
        # Cheaper than a typed memoryview argument (~100 ns of buffer set-up).
        cdef cnp.ndarray a
        if cnp.PyArray_CheckExact(x):
            a = <cnp.ndarray> x
            if (cnp.PyArray_TYPE(a) == cnp.NPY_DOUBLE and cnp.PyArray_NDIM(a) == 1
                    and cnp.PyArray_DIM(a, 0) == self.n_features
                    and cnp.PyArray_IS_C_CONTIGUOUS(a)):
                return <const double *> cnp.PyArray_DATA(a)
        raise TypeError(
            f"x must be a C-contiguous float64 ndarray of shape ({self.n_features},); "
            f"got {type(x).__name__} {getattr(x, 'dtype', '')} {getattr(x, 'shape', '')}. "
            "Convert once with np.ascontiguousarray(x, dtype=np.float64).")

    def act(self, x):
        """Actions for one observation ``x`` (float64, shape (n_features,)) as a new float64 array of shape
        (n_actions,). A continuous policy whose outputs are not finite gives NaN actions (the node
        publishes its safe action instead); an argmax policy gives ``[class index]`` (-1: not finite)."""
        out = np.empty(self.n_actions, dtype=np.float64)
        self.act_into(x, out)
        return out

    def act_into(self, x, out):
        """:meth:`act` into a caller's float64 array ``out`` of shape (n_actions,); allocates nothing.
        Returns the status: 0 (continuous) or the class index (argmax), -1 when not finite."""
        cdef const double *xp = self._input_ptr(x)
        cdef double *up = self._output_ptr(out)
        cdef int rc = self.act_ptr(xp, up)
        cdef int j
        if rc < 0 and self.continuous:
            for j in range(self.n_actions):
                up[j] = np.nan
        return rc

    def act_bound(self, out):
        """:meth:`act_into` for the input registered with :meth:`bind_input`."""
        if self._bound_ptr == NULL:
            raise RuntimeError("act_bound() before bind_input(buf)")
        cdef double *up = self._output_ptr(out)
        cdef int rc = self.act_ptr(self._bound_ptr, up)
        cdef int j
        if rc < 0 and self.continuous:
            for j in range(self.n_actions):
                up[j] = np.nan
        return rc

    cdef double *_output_ptr(self, object out) except NULL:
        cdef cnp.ndarray a
        if cnp.PyArray_CheckExact(out):
            a = <cnp.ndarray> out
            if (cnp.PyArray_TYPE(a) == cnp.NPY_DOUBLE and cnp.PyArray_NDIM(a) == 1
                    and cnp.PyArray_DIM(a, 0) == self.n_actions and cnp.PyArray_IS_C_CONTIGUOUS(a)
                    and cnp.PyArray_ISWRITEABLE(a)):
                return <double *> cnp.PyArray_DATA(a)
        raise TypeError(f"out must be a writeable C-contiguous float64 ndarray of shape ({self.n_actions},); "
                        f"got {type(out).__name__} {getattr(out, 'dtype', '')} {getattr(out, 'shape', '')}")

    def act_batch(self, X):
        """Actions per row of ``X`` (n, n_features) -> float64 (n, n_actions); NaN rows where not finite.
        A recurrent policy runs the rows as one sequence (its state advances row by row)."""
        cdef cnp.ndarray Xa = np.ascontiguousarray(X, dtype=np.float64)
        if Xa.ndim != 2 or Xa.shape[1] != self.n_features:
            X_shape = (<object> Xa).shape
            raise ValueError(f"X must have shape (n, {self.n_features}); got {X_shape}")
        out = np.empty((Xa.shape[0], self.n_actions), dtype=np.float64)
        cdef Py_ssize_t i
        for i in range(Xa.shape[0]):
            self.act_into(Xa[i], out[i])
        return out

    def _argmax_only(self, what):
        if self.continuous:
            raise TypeError(f"{what}() is for argmax policies; this one is continuous "
                            f"({self.n_actions} actions): use act(), act_into() or act_batch()")

    def predict(self, x):
        """Argmax policies: class index for one sample ``x`` (float64, shape (n_features,)); -1 if the logits are not finite."""
        self._argmax_only("predict")
        return self.predict_ptr(self._input_ptr(x))

    def logits(self, x):
        """Logits for one sample, as a new array of shape (n_classes,) in the model dtype (allocates)."""
        self.predict_ptr(self._input_ptr(x))
        return self._arrays[1].copy()

    def bind_input(self, buf):
        """Register a caller-owned float64 buffer of shape (n_features,) for :meth:`predict_bound`.

        Fill the buffer in place, then call ``predict_bound()`` with no arguments:
        no per-call argument checks at all.
        """
        self._bound_ptr = self._input_ptr(buf)
        self._bound = buf

    def predict_bound(self):
        """Class index for the buffer registered with :meth:`bind_input`."""
        self._argmax_only("predict_bound")
        if self._bound_ptr == NULL:
            raise RuntimeError("predict_bound() before bind_input(buf)")
        return self.predict_ptr(self._bound_ptr)

    def predict_batch(self, X):
        """Class index per row of ``X`` (n, n_features) -> int64 array (n,); -1 marks non-finite logits."""
        self._argmax_only("predict_batch")
        cdef cnp.ndarray Xa = np.ascontiguousarray(X, dtype=np.float64)
        if Xa.ndim != 2 or Xa.shape[1] != self.n_features:
            X_shape = (<object> Xa).shape
            raise ValueError(f"X must have shape (n, {self.n_features}); got {X_shape}")
        cdef Py_ssize_t n = Xa.shape[0]
        cdef cnp.ndarray out = np.empty(n, dtype=np.int64)
        cdef const double *xp = <const double *> cnp.PyArray_DATA(Xa)
        cdef int64_t *op = <int64_t *> cnp.PyArray_DATA(out)
        cdef Py_ssize_t stride = self.n_features
        with nogil:
            self._k.forward_batch(self._k.m, xp, n, stride, op)
        return out

    def _chain(self, X, Py_ssize_t iters):
        """Benchmark probe: ``iters`` dependent forward passes over rows of X; returns a checksum."""
        cdef cnp.ndarray Xa = np.ascontiguousarray(X, dtype=np.float64)
        if Xa.ndim != 2 or Xa.shape[1] != self.n_features or Xa.shape[0] <= self.n_classes:
            raise ValueError(f"X must have shape (n > {self.n_classes}, {self.n_features})")
        cdef const double *xp = <const double *> cnp.PyArray_DATA(Xa)
        cdef Py_ssize_t n = Xa.shape[0], stride = self.n_features
        cdef int64_t s
        with nogil:
            s = self._k.chain(self._k.m, xp, n, stride, iters)
        return s

    def _act_loop(self, X, Py_ssize_t iters, bint chained=False):
        """Benchmark probe at C level: ``iters`` calls of the nogil act entry over rows of X (float64
        (n, n_features)), nothing between calls. ``chained``: each call's row depends on the previous
        action (latency); else rows in order (throughput). Returns a checksum of the actions."""
        cdef cnp.ndarray Xa = np.ascontiguousarray(X, dtype=np.float64)
        if Xa.ndim != 2 or Xa.shape[1] != self.n_features or Xa.shape[0] < 2:
            raise ValueError(f"X must have shape (n >= 2, {self.n_features})")
        cdef const double *xp = <const double *> cnp.PyArray_DATA(Xa)
        cdef double *up = self._u_ptr
        cdef Py_ssize_t n = Xa.shape[0], d = self.n_features, row = 0, k
        cdef double s = 0.0
        with nogil:
            for k in range(iters):
                self.act_ptr(xp + row * d, up)
                s += up[0]
                row += 1 + (<Py_ssize_t> (chained and up[0] > s / (k + 1)))
                if row >= n:
                    row -= n
        return s

    # ---- recurrent state -------------------------------------------------------------
    def reset(self):
        """Zero the recurrent state (h, c): the next step starts as at an episode start. No-op without one."""
        self.reset_ptr()

    def state(self):
        """A copy of the recurrent state ``(h, c)`` (model dtype, H values each; ``c`` None for a GRU), or None
        for a feed-forward policy."""
        if self._state is None:
            return None
        h, c = self._state
        H = self.hidden_size
        return (h[:H].copy(), None if c is None else c[:H].copy())

    def set_state(self, h, c=None):
        """Set the recurrent state (H values each, cast to the model dtype); ``c`` is required for an LSTM."""
        if self._state is None:
            raise TypeError("set_state() is for recurrent policies; this one has no recurrent layer")
        hb, cb = self._state
        H = self.hidden_size
        h = np.asarray(h, dtype=np.float64).reshape(-1)
        if h.shape != (H,) or (cb is not None and (c is None or np.asarray(c).size != H)):
            raise ValueError(f"set_state(h, c) takes {H} values each" + (" (h and c)" if cb is not None else ""))
        hb[:H] = h
        if cb is not None:
            cb[:H] = np.asarray(c, dtype=np.float64).reshape(-1)

    @property
    def recurrent(self):
        """'lstm', 'gru', or None (no recurrent layer)."""
        return self.spec.recurrent

    def last_outputs(self):
        """The last layer's outputs of the last call (model dtype, a copy); NaN after a step whose state
        was reset. Unlike :meth:`logits` it runs nothing (so it does not advance a recurrent state)."""
        return self._arrays[1].copy()

    @property
    def isa(self):
        """Vector copy this policy runs: 'avx512', 'avx2+fma', 'sse2', 'native' or 'generic'."""
        return self._k.isa.decode()

    @property
    def dtype(self):
        return self.spec.dtype

    @property
    def weights(self):
        """How the weight matrices are stored: 'f32' (the model dtype, exact), 'f16', 'bf16' or 'int8'."""
        return self.spec.weights

    @property
    def weights_error(self):
        """The error measured for this storage at import (kernels.weights.measure_error), or None."""
        return self.spec.weights_error

    @property
    def layers(self):
        """List of ``(W, b)``: W float64 (n_in, n_out), b float64 (n_out,)."""
        return [(np.asarray(W, dtype=np.float64).copy(), np.asarray(b, dtype=np.float64).copy())
                for W, b in self.spec.layers]

    @property
    def mean(self):
        return np.array(self.spec.mean, dtype=np.float64)

    @property
    def scale(self):
        return np.array(self.spec.scale, dtype=np.float64)

    @property
    def classes(self):
        return list(self.spec.classes)

    @property
    def action_names(self):
        """Names of the actions: the joint names of a continuous policy; ``["class"]`` for argmax."""
        return list(self.spec.action_names) if self.continuous else ["class"]

    @property
    def head(self):
        return self.spec.head

    @property
    def feature_names(self):
        return list(self.spec.feature_names)

    @property
    def sha256(self):
        return self.spec.sha256

    @property
    def kernel(self):
        """'specialised' when a small-shape kernel with compile-time widths runs, else 'generic'."""
        return "specialised" if self._k.specialised else "generic"

    @property
    def nbytes(self):
        """Bytes of the buffers the kernel owns (laid-out weights, activations, recurrent state)."""
        arrays = {}
        for v in self._arrays[0].values():
            for a in (v if isinstance(v, list) else [v]):
                if isinstance(a, np.ndarray):
                    arrays[id(a)] = a        # h is act[0]: counted once
        return int(sum(a.nbytes for a in arrays.values()) + self._u.nbytes)

    @property
    def layout(self):
        """Per dense layer, 'dot' or 'axpy': how the kernel stores its weights."""
        return ["dot" if d else "axpy" for d in self._arrays[0]["dot"]]

    def __repr__(self):
        widths = [str(d) for d in self.spec.layer_sizes]
        if self.spec.recurrent:
            widths[1] = f"{self.spec.recurrent}({widths[1]})"
        return f"Policy({' -> '.join(widths)}, {self.spec.dtype}, {self.kernel} kernel, sha256={self.spec.sha256[:12]})"
