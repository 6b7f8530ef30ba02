/*
 * The policy kernel's vector body: every kernel of one (compute dtype, ISA) copy. Included by mlp_core.h once
 * per copy (float64 and float32 for SSE2, AVX2 + FMA + F16C, AVX-512, or the one generic / -march=native
 * copy), inside that ISA's `#pragma GCC target` region, with these set before the #include (undefined at the
 * end):
 *
 *   T     compute dtype (float / double)        VT, VI  its vector type and the same-size integer vector
 *   NAME  the struct (mlp_f32 / mlp_f64)        BLK     lanes of VT
 *   SFX   the copy's suffix (_sse2, _avx2, _avx512, _one)
 *   RELU  max(0, v) for VT                      LDP     prefix of the weight loaders (LDP_h, _bh, _q, _s)
 *
 * A real file, not a macro: compiler errors, gdb and perf show its line numbers. Functions are named
 * MLP_FN(x) = NAME SFX _x (e.g. mlp_f32_avx512_dense); the entry points MLP_ENTRY(x) = NAME _x SFX
 * (e.g. mlp_f32_act_avx512), as MLP_SET in mlp_core.h expects. The weight-reading kernels per storage
 * (MLP_WEIGHTS) and the activation math (vmath.h MLP_VMATH) are still macros instantiated from here.
 */
/* ReLU as one max instruction where the ISA has it (RELU), else by mask; either */
/* way v < 0 becomes 0 and a NaN stays NaN, so a broken input cannot look valid. */
MLP_INLINE VT MLP_FN(relu)(VT v) { return RELU(v); }
MLP_XVMATH(T, VT, VI, MLP_FN(vm))
/* Activations other than ReLU run as a second pass over the layer's (cache-hot) output */
/* row: one switch per layer, a tight loop per activation, and the FMA loops above keep */
/* their accumulators in registers. ReLU stays fused into the layer (one max). */
MLP_INLINE void MLP_FN(activate_row)(T *restrict out, int pn, int code, T alpha) {
    VT *o = (VT *)out;
    const int nv = pn / BLK;
    switch (code) {
    case MLP_ACT_ELU: for (int q = 0; q < nv; q++) o[q] = MLP_FN(vm_elu)(o[q], alpha); break;
    case MLP_ACT_SELU: for (int q = 0; q < nv; q++) o[q] = MLP_FN(vm_selu)(o[q]); break;
    case MLP_ACT_LEAKY_RELU: for (int q = 0; q < nv; q++) o[q] = MLP_FN(vm_leaky_relu)(o[q], alpha); break;
    case MLP_ACT_CELU: for (int q = 0; q < nv; q++) o[q] = MLP_FN(vm_celu)(o[q], alpha); break;
    case MLP_ACT_TANH: for (int q = 0; q < nv; q++) o[q] = MLP_FN(vm_tanh)(o[q]); break;
    case MLP_ACT_SIGMOID: for (int q = 0; q < nv; q++) o[q] = MLP_FN(vm_sigmoid)(o[q]); break;
    case MLP_ACT_SOFTPLUS: for (int q = 0; q < nv; q++) o[q] = MLP_FN(vm_softplus)(o[q]); break;
    case MLP_ACT_SILU: for (int q = 0; q < nv; q++) o[q] = MLP_FN(vm_silu)(o[q]); break;
    default: break;                    /* identity, and ReLU (fused into the layer) */
    }
}
MLP_INLINE VT MLP_FN(ld_native)(const T *p) { return *(const VT *)p; }
/* panel rows (mlp_core.h MLP_WEIGHTS): the vector at element offset off of a row; where off is a constant
 * (the kernels' loops over their NB vectors unrolled, wo constant) the paired bf16 branch folds away; where
 * it is not (SSE2: wo is the pass's offset within the panel) it is a select, same result */
