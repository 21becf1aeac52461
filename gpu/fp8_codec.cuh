// Device-side encoder of one value into an 8-bit code: the CUDA twin of fp8lab._kernels.encode_one.
//
// Format constants are NOT written here: fp8lab.gpu._loader generates them from the format's
// BinadeTable (fp8lab.codecs._encoder_params) as #defines placed before this file:
//   FMT_E_LOW, FMT_E_MAX, FMT_TOP_COUNT, FMT_NBIN   binade range, finite codes of the top binade
//   FMT_MBITS, FMT_BASE                            brace lists, indexed by e - FMT_E_LOW
//   FMT_CODE_MAX, FMT_CODE_ZERO_POS, FMT_CODE_ZERO_NEG, FMT_CODE_NAN_POS, FMT_CODE_NAN_NEG,
//   FMT_CODE_OVF_POS, FMT_CODE_OVF_NEG              special codes (layout of _kernels.C_*)
//   MODE_NEAREST_EVEN, MODE_NEAREST_AWAY, MODE_TOWARD_ZERO, MODE_STOCHASTIC  (_kernels.MODE_CODES)
//
// For a positive input a in binade e with P-bit significand sig (a = sig * 2^(e-P+1)):
//     m = mbits[e]  (m = e - e_low < 0 below the smallest binade)     s = P - 1 - m
//     q = sig >> s, rounded by the low s bits                        code = base[e] + q - 2^m
//   q == 2^(m+1) carries into binade e+1.  Overflow: beyond e_max, or mant >= top_count in e_max.
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

// Per-binade tables, copied to shared memory by each block (small, read at data-dependent index).
struct FmtShared {
    signed char mbits[FMT_NBIN];
    u8 base[FMT_NBIN];
};

__device__ const signed char fmt_mbits_g[FMT_NBIN] = FMT_MBITS;
__device__ const u8 fmt_base_g[FMT_NBIN] = FMT_BASE;

__device__ __forceinline__ void fmt_load_shared(FmtShared& s) {
    for (int i = threadIdx.x; i < FMT_NBIN; i += blockDim.x) {
        s.mbits[i] = fmt_mbits_g[i];
        s.base[i] = fmt_base_g[i];
    }
}

// SplitMix64, exactly as fp8lab._kernels.mix64 / random_bits (wrapping uint64 arithmetic).
__device__ __forceinline__ u64 fp8_mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
__device__ __forceinline__ i64 fp8_random_bits(u64 key, i64 i) {
    u64 z = key + (u64)(i + 1) * 0x9E3779B97F4A7C15ull;
    return (i64)(fp8_mix64(z) >> 32);
}

__device__ __forceinline__ u8 fp8_signed(bool neg, int pos_code, int neg_code) {
    return (u8)(neg ? neg_code : pos_code);
}
__device__ __forceinline__ u8 fp8_overflow(bool neg, bool sat_like) {
    if (sat_like) return (u8)(FMT_CODE_MAX | (neg ? 0x80 : 0));
    return fp8_signed(neg, FMT_CODE_OVF_POS, FMT_CODE_OVF_NEG);
}

