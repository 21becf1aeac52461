// Scaled quantization of float32 arrays, the device twin of fp8lab._scaling_kernels.
//
// fp8_scales: one scale per block maximum, the rule of _scaling_kernels.scale_of (compute_scale)
// in the same double-precision arithmetic, so the scales never visit the host.
//
// fp8_quantize_f32<MODE, SAT, CVT, TENSOR>: code = encode(x / s) for deterministic modes, the
// quotient rounded once, as the CPU's float32 route does it: q = fl32(x / s) (IEEE division) and
// r = fl32(q * s - x) (one fma, exact: the remainder of a correctly rounded division) give the
// float32 truncation of x / s, b, and whether x / s is inexact. Then either
//   - the CPU's 2^17-entry float32 table at index 2 * (b >> 16) + sticky (CVT = 0), or
//   - the hardware conversion of the round-to-odd float32 (b | inexact), which rounds to the
//     same code as x / s (24 bits hold the 8-bit formats' 2 + m bits) (CVT = 1 for E4M3, 2 for
//     E5M2, nearest even; NaN and non-saturating overflow, |b| >= special, go to the generic
//     encoder, as in fp8_encode_cvt).
// Scales below 2^-60 (where the remainder could underflow) divide in float64 and use the generic
// encoder on the float64 quotient, as the CPU does. TENSOR: one scale; else element i of the
// (P, R, C) array has scale scales[(p * nbR + r / BR) * nbC + c / BC].
#include "fp8_codec.cuh"

// The CPU's scale_of (fp8lab._scaling_kernels), operation for operation: change both.
__device__ __forceinline__ double fp8_scale_of(double amax, double target, int emax, int rule, int margin) {
    if (amax == 0.0) return 1.0;
    if (isinf(amax)) return ldexp(1.0, 127);
    double s;
    if (rule == 0) {
        s = (double)(float)(amax / target) * ldexp(1.0, margin);
        if (s == 0.0) s = ldexp(1.0, -127);
    } else {
        int e1, e2;
        const double m1 = frexp(amax, &e1);
        int k;
        if (rule == 2) {
            k = e1 - 1 - emax;
        } else {
            const double m2 = frexp(target, &e2);
            k = m1 <= m2 ? e1 - e2 : e1 - e2 + 1;
        }
        k += margin;
        k = min(max(k, -127), 127);
        s = ldexp(1.0, k);
    }
    s = s < ldexp(1.0, -127) ? ldexp(1.0, -127) : (s > ldexp(1.0, 127) ? ldexp(1.0, 127) : s);
    return (double)(float)s;
}

extern "C" __global__ void fp8_scales(const double* __restrict__ amax, float* __restrict__ out, int n,
                                      double target, int emax, int rule, int margin) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (float)fp8_scale_of(amax[i], target, emax, rule, margin);
}

template <int MODE, bool SAT, int CVT>
__device__ __forceinline__ u8 fp8_quantize_elem(u32 xb, float s, const FmtShared& t, const u8* lut,
                                                u32 special) {
    const float xv = __uint_as_float(xb);
    if (s < 0x1p-60f) {   // fp8lab._scaling_kernels._F32_PATH_MIN_SCALE
        const double q = (double)xv / (double)s;
        const u64 v = (u64)__double_as_longlong(q);
        return fp8_encode_generic<53, 1023, MODE, SAT>((v >> 63) != 0, (i64)(v & 0x7FFFFFFFFFFFFFFFull),
                                                       0x7FF0000000000000ll, t, 0, 0);
    }
    const float q = __fdiv_rn(xv, s);
    const float r = __fmaf_rn(q, s, -xv);
    const bool rp = r > 0.0f, rn = r < 0.0f;   // both false for r = 0 or NaN (x = +-Inf)
    const u32 b = __float_as_uint(q) - (u32)((rp && q > 0.0f) || (rn && q < 0.0f));
    if (CVT) {
        const u32 odd = b | (u32)(rp || rn);
        if ((odd & 0x7FFFFFFFu) >= special) return fp8_encode_f32_det<MODE, SAT>(odd, t);
        u16 two;
        if (CVT == 2)
            asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(two) : "f"(0.0f), "r"(odd));
        else
            asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(two) : "f"(0.0f), "r"(odd));
        return (u8)(two & 0xFFu);
    }
    return lut[((b >> 15) & 0x1FFFEu) | ((rp || rn || (b & 0xFFFFu) != 0u) ? 1u : 0u)];
}

template <int MODE, bool SAT, int CVT, bool TENSOR>
__global__ void __launch_bounds__(1024) fp8_quantize_f32(const u32* __restrict__ x, u8* __restrict__ out,
                                                        i64 n, int vec, const float* __restrict__ scales,
                                                        int R, int C, int BR, int BC, int nbR, int nbC,
                                                        const u8* __restrict__ lut, u32 special) {
    __shared__ FmtShared t;
    extern __shared__ __align__(16) u8 lut_s[];
    fmt_load_shared(t);
    if (!CVT) {
        const uint4* src = reinterpret_cast<const uint4*>(lut);
        uint4* dst = reinterpret_cast<uint4*>(lut_s);
        for (int i = threadIdx.x; i < (1 << 17) / 16; i += blockDim.x) dst[i] = src[i];
    }
    __syncthreads();
    const i64 stride = (i64)gridDim.x * blockDim.x;
    if (TENSOR) {
        const float s = scales[0];
        const i64 nv = vec ? n / 4 : 0;
        const uint4* xv = reinterpret_cast<const uint4*>(x);
        u32* ow = reinterpret_cast<u32*>(out);
        for (i64 g = (i64)blockIdx.x * blockDim.x + threadIdx.x; g < nv; g += stride) {
            const uint4 w = __ldcs(xv + g);
            const u32 acc = (u32)fp8_quantize_elem<MODE, SAT, CVT>(w.x, s, t, lut_s, special) |
                            ((u32)fp8_quantize_elem<MODE, SAT, CVT>(w.y, s, t, lut_s, special) << 8) |
                            ((u32)fp8_quantize_elem<MODE, SAT, CVT>(w.z, s, t, lut_s, special) << 16) |
                            ((u32)fp8_quantize_elem<MODE, SAT, CVT>(w.w, s, t, lut_s, special) << 24);
            __stcs(ow + g, acc);
        }
        for (i64 i = 4 * nv + (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
            out[i] = fp8_quantize_elem<MODE, SAT, CVT>(x[i], s, t, lut_s, special);
    } else {
        const i64 RC = (i64)R * C;
        for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
            const i64 p = i / RC;
            const i64 rc = i - p * RC;
            const int r = (int)(rc / C), c = (int)(rc - (i64)r * C);
            const float s = scales[(p * nbR + r / BR) * nbC + c / BC];
            out[i] = fp8_quantize_elem<MODE, SAT, CVT>(x[i], s, t, lut_s, special);
        }
    }
}
