/*
 * Sensor-frame decoder and action encoders (docs/protocol.md: v1 class actions, v2 continuous actions),
 * written against the byte layout of MessagePack so that the loop can validate a
 * frame without creating a single Python object. Every way a frame can be wrong
 * maps to one reason code; nothing is written to x_out unless the frame is valid.
 */
#ifndef CONTROL_NODE_FRAME_CODEC_H
#define CONTROL_NODE_FRAME_CODEC_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum {
    CN_OK = 0,
    CN_OVERSIZED = 1,
    CN_MULTIPART = 2,
    CN_MALFORMED = 3,
    CN_NOT_A_MAP = 4,
    CN_MISSING_FIELD = 5,
    CN_WRONG_TYPE = 6,
    CN_FEATURE_COUNT = 7,
    CN_NON_FINITE = 8,
    CN_SEQ_NOT_INCREASING = 9,
    CN_NON_FINITE_OUTPUT = 10,   /* valid frame, but the policy's logits overflowed */
    CN_N_REASONS = 11
};

typedef struct { const uint8_t *p, *end; } cn_reader;

static inline int cn_need(cn_reader *r, size_t n) { return (size_t)(r->end - r->p) >= n; }
static inline uint16_t cn_be16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t cn_be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t cn_be64(const uint8_t *p) { return ((uint64_t)cn_be32(p) << 32) | cn_be32(p + 4); }

/* Skip one complete value (and everything nested in it). 0 on success. */
static int cn_skip(cn_reader *r) {
    uint64_t pending = 1;
    while (pending) {
        if (!cn_need(r, 1)) return -1;
        const uint8_t t = *r->p++;
        pending--;
        size_t payload = 0;
        uint64_t children = 0;
        if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) payload = 0;
        else if (t >= 0x80 && t <= 0x8f) children = 2u * (t & 0x0f);
        else if (t >= 0x90 && t <= 0x9f) children = t & 0x0f;
        else if (t >= 0xa0 && t <= 0xbf) payload = t & 0x1f;
        else switch (t) {
            case 0xcc: case 0xd0: payload = 1; break;
            case 0xcd: case 0xd1: payload = 2; break;
            case 0xca: case 0xce: case 0xd2: payload = 4; break;
            case 0xcb: case 0xcf: case 0xd3: payload = 8; break;
            case 0xd4: payload = 2; break;
            case 0xd5: payload = 3; break;
            case 0xd6: payload = 5; break;
            case 0xd7: payload = 9; break;
            case 0xd8: payload = 17; break;
            case 0xc4: case 0xd9: if (!cn_need(r, 1)) return -1; payload = r->p[0]; r->p += 1; break;
            case 0xc5: case 0xda: if (!cn_need(r, 2)) return -1; payload = cn_be16(r->p); r->p += 2; break;
            case 0xc6: case 0xdb: if (!cn_need(r, 4)) return -1; payload = cn_be32(r->p); r->p += 4; break;
            case 0xc7: if (!cn_need(r, 1)) return -1; payload = 1u + r->p[0]; r->p += 1; break;
            case 0xc8: if (!cn_need(r, 2)) return -1; payload = 1u + cn_be16(r->p); r->p += 2; break;
            case 0xc9: if (!cn_need(r, 4)) return -1; payload = 1u + (size_t)cn_be32(r->p); r->p += 4; break;
            case 0xdc: if (!cn_need(r, 2)) return -1; children = cn_be16(r->p); r->p += 2; break;
            case 0xdd: if (!cn_need(r, 4)) return -1; children = cn_be32(r->p); r->p += 4; break;
            case 0xde: if (!cn_need(r, 2)) return -1; children = 2u * cn_be16(r->p); r->p += 2; break;
            case 0xdf: if (!cn_need(r, 4)) return -1; children = 2u * (uint64_t)cn_be32(r->p); r->p += 4; break;
            default: return -1;  /* 0xc1: never used */
        }
        if (!cn_need(r, payload)) return -1;
        r->p += payload;
        /* each child needs at least one byte: a huge count in a short buffer is malformed */
        if (children > (uint64_t)(r->end - r->p)) return -1;
        pending += children;
    }
    return 0;
}