MLP_INLINE VT MLP_FN(lda_native)(const T *w, int off) { return *(const VT *)(w + off); }
MLP_INLINE VT MLP_FN(lda_h)(const uint16_t *w, int off) { return MLP_CAT(LDP, _h)(w + off); }
MLP_INLINE VT MLP_FN(lda_q)(const int8_t *w, int off) { return MLP_CAT(LDP, _q)(w + off); }
MLP_INLINE VT MLP_FN(lda_bp)(const uint16_t *w, int off) {
    const uint16_t *g = w + (off & ~31) + 2 * (off & 15);       /* the group's word holding element off */
    return (off & 16) ? MLP_CAT(LDP, _bph)(g) : MLP_CAT(LDP, _bpl)(g);
}
MLP_XTSUM(BLK, VT, VI, MLP_PFX)
/* the weight kernels once per storage: T itself, f16 (_h), bf16 (_bh: paired in panels), int8 (_q) */
MLP_XWEIGHTS(T, VT, MLP_PFX, , T, MLP_FN(ld_native), MLP_FN(lda_native), MLP_CAT(LDP, _s), 0)
MLP_XWEIGHTS(T, VT, MLP_PFX, _h, uint16_t, MLP_CAT(LDP, _h), MLP_FN(lda_h), MLP_CAT(LDP, _s), 0)
MLP_XWEIGHTS(T, VT, MLP_PFX, _bh, uint16_t, MLP_CAT(LDP, _bh), MLP_FN(lda_bp), MLP_CAT(LDP, _s), 0)
MLP_XWEIGHTS(T, VT, MLP_PFX, _q, int8_t, MLP_CAT(LDP, _q), MLP_FN(lda_q), MLP_CAT(LDP, _s), 1)
/* one switch per layer on the storage (settled at load; the branch always goes the same way) */
MLP_INLINE void MLP_FN(panels_w)(const T *restrict in, int n_in, const void *W, const T *restrict b,
                                     const float *s, T *restrict out, int pg, int relu, int wkind) {
    switch (wkind) {
    case MLP_W_F16: MLP_FN(panels_h)(in, n_in, (const uint16_t *)W, b, s, out, pg, relu); break;
    case MLP_W_BF16: MLP_FN(panels_bh)(in, n_in, (const uint16_t *)W, b, s, out, pg, relu); break;
    case MLP_W_INT8: MLP_FN(panels_q)(in, n_in, (const int8_t *)W, b, s, out, pg, relu); break;
    default: MLP_FN(panels)(in, n_in, (const T *)W, b, s, out, pg, relu); break;
    }
}
MLP_INLINE void MLP_FN(layer_dot_w)(const T *restrict in, int pn_in, const void *Wt, const T *restrict b,
                                        const float *s, T *restrict out, int n_out, int relu, int wkind) {
    switch (wkind) {
    case MLP_W_F16: MLP_FN(layer_dot_h)(in, pn_in, (const uint16_t *)Wt, b, s, out, n_out, relu); break;
    case MLP_W_BF16: MLP_FN(layer_dot_bh)(in, pn_in, (const uint16_t *)Wt, b, s, out, n_out, relu); break;
    case MLP_W_INT8: MLP_FN(layer_dot_q)(in, pn_in, (const int8_t *)Wt, b, s, out, n_out, relu); break;
    default: MLP_FN(layer_dot)(in, pn_in, (const T *)Wt, b, s, out, n_out, relu); break;
    }
}

/* Argmax of n_out logits (first maximum, as numpy), or -1 when any is NaN or +-Inf. */
/* Branch-free: a mispredicted compare per sample would cost more than the whole */
/* forward pass and stop consecutive samples from overlapping. */
MLP_INLINE int MLP_FN(argmax)(const T *z, int n_out) {
    int best = 0;
    T best_v = z[0];
    int finite = (z[0] - z[0]) == 0;   /* false for NaN and +-Inf */
    for (int j = 1; j < n_out; j++) {
        const T v = z[j];
        const int gt = v > best_v;
        finite &= (v - v) == 0;
        best += (j - best) & -gt;
        best_v = gt ? v : best_v;
    }
    return finite ? best : -1;
}

/* Pre-processing and every dense layer for one sample: leaves the outputs in act[L]. */
/* Clips are written as compares so that a NaN passes through (as numpy's clip). */
MLP_INLINE void MLP_FN(pre)(NAME *m, const double *x, T *restrict a0, int n0) {
    if (m->pre) {
        for (int i = 0; i < n0; i++) {
            double v = x[i] * m->obs_scale[i];
            v = v < m->obs_lo[i] ? m->obs_lo[i] : v;
            v = v > m->obs_hi[i] ? m->obs_hi[i] : v;
            v = (v - m->mean[i]) / m->scale[i];
            v = v < m->norm_lo[i] ? m->norm_lo[i] : v;
            v = v > m->norm_hi[i] ? m->norm_hi[i] : v;
            a0[i] = (T)v;
        }
    } else {
        for (int i = 0; i < n0; i++) a0[i] = (T)((x[i] - m->mean[i]) / m->scale[i]);
    }
}
/* Not inlined: six entry points per (dtype, ISA) call it, and six inlined copies of every weight kind's
 * loops and every activation made the extension take 79 s to compile, 51 s with one (one call per forward
 * pass; bench policy / bench recurrent C-level rows unchanged within their run-to-run spread). */