// Generic encoder: a line-by-line port of encode_one with 64-bit integers. Inputs: IEEE magnitude
// bits `a` of a float with P significand bits and exponent bias `bias` (float32: 24/127,
// float64: 53/1023). Any mode, including stochastic (key, idx as on the CPU).
template <int P, int BIAS, int MODE, bool SAT>
__device__ __forceinline__ u8 fp8_encode_generic(bool neg, i64 a, i64 inf_bits, const FmtShared& t,
                                                  u64 key, i64 idx) {
    if (a >= inf_bits) {
        if (a > inf_bits) return fp8_signed(neg, FMT_CODE_NAN_POS, FMT_CODE_NAN_NEG);
        if (SAT) return (u8)(FMT_CODE_MAX | (neg ? 0x80 : 0));
        return fp8_signed(neg, FMT_CODE_OVF_POS, FMT_CODE_OVF_NEG);
    }
    if (a == 0) return fp8_signed(neg, FMT_CODE_ZERO_POS, FMT_CODE_ZERO_NEG);
    i64 m = 0, mant = 0, e, sig, q;
    i64 ebits = a >> (P - 1);
    if (ebits == 0) {  // input subnormal: far below every format's smallest value
        e = FMT_E_LOW - 4096;
        sig = a;
    } else {
        e = ebits - BIAS;
        sig = (a & ((1ll << (P - 1)) - 1)) | (1ll << (P - 1));
    }
    if (e > FMT_E_MAX) {
        q = -1;
    } else {
        m = e >= FMT_E_LOW ? (i64)t.mbits[e - FMT_E_LOW] : e - FMT_E_LOW;
        i64 s = P - 1 - m;
        if (MODE == MODE_STOCHASTIC) {
            i64 r = fp8_random_bits(key, idx);
            i64 rem, thr;
            if (s >= P) { q = 0; rem = sig; }
            else { q = sig >> s; rem = sig & ((1ll << s) - 1); }
            if (s <= 32) thr = rem << (32 - s);
            else if (s - 32 < 63) {
                i64 d = s - 32;
                thr = (rem >> d) + ((rem & ((1ll << d) - 1)) != 0 ? 1 : 0);
            } else thr = rem != 0 ? 1 : 0;
            if (r < thr) q += 1;
        } else if (s > P) {
            q = 0;
        } else {
            q = sig >> s;
            i64 rem = sig & ((1ll << s) - 1);
            i64 half = 1ll << (s - 1);
            if (MODE == MODE_NEAREST_EVEN) {
                if (rem > half || (rem == half && (q & 1) == 1)) q += 1;
            } else if (MODE == MODE_NEAREST_AWAY) {
                if (rem >= half) q += 1;
            }
        }
        if (q == 0) return fp8_signed(neg, FMT_CODE_ZERO_POS, FMT_CODE_ZERO_NEG);
        if (m < 0) { e = FMT_E_LOW; mant = 0; }
        else if (q == (1ll << (m + 1))) { e = e + 1; mant = 0; }
        else mant = q - (1ll << m);
        if (e > FMT_E_MAX || (e == FMT_E_MAX && mant >= FMT_TOP_COUNT)) q = -1;
    }
    if (q == -1) return fp8_overflow(neg, SAT || MODE == MODE_TOWARD_ZERO);
    return (u8)(t.base[e - FMT_E_LOW] + mant + (neg ? 0x80 : 0));
}

// float32 deterministic fast path: the same algorithm in 32-bit integers (for float32 every
// intermediate fits: sig < 2^24, s <= 24 where it is used). Proven equal to the generic path and
// to the CPU table on all 2^32 inputs by benchmarks/gpu_check.py.
//   bits: | s | eeeeeeee | mmmmmmmmmmmmmmmmmmmmmmm |
//          31  30     23  22                     0
template <int MODE, bool SAT>
__device__ __forceinline__ u8 fp8_encode_f32_det(u32 u, const FmtShared& t) {
    const bool neg = (u >> 31) != 0;
    const u32 a = u & 0x7FFFFFFFu;
    if (a >= 0x7F800000u) {
        if (a > 0x7F800000u) return fp8_signed(neg, FMT_CODE_NAN_POS, FMT_CODE_NAN_NEG);
        if (SAT) return (u8)(FMT_CODE_MAX | (neg ? 0x80 : 0));
        return fp8_signed(neg, FMT_CODE_OVF_POS, FMT_CODE_OVF_NEG);
    }
    int e = (int)(a >> 23) - 127;  // input subnormals (and zero) give q = 0 below: s > 24
    if (e > FMT_E_MAX) return fp8_overflow(neg, SAT || MODE == MODE_TOWARD_ZERO);
    const int m = e >= FMT_E_LOW ? (int)t.mbits[e - FMT_E_LOW] : e - FMT_E_LOW;
    const int s = 23 - m;
    if (s > 24 || a < 0x00800000u) return fp8_signed(neg, FMT_CODE_ZERO_POS, FMT_CODE_ZERO_NEG);
    const u32 sig = (a & 0x7FFFFFu) | 0x800000u;
    u32 q = sig >> s;
    const u32 rem = sig & ((1u << s) - 1u);
    const u32 half = 1u << (s - 1);
    if (MODE == MODE_NEAREST_EVEN) q += (rem > half || (rem == half && (q & 1u))) ? 1u : 0u;
    else if (MODE == MODE_NEAREST_AWAY) q += rem >= half ? 1u : 0u;
    if (q == 0) return fp8_signed(neg, FMT_CODE_ZERO_POS, FMT_CODE_ZERO_NEG);
    int mant;
    if (m < 0) { e = FMT_E_LOW; mant = 0; }
    else if (q == (2u << m)) { e += 1; mant = 0; }
    else mant = (int)q - (1 << m);
    if (e > FMT_E_MAX || (e == FMT_E_MAX && mant >= FMT_TOP_COUNT))
        return fp8_overflow(neg, SAT || MODE == MODE_TOWARD_ZERO);
    return (u8)(t.base[e - FMT_E_LOW] + mant + (neg ? 0x80 : 0));
}

// The CPU's float32 table index: 2 * (bits >> 16) + (low 16 bits != 0) (fp8lab._kernels.lut32_*).
__device__ __forceinline__ u32 fp8_lut32_index(u32 u) {
    return ((u >> 15) & 0x1FFFEu) | ((u & 0xFFFFu) != 0u ? 1u : 0u);
}