/* Integer value. Returns 0 ok, CN_WRONG_TYPE if not an int, CN_MALFORMED if truncated.
 * *is_neg tells whether the value is negative; *u holds it as two's complement. */
static int cn_read_int(cn_reader *r, uint64_t *u, int *is_neg) {
    if (!cn_need(r, 1)) return CN_MALFORMED;
    const uint8_t t = r->p[0];
    size_t n = 0;
    *is_neg = 0;
    if (t <= 0x7f) { *u = t; r->p += 1; return CN_OK; }
    if (t >= 0xe0) { *u = (uint64_t)(int64_t)(int8_t)t; *is_neg = 1; r->p += 1; return CN_OK; }
    switch (t) {
        case 0xcc: case 0xd0: n = 1; break;
        case 0xcd: case 0xd1: n = 2; break;
        case 0xce: case 0xd2: n = 4; break;
        case 0xcf: case 0xd3: n = 8; break;
        default: return cn_skip(r) ? CN_MALFORMED : CN_WRONG_TYPE;
    }
    if (!cn_need(r, 1 + n)) return CN_MALFORMED;
    const uint8_t *p = r->p + 1;
    uint64_t v = n == 1 ? p[0] : n == 2 ? cn_be16(p) : n == 4 ? cn_be32(p) : cn_be64(p);
    if (t >= 0xd0) {  /* signed: sign-extend */
        int64_t s = n == 1 ? (int8_t)v : n == 2 ? (int16_t)v : n == 4 ? (int32_t)v : (int64_t)v;
        v = (uint64_t)s;
        *is_neg = s < 0;
    }
    *u = v;
    r->p += 1 + n;
    return CN_OK;
}

/* One number of x (float32/64 or int) as double. */
static int cn_read_number(cn_reader *r, double *out) {
    if (!cn_need(r, 1)) return CN_MALFORMED;
    const uint8_t t = r->p[0];
    if (t == 0xcb) {
        if (!cn_need(r, 9)) return CN_MALFORMED;
        uint64_t b = cn_be64(r->p + 1);
        memcpy(out, &b, 8);
        r->p += 9;
        return CN_OK;
    }
    if (t == 0xca) {
        if (!cn_need(r, 5)) return CN_MALFORMED;
        uint32_t b = cn_be32(r->p + 1);
        float f;
        memcpy(&f, &b, 4);
        *out = f;
        r->p += 5;
        return CN_OK;
    }
    uint64_t u;
    int neg, rc = cn_read_int(r, &u, &neg);
    if (rc) return rc;
    *out = neg ? (double)(int64_t)u : (double)u;
    return CN_OK;
}

static inline int cn_key_is(const uint8_t *k, size_t n, const char *lit, size_t ln) {
    return n == ln && memcmp(k, lit, ln) == 0;
}

/* Decode one sensor frame. On CN_OK, x_out holds n_features doubles (all finite),
 * *seq and *t_ns are set. scratch must hold n_features doubles; x_out is written
 * only for a valid frame. */
