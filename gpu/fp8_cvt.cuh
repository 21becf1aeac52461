// Scaled conversion of float32 values to E4M3 / E5M2 codes, nearest even, for kernels compiled
// without a format's #defines (the fused GEMM in gemm_wgmma.cu): the same codes as
// fp8_quantize_elem<MODE_NEAREST_EVEN, SAT, CVT> in quantize.cu (and fp8lab.quantize on the CPU).
//
// code = encode(x / s) with one rounding. The hardware conversion (cvt.rn.satfinite.e4m3x2.f32 /
// e5m2x2) rounds to nearest even from float32; it gives the code of the exact quotient when fed
// the round-to-odd float32 of x / s (24 bits hold the 8-bit formats' 2 + m bits):
//   - s a power of two in [2^-60, 2^60]: x * (1 / s) is exact wherever it is a normal float32;
//     where it is not (|x / s| < 2^-126: code +-0 either way; overflow: Inf, handled as below),
//     nearest-even and round-to-odd give the same code. One multiply.
//   - other s >= 2^-60: q = fl(x / s) (IEEE division), r = fma(q, s, -x) (exact: the remainder of
//     a correctly rounded division), truncation b = q stepped toward zero when r says q rounded
//     away, odd = b | (r != 0).
//   - s < 2^-60 (the remainder could underflow): the float64 quotient, truncated to float32 with
//     the inexact bit set: round-to-odd of the float64 quotient, which is what the CPU encodes.
// Magnitudes (bits) at or above `special` are not left to cvt: NaN gives the NaN code of the
// input's sign and, without saturation, everything from the first magnitude that rounds to the overflow code
// (Inf included) gives the overflow code (fp8lab.gpu.codecs.cvt_special). `codes` packs
// NaN+ | NaN- << 8 | overflow+ << 16 | overflow- << 24.
#pragma once

// Per-call parameters of one scaled conversion.
struct Fp8Q {
    float s;        // the scale
    float inv;      // 1 / s when s is a power of two in [2^-60, 2^60] (exact), else 0
    unsigned int special;
    unsigned int codes;
};

__device__ __forceinline__ Fp8Q fp8q_make(float s, unsigned int special, unsigned int codes) {
    Fp8Q p;
    p.s = s;
    const unsigned int b = __float_as_uint(s);
    const bool pow2 = (b & 0x007FFFFFu) == 0u && b >= 0x21800000u && b <= 0x5D800000u;  // 2^-60 .. 2^60
    p.inv = pow2 ? __fdiv_rn(1.0f, s) : 0.0f;
    p.special = special;
    p.codes = codes;
    return p;
}

// The three ways to the round-to-odd quotient (FP8Q_MUL, FP8Q_DIV, FP8Q_F64 above, in order);
// fp8q_path picks one per call (uniform: callers may branch on it once, outside their loops).
#define FP8Q_MUL 0
#define FP8Q_DIV 1
#define FP8Q_F64 2
__device__ __forceinline__ int fp8q_path(const Fp8Q& p) {
    return p.inv != 0.0f ? FP8Q_MUL : (p.s < 0x1p-60f ? FP8Q_F64 : FP8Q_DIV);
}

// s >= 2^-60 (fp8lab._scaling_kernels._F32_PATH_MIN_SCALE): the float32 truncation of x / s
// (bits) and whether x / s is inexact, from the IEEE quotient and its exact remainder. Shared with
// fp8_quantize_elem (quantize.cu), whose table path needs both parts.
__device__ __forceinline__ unsigned int fp8q_trunc_div(float x, float s, bool& inexact) {
    const float q = __fdiv_rn(x, s);
    const float r = __fmaf_rn(q, s, -x);
    const bool rp = r > 0.0f, rn = r < 0.0f;   // both false for r = 0 or NaN (x = +-Inf)
    inexact = rp || rn;
    return __float_as_uint(q) - (unsigned int)((rp && q > 0.0f) || (rn && q < 0.0f));
}

__device__ __forceinline__ unsigned int fp8q_odd_div(float x, float s) {
    bool inexact;
    const unsigned int b = fp8q_trunc_div(x, s, inexact);
    return b | (unsigned int)inexact;
}

// s < 2^-60: the float64 quotient truncated to float32, inexact bit set (kept out of line: rare,
// and a float64 division inlined at every element would flood the instruction cache)
__device__ __noinline__ unsigned int fp8q_odd_f64(float x, float s) {
    const double q = (double)x / (double)s;
    const float t = __double2float_rz(q);
    if (isnan(q)) return __float_as_uint(t);
    return __float_as_uint(t) | ((double)t != q ? 1u : 0u);
}

template <int PATH>
__device__ __forceinline__ unsigned int fp8q_odd(float x, const Fp8Q& p) {
    if (PATH == FP8Q_MUL) return __float_as_uint(__fmul_rn(x, p.inv));
    if (PATH == FP8Q_DIV) return fp8q_odd_div(x, p.s);
    return fp8q_odd_f64(x, p.s);
}

// code for a magnitude at or above `special`: NaN (sign of the input x: GPU arithmetic does not
// keep a NaN's sign) or, without saturation, overflow
__device__ __forceinline__ unsigned int fp8q_special(unsigned int u, float x, unsigned int codes) {
    const int sh = ((u & 0x7FFFFFFFu) > 0x7F800000u ? 0 : 16) + ((__float_as_uint(x) >> 31) ? 8 : 0);
    return (codes >> sh) & 0xFFu;
}

// Codes of x0 (low byte) and x1 (high byte) by path PATH. F: 1 E4M3, 2 E5M2.
template <int F, int PATH>
__device__ __forceinline__ unsigned int fp8q_pair(float x0, float x1, const Fp8Q& p) {
    const unsigned int o0 = fp8q_odd<PATH>(x0, p), o1 = fp8q_odd<PATH>(x1, p);
    unsigned short two;
    if (F == 2) asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(two) : "r"(o1), "r"(o0));
    else asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(two) : "r"(o1), "r"(o0));
    unsigned int w = two;
    if (max(o0 & 0x7FFFFFFFu, o1 & 0x7FFFFFFFu) >= p.special) {
        if ((o0 & 0x7FFFFFFFu) >= p.special) w = (w & 0xFF00u) | fp8q_special(o0, x0, p.codes);
        if ((o1 & 0x7FFFFFFFu) >= p.special) w = (w & 0x00FFu) | (fp8q_special(o1, x1, p.codes) << 8);
    }
    return w;
}

// The same, the path chosen at run time (one branch per pair)
template <int F>
__device__ __forceinline__ unsigned int fp8q_pair(float x0, float x1, const Fp8Q& p) {
    const int path = fp8q_path(p);
    if (path == FP8Q_MUL) return fp8q_pair<F, FP8Q_MUL>(x0, x1, p);
    if (path == FP8Q_DIV) return fp8q_pair<F, FP8Q_DIV>(x0, x1, p);
    return fp8q_pair<F, FP8Q_F64>(x0, x1, p);
}

// Non-negative float32 bits of |x| for a running maximum of finite magnitudes (Inf, NaN: 0).
__device__ __forceinline__ unsigned int fp8q_mag(float x) {
    const unsigned int a = __float_as_uint(x) & 0x7FFFFFFFu;
    return a < 0x7F800000u ? a : 0u;
}

template <int V> struct Fp8qPath { static constexpr int value = V; };
