// Scaled conversion of float32 values to E4M3 / E5M2 codes, nearest even, for kernels compiled
// without a format's #defines (the fused GEMM in gemm_wgmma.cu): the same codes as
// fp8_quantize_elem<MODE_NEAREST_EVEN, SAT, CVT> in quantize.cu (and fp8lab.quantize on the CPU).
//
// code = encode(x / s) with one rounding. The hardware conversion (cvt.rn.satfinite.e4m3x2.f32 /
// e5m2x2) rounds to nearest even from float32; it gives the code of the exact quotient when fed
// the round-to-odd float32 of x / s (24 bits hold the 8-bit formats' 2 + m bits):
//   - s a power of two in [2^-60, 2^60] (FP8Q_MUL): x * (1 / s) is exact wherever it is a normal
//     float32; where it is not (|x / s| < 2^-126: code +-0 either way; overflow: Inf, handled as
//     below), nearest-even and round-to-odd give the same code. One multiply.
//   - other s >= 2^-60: from a faithful quotient q (one of the two float32 around x / s), the
//     remainder r = fma(q, s, -x) is exact; the truncation b is q stepped toward zero when r says
//     q lies beyond x / s, and odd = b | (r != 0). FP8Q_DIV takes q from the IEEE division.
//     FP8Q_RCP (s <= 2^60) has a branch-free fast route (fp8q_odd_fast) for blocks of elements:
//     q0 = x * y with y = 1/s correctly rounded, one correction q = q0 - fma(q0, s, -x) * y, whose
//     error before its rounding is ~2^-45 relative: faithful. Where intermediates leave the normal
//     range, either |x| < 2^-100 and |x / s| < 2^-40 (code +-0, the error being below 2^-90) or
//     the result is not finite (caught by fp8q_fast_lim). Its careful route is FP8Q_DIV's.
//   - s < 2^-60 (FP8Q_F64; the remainder could underflow): the float64 quotient, truncated to
//     float32 with the inexact bit set: round-to-odd of the float64 quotient, as the CPU encodes.
// Magnitudes (bits) at or above `special` are not left to cvt: NaN gives the NaN code of the
// input's sign and, without saturation, everything from the first magnitude that rounds to the overflow code
// (Inf included) gives the overflow code (fp8lab.gpu.codecs.cvt_special). `codes` packs
// NaN+ | NaN- << 8 | overflow+ << 16 | overflow- << 24.
#pragma once

#define FP8Q_MUL 0
#define FP8Q_DIV 1
#define FP8Q_F64 2
#define FP8Q_RCP 3

// Per-call parameters of one scaled conversion.
struct Fp8Q {
    float s;        // the scale
    float inv;      // FP8Q_MUL: 1 / s (exact); FP8Q_RCP: 1 / s correctly rounded; else 0
    int path;       // FP8Q_*: uniform over a call (callers may branch on it once, outside loops)
    unsigned int special;
    unsigned int codes;
};

__device__ __forceinline__ Fp8Q fp8q_make(float s, unsigned int special, unsigned int codes) {
    Fp8Q p;
    p.s = s;
    const unsigned int b = __float_as_uint(s);
    const bool in = b >= 0x21800000u && b <= 0x5D800000u;   // 2^-60 .. 2^60
    const bool pow2 = (b & 0x007FFFFFu) == 0u && in;
    p.path = pow2 ? FP8Q_MUL : in ? FP8Q_RCP : (s < 0x1p-60f ? FP8Q_F64 : FP8Q_DIV);
    p.inv = p.path == FP8Q_MUL || p.path == FP8Q_RCP ? __frcp_rn(s) : 0.0f;
    p.special = special;
    p.codes = codes;
    return p;
}

__device__ __forceinline__ int fp8q_path(const Fp8Q& p) { return p.path; }

// The truncation toward zero of x / s (bits) and whether x / s is inexact, from a faithful
// quotient q and its exact remainder (s >= 2^-60, s > 0).
__device__ __forceinline__ unsigned int fp8q_trunc(float q, float x, float s, bool& inexact) {
    const float r = __fmaf_rn(q, s, -x);
    const bool rp = r > 0.0f, rn = r < 0.0f;   // both false for r = 0 or NaN (x = +-Inf)
    inexact = rp || rn;
    return __float_as_uint(q) - (unsigned int)((rp && q > 0.0f) || (rn && q < 0.0f));
}