static int cn_decode_frame(const uint8_t *buf, size_t len, int n_features, double *scratch,
                           double *x_out, uint64_t *seq, int64_t *t_ns) {
    cn_reader r = { buf, buf + len };
    if (len == 0) return CN_MALFORMED;
    const uint8_t t = buf[0];
    uint32_t n_keys;
    if (t >= 0x80 && t <= 0x8f) { n_keys = t & 0x0f; r.p += 1; }
    else if (t == 0xde) { if (!cn_need(&r, 3)) return CN_MALFORMED; n_keys = cn_be16(buf + 1); r.p += 3; }
    else if (t == 0xdf) { if (!cn_need(&r, 5)) return CN_MALFORMED; n_keys = cn_be32(buf + 1); r.p += 5; }
    else { cn_reader s = r; return cn_skip(&s) ? CN_MALFORMED : CN_NOT_A_MAP; }
    int have_seq = 0, have_t = 0, have_x = 0, wrong = 0, count_bad = 0, non_finite = 0;
    uint64_t seq_v = 0;
    int64_t t_v = 0;
    for (uint32_t k = 0; k < n_keys; k++) {
        if (!cn_need(&r, 1)) return CN_MALFORMED;
        const uint8_t kt = r.p[0];
        const uint8_t *key = NULL;
        size_t klen = 0;
        if (kt >= 0xa0 && kt <= 0xbf) { klen = kt & 0x1f; key = r.p + 1; r.p += 1; }
        else if (kt == 0xd9) { if (!cn_need(&r, 2)) return CN_MALFORMED; klen = r.p[1]; key = r.p + 2; r.p += 2; }
        else {  /* a non-string key: skip key and value, remember the type error */
            if (cn_skip(&r) || cn_skip(&r)) return CN_MALFORMED;
            wrong = 1;
            continue;
        }
        if (!cn_need(&r, klen)) return CN_MALFORMED;
        r.p += klen;
        if (cn_key_is(key, klen, "seq", 3)) {
            uint64_t u; int neg;
            int rc = cn_read_int(&r, &u, &neg);
            if (rc == CN_MALFORMED) return rc;
            if (rc || neg) wrong = 1; else { seq_v = u; have_seq = 1; }
        } else if (cn_key_is(key, klen, "t_ns", 4)) {
            uint64_t u; int neg;
            int rc = cn_read_int(&r, &u, &neg);
            if (rc == CN_MALFORMED) return rc;
            if (rc || (!neg && u > (uint64_t)INT64_MAX)) wrong = 1; else { t_v = (int64_t)u; have_t = 1; }
        } else if (cn_key_is(key, klen, "v", 1)) {
            uint64_t u; int neg;
            int rc = cn_read_int(&r, &u, &neg);
            if (rc == CN_MALFORMED) return rc;
            if (rc || neg || u != 1) wrong = 1;
        } else if (cn_key_is(key, klen, "x", 1)) {
            if (!cn_need(&r, 1)) return CN_MALFORMED;
            const uint8_t xt = r.p[0];
            uint32_t n = 0;
            int is_bin = 0;
            if (xt >= 0x90 && xt <= 0x9f) { n = xt & 0x0f; r.p += 1; }
            else if (xt == 0xdc) { if (!cn_need(&r, 3)) return CN_MALFORMED; n = cn_be16(r.p + 1); r.p += 3; }
            else if (xt == 0xdd) { if (!cn_need(&r, 5)) return CN_MALFORMED; n = cn_be32(r.p + 1); r.p += 5; }
            else if (xt == 0xc4) { if (!cn_need(&r, 2)) return CN_MALFORMED; n = r.p[1]; r.p += 2; is_bin = 1; }
            else if (xt == 0xc5) { if (!cn_need(&r, 3)) return CN_MALFORMED; n = cn_be16(r.p + 1); r.p += 3; is_bin = 1; }
            else if (xt == 0xc6) { if (!cn_need(&r, 5)) return CN_MALFORMED; n = cn_be32(r.p + 1); r.p += 5; is_bin = 1; }
            else { if (cn_skip(&r)) return CN_MALFORMED; wrong = 1; continue; }
            if (is_bin) {
                if (!cn_need(&r, n)) return CN_MALFORMED;
                if (n != 8u * (uint32_t)n_features) { count_bad = 1; r.p += n; continue; }
                memcpy(scratch, r.p, n);   /* little-endian float64, as documented */
                r.p += n;
            } else {
                if (n != (uint32_t)n_features) {
                    /* skip the elements */
                    for (uint32_t i = 0; i < n; i++) if (cn_skip(&r)) return CN_MALFORMED;
                    count_bad = 1;
                    continue;
                }
                int elem_wrong = 0;
                for (uint32_t i = 0; i < n; i++) {
                    int rc = cn_read_number(&r, &scratch[i]);
                    if (rc == CN_MALFORMED) return rc;
                    if (rc) elem_wrong = 1;
                }
                if (elem_wrong) { wrong = 1; continue; }
            }
            for (int i = 0; i < n_features; i++) non_finite |= !((scratch[i] - scratch[i]) == 0);
            have_x = 1;
        } else {
            if (cn_skip(&r)) return CN_MALFORMED;   /* unknown key: ignored */
        }
    }
    if (r.p != r.end) return CN_MALFORMED;      /* trailing bytes */
    if (wrong) return CN_WRONG_TYPE;
    if (count_bad) return CN_FEATURE_COUNT;
    if (!have_seq || !have_t || !have_x) return CN_MISSING_FIELD;
    if (non_finite) return CN_NON_FINITE;
    memcpy(x_out, scratch, sizeof(double) * (size_t)n_features);
    *seq = seq_v;
    *t_ns = t_v;
    return CN_OK;
}