MLP_OUTLINE void MLP_FN(dense)(NAME *m) {
    const int L = m->n_layers;
    for (int l = 0; l < L; l++) {
        const int code = m->act_code[l], relu = code == MLP_ACT_RELU;
        enum { PW = MLP_PANEL_BYTES / (int)sizeof(T) };
        if (m->dot_form[l])
            MLP_FN(layer_dot_w)(m->act[l], m->pdims[l], m->W[l], m->b[l], m->ws[l],
                                    m->act[l + 1], m->dims[l + 1], relu, m->wkind);
        else            /* axpy: outputs to whole panels */
            MLP_FN(panels_w)(m->act[l], m->dims[l], m->W[l], m->b[l], m->ws[l], m->act[l + 1],
                                 (m->pdims[l + 1] + PW - 1) / PW * PW, relu, m->wkind);
        if (code > MLP_ACT_RELU)
            MLP_FN(activate_row)(m->act[l + 1], m->pdims[l + 1], code, (T)m->alpha[l]);
    }
}
MLP_INLINE void MLP_FN(body)(NAME *m, const double *x) {
    MLP_FN(pre)(m, x, m->act[0], m->dims[0]);
    MLP_FN(dense)(m);
}

/* The gates' nonlinearities on gx, gh and the new state in place, then the finiteness check (see */
/* MLP_FN(rnn_step)). */
MLP_INLINE int MLP_FN(rnn_gates)(NAME *m, const int pH, const int nv, const int lstm) {
    const VT *restrict gx = (const VT *)m->gx, *restrict gh = (const VT *)m->gh;
    T *restrict hs = m->h, *restrict cs = m->c;   /* every access below goes through these */
    VT *h = (VT *)hs, *c = (VT *)cs;
    if (lstm) {                               /* torch gate blocks i, f, g, o */
        for (int q = 0; q < nv; q++) {
            const VT i = MLP_FN(vm_sigmoid)(gx[q] + gh[q]);
            const VT f = MLP_FN(vm_sigmoid)(gx[nv + q] + gh[nv + q]);
            const VT g = MLP_FN(vm_tanh)(gx[2 * nv + q] + gh[2 * nv + q]);
            const VT o = MLP_FN(vm_sigmoid)(gx[3 * nv + q] + gh[3 * nv + q]);
            const VT cn = f * c[q] + i * g;
            c[q] = cn;
            h[q] = o * MLP_FN(vm_tanh)(cn);
        }
    } else {                                  /* torch gate blocks r, z, n */
        for (int q = 0; q < nv; q++) {
            const VT r = MLP_FN(vm_sigmoid)(gx[q] + gh[q]);
            const VT z = MLP_FN(vm_sigmoid)(gx[nv + q] + gh[nv + q]);
            const VT n = MLP_FN(vm_tanh)(gx[2 * nv + q] + r * gh[2 * nv + q]);
            h[q] = ((T)1 - z) * n + z * h[q];
        }
    }
    for (int j = m->H; j < pH; j++) {         /* pad lanes: 0 (inf * 0 could be NaN) */
        hs[j] = 0;
        if (lstm) cs[j] = 0;
    }
    VT chk = (VT){0};                         /* v - v: 0 when finite, NaN otherwise */
    for (int q = 0; q < nv; q++) chk += h[q] - h[q];
    if (lstm) for (int q = 0; q < nv; q++) chk += c[q] - c[q];
    int finite = 1;
    for (int k = 0; k < BLK; k++) finite &= chk[k] == 0;
    if (finite) return 0;
    memset(hs, 0, sizeof(T) * (size_t)pH);
    if (lstm) memset(cs, 0, sizeof(T) * (size_t)pH);
    if (m->resets) ++*m->resets;
    T *z = m->act[m->n_layers];               /* no outputs this step */
    for (int j = 0; j < m->dims[m->n_layers]; j++) z[j] = (T)__builtin_nan("");
    return -1;
}
/* One step of the recurrent layer on m->xin (see the header comment): 0, or -1 when */
/* the new state is not finite (the state is then zero and *resets incremented). */
/* Not inlined, as dense() above (three recurrent entry points per copy). */
MLP_OUTLINE int MLP_FN(rnn_step)(NAME *m) {
    const int pH = m->pH, nv = pH / BLK, lstm = m->rnn == MLP_RNN_LSTM;
    MLP_FN(panels_w)(m->xin, m->n_obs, m->Wx, m->bx, m->wsx, m->gx, m->pg, 0, m->wkind);
    MLP_FN(panels_w)(m->h, m->H, m->Wh, m->bh, m->wsh, m->gh, m->pg, 0, m->wkind);
    return MLP_FN(rnn_gates)(m, pH, nv, lstm);
}
MLP_INLINE int MLP_FN(rnn_body)(NAME *m, const double *x) {
    MLP_FN(pre)(m, x, m->xin, m->n_obs);
    if (MLP_FN(rnn_step)(m) < 0) return -1;
    MLP_FN(dense)(m);
    return 0;
}