// s >= 2^-60 (fp8lab._scaling_kernels._F32_PATH_MIN_SCALE): the float32 truncation of x / s
// (bits) and whether x / s is inexact, from the IEEE quotient and its exact remainder. Shared with
// fp8_quantize_elem (quantize.cu), whose table path needs both parts.
__device__ __forceinline__ unsigned int fp8q_trunc_div(float x, float s, bool& inexact) {
    return fp8q_trunc(__fdiv_rn(x, s), x, s, inexact);
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

// The careful route: right for every x
template <int PATH>
__device__ __forceinline__ unsigned int fp8q_odd(float x, const Fp8Q& p) {
    if (PATH == FP8Q_MUL) return __float_as_uint(__fmul_rn(x, p.inv));
    if (PATH == FP8Q_DIV || PATH == FP8Q_RCP) return fp8q_odd_div(x, p.s);
    return fp8q_odd_f64(x, p.s);
}

// The fast route: right where its result's magnitude is below fp8q_fast_lim; no branch for
// FP8Q_MUL and FP8Q_RCP
template <int PATH>
__device__ __forceinline__ unsigned int fp8q_odd_fast(float x, const Fp8Q& p) {
    if (PATH != FP8Q_RCP) return fp8q_odd<PATH>(x, p);
    const float q0 = __fmul_rn(x, p.inv);
    const float q = __fmaf_rn(-__fmaf_rn(q0, p.s, -x), p.inv, q0);   // keeps -0
    bool inexact;
    const unsigned int b = fp8q_trunc(q, x, p.s, inexact);
    return b | (unsigned int)inexact;
}

// Bits of the smallest |fp8q_odd_fast| that needs the careful route: `special` or Inf (an
// infinite quotient may come from an infinite x, or from the fast route's overflow)
__device__ __forceinline__ unsigned int fp8q_fast_lim(const Fp8Q& p) {
    return min(p.special, 0x7F800000u);
}

// code for a magnitude at or above `special`: NaN (sign of the input x: GPU arithmetic does not
// keep a NaN's sign) or, without saturation, overflow
__device__ __forceinline__ unsigned int fp8q_special(unsigned int u, float x, unsigned int codes) {
    const int sh = ((u & 0x7FFFFFFFu) > 0x7F800000u ? 0 : 16) + ((__float_as_uint(x) >> 31) ? 8 : 0);
    return (codes >> sh) & 0xFFu;
}

// The hardware conversion of two round-to-odd quotients (bits): o0's code in the low byte, o1's
// in the high byte; right for magnitudes below `special` only. F: 1 E4M3, 2 E5M2.
template <int F>
__device__ __forceinline__ unsigned int fp8q_cvt2(unsigned int o0, unsigned int o1) {
    unsigned short two;
    if (F == 2) asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(two) : "r"(o1), "r"(o0));
    else asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(two) : "r"(o1), "r"(o0));
    return two;
}

// Running maximum of |o| (o: bits) that keeps NaN: a block of fp8q_odd_fast + fp8q_cvt2
// conversions is right when the bits of the result stay below fp8q_fast_lim (one check per block
// instead of a branch per pair).
__device__ __forceinline__ float fp8q_absmax(float m, unsigned int o) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(m), "f"(fabsf(__uint_as_float(o))));
    return r;
}

// Codes of x0 (low byte) and x1 (high byte) by path PATH. F: 1 E4M3, 2 E5M2.
template <int F, int PATH>
__device__ __forceinline__ unsigned int fp8q_pair(float x0, float x1, const Fp8Q& p) {
    const unsigned int o0 = fp8q_odd<PATH>(x0, p), o1 = fp8q_odd<PATH>(x1, p);
    unsigned int w = fp8q_cvt2<F>(o0, o1);
    if (max(o0 & 0x7FFFFFFFu, o1 & 0x7FFFFFFFu) >= p.special) {
        if ((o0 & 0x7FFFFFFFu) >= p.special) w = (w & 0xFF00u) | fp8q_special(o0, x0, p.codes);
        if ((o1 & 0x7FFFFFFFu) >= p.special) w = (w & 0x00FFu) | (fp8q_special(o1, x1, p.codes) << 8);
    }
    return w;
}

// The division routes of the run-time choice below, out of line: a loop that converts many
// pairs (the 8-bit epilogue: 32 per thread and tile) would otherwise inline an IEEE division per
// element, which multiplies the kernel's compile time (~100 s per instance) for a rare route.
// p by value: a reference would put it in local memory across the call.
template <int F>
__device__ __noinline__ unsigned int fp8q_pair_div(float x0, float x1, Fp8Q p) {
    if (fp8q_path(p) == FP8Q_F64) return fp8q_pair<F, FP8Q_F64>(x0, x1, p);
    return fp8q_pair<F, FP8Q_DIV>(x0, x1, p);
}

// The same, the path chosen at run time (one branch per pair)
template <int F>
__device__ __forceinline__ unsigned int fp8q_pair(float x0, float x1, const Fp8Q& p) {
    if (fp8q_path(p) == FP8Q_MUL) return fp8q_pair<F, FP8Q_MUL>(x0, x1, p);
    return fp8q_pair_div<F>(x0, x1, p);
}

// Codes of x0, x1 as a block of fp8q_odd_fast conversions would give them: the fast route, the
// careful one where the fast result reaches fp8q_fast_lim
template <int F, int PATH>
__device__ __forceinline__ unsigned int fp8q_pair_fast(float x0, float x1, const Fp8Q& p) {
    const unsigned int o0 = fp8q_odd_fast<PATH>(x0, p), o1 = fp8q_odd_fast<PATH>(x1, p);
    if (max(o0 & 0x7FFFFFFFu, o1 & 0x7FFFFFFFu) < fp8q_fast_lim(p)) return fp8q_cvt2<F>(o0, o1);
    return fp8q_pair<F, PATH>(x0, x1, p);
}

// Non-negative float32 bits of |x| for a running maximum of finite magnitudes (Inf, NaN: 0).
__device__ __forceinline__ unsigned int fp8q_mag(float x) {
    const unsigned int a = __float_as_uint(x) & 0x7FFFFFFFu;
    return a < 0x7F800000u ? a : 0u;
}

template <int V> struct Fp8qPath { static constexpr int value = V; };