static inline uint8_t *cn_put_be64(uint8_t *p, uint64_t v) {
    for (int i = 7; i >= 0; i--) { *p++ = (uint8_t)(v >> (8 * i)); }
    return p;
}

#define CN_ACTION_BYTES 65

/* Encode an action map (fixed layout, CN_ACTION_BYTES long). seq is the answered frame's
 * uint64 seq, or -1 (int64) when no frame has been accepted yet. */
static size_t cn_encode_action(uint8_t *out, uint64_t seq, int have_seq, int64_t t_ns, uint64_t cycle,
                               int action, int safe) {
    uint8_t *p = out;
    *p++ = 0x85;
    *p++ = 0xa3; memcpy(p, "seq", 3); p += 3;
    if (have_seq) { *p++ = 0xcf; p = cn_put_be64(p, seq); }
    else { *p++ = 0xd3; p = cn_put_be64(p, (uint64_t)(int64_t)-1); }
    *p++ = 0xa4; memcpy(p, "t_ns", 4); p += 4;
    *p++ = 0xd3; p = cn_put_be64(p, (uint64_t)t_ns);
    *p++ = 0xa5; memcpy(p, "cycle", 5); p += 5;
    *p++ = 0xcf; p = cn_put_be64(p, cycle);
    *p++ = 0xa6; memcpy(p, "action", 6); p += 6;
    *p++ = 0xd3; p = cn_put_be64(p, (uint64_t)(int64_t)action);
    *p++ = 0xa4; memcpy(p, "safe", 4); p += 4;
    *p++ = safe ? 0xc3 : 0xc2;
    return (size_t)(p - out);
}

/* Protocol v2 (continuous policies): the action vector u as a msgpack array of n float64 (0xcb).
 * The array header is 0x90|n for n <= 15, else 0xdc + big-endian uint16 n (n <= CN_ACTION_U_MAX). */
#define CN_ACTION_U_MAX 65535

/* Length of a v2 action map with n actions: fixed for a given n (51 bytes + header + 9 n). */
static inline size_t cn_action_u_bytes(int n) {
    return 51u + (n <= 15 ? 1u : 3u) + 9u * (size_t)n;
}

/* Encode a v2 action map, keys in this order: seq, t_ns, cycle, u, safe (cn_action_u_bytes(n) long).
 * seq and t_ns as in cn_encode_action; u[0..n-1] are written bit for bit (IEEE-754 binary64, big
 * endian), -0.0 and subnormals included. out must hold cn_action_u_bytes(n) bytes; 1 <= n <= CN_ACTION_U_MAX. */
static size_t cn_encode_action_u(uint8_t *out, uint64_t seq, int have_seq, int64_t t_ns, uint64_t cycle,
                                 const double *u, int n, int safe) {
    uint8_t *p = out;
    *p++ = 0x85;
    *p++ = 0xa3; memcpy(p, "seq", 3); p += 3;
    if (have_seq) { *p++ = 0xcf; p = cn_put_be64(p, seq); }
    else { *p++ = 0xd3; p = cn_put_be64(p, (uint64_t)(int64_t)-1); }
    *p++ = 0xa4; memcpy(p, "t_ns", 4); p += 4;
    *p++ = 0xd3; p = cn_put_be64(p, (uint64_t)t_ns);
    *p++ = 0xa5; memcpy(p, "cycle", 5); p += 5;
    *p++ = 0xcf; p = cn_put_be64(p, cycle);
    *p++ = 0xa1; *p++ = 'u';
    if (n <= 15) { *p++ = (uint8_t)(0x90 | n); }
    else { *p++ = 0xdc; *p++ = (uint8_t)(n >> 8); *p++ = (uint8_t)n; }
    for (int j = 0; j < n; j++) {
        uint64_t b;
        memcpy(&b, &u[j], 8);
        *p++ = 0xcb;
        p = cn_put_be64(p, b);
    }
    *p++ = 0xa4; memcpy(p, "safe", 4); p += 4;
    *p++ = safe ? 0xc3 : 0xc2;
    return (size_t)(p - out);
}

#endif