/* Forward pass for one sample. Returns the argmax (first maximum, as numpy), or */
/* -1 when any output is NaN or infinite: the caller must then act safely. */
MLP_INLINE int MLP_FN(forward_inline)(NAME *m, const double *x) {
    MLP_FN(body)(m, x);
    return MLP_FN(argmax)(m->act[m->n_layers], m->dims[m->n_layers]);
}

/* The action of one sample into u (float64): a continuous head writes dims[L] */
/* values and returns 0, or -1 when an output or action is not finite (u is then */
/* garbage: act safely); an argmax head writes the class index to u[0] and returns */
/* it (-1: not finite). */
static int MLP_ENTRY(act)(NAME *m, const double *x, double *u) {
    MLP_FN(body)(m, x);
    if (m->head == MLP_HEAD_ARGMAX) {
        const int k = MLP_FN(argmax)(m->act[m->n_layers], m->dims[m->n_layers]);
        u[0] = (double)k;
        return k;
    }
    return MLP_CAT(NAME, _head_continuous)(m, u);
}

static int MLP_ENTRY(forward)(NAME *m, const double *x) {
    return MLP_FN(forward_inline)(m, x);
}

/* The same three entry points for a recurrent policy: each call is one step (the */
/* state advances); -1 when the state was reset (not finite) or an output is not finite. */
static int MLP_ENTRY(act_rnn)(NAME *m, const double *x, double *u) {
    if (MLP_FN(rnn_body)(m, x) < 0) {
        if (m->head == MLP_HEAD_ARGMAX) u[0] = -1.0;
        return -1;
    }
    if (m->head == MLP_HEAD_ARGMAX) {
        const int k = MLP_FN(argmax)(m->act[m->n_layers], m->dims[m->n_layers]);
        u[0] = (double)k;
        return k;
    }
    return MLP_CAT(NAME, _head_continuous)(m, u);
}
MLP_INLINE int MLP_FN(forward_rnn_inline)(NAME *m, const double *x) {
    if (MLP_FN(rnn_body)(m, x) < 0) return -1;
    return MLP_FN(argmax)(m->act[m->n_layers], m->dims[m->n_layers]);
}
static int MLP_ENTRY(forward_rnn)(NAME *m, const double *x) {
    return MLP_FN(forward_rnn_inline)(m, x);
}
/* Rows of X as one sequence (state carried from row to row). */
static void MLP_ENTRY(forward_batch_rnn)(NAME *m, const double *X, ptrdiff_t n,
                                          ptrdiff_t row_stride, int64_t *out) {
    for (ptrdiff_t r = 0; r < n; r++)
        out[r] = MLP_FN(forward_rnn_inline)(m, X + r * row_stride);
}

/* Rows of X (n, dims[0]) with a row stride in doubles; out receives n argmaxes. */
static void MLP_ENTRY(forward_batch)(NAME *m, const double *X, ptrdiff_t n,
                                     ptrdiff_t row_stride, int64_t *out) {
    for (ptrdiff_t r = 0; r < n; r++)
        out[r] = MLP_FN(forward_inline)(m, X + r * row_stride);
}

/* Latency probe: each input row is chosen by the previous answer, so sample k+1 */
/* cannot start before sample k ends. Returns a checksum that keeps it all live. */
static int64_t MLP_ENTRY(chain)(NAME *m, const double *X, ptrdiff_t n_rows,
                                ptrdiff_t row_stride, ptrdiff_t iters) {
    int64_t sum = 0;
    ptrdiff_t row = 0;
    for (ptrdiff_t k = 0; k < iters; k++) {
        int a = m->forward(m, X + row * row_stride);   /* what the node calls */
        sum += a;
        row += 1 + a;
        if (row >= n_rows) row -= n_rows;
    }
    return sum;
}

#undef T
#undef VT
#undef VI
#undef NAME
#undef BLK
#undef SFX
#undef RELU
#undef LDP
