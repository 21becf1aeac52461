// Scaled quantization of float32 arrays, the device twin of fp8lab._scaling_kernels.
//
// fp8_scales: one scale per block maximum, the rule of _scaling_kernels.scale_of (compute_scale)
// in the same double-precision arithmetic, so the scales never visit the host.
//
// fp8_quantize_f32<MODE, SAT, CVT, TENSOR>: code = encode(x / s) for deterministic modes, the
// quotient rounded once, as the CPU's float32 route does it: q = fl32(x / s) (IEEE division) and
// r = fl32(q * s - x) (one fma, exact: the remainder of a correctly rounded division) give the
// float32 truncation of x / s, b, and whether x / s is inexact (fp8q_trunc_div, fp8_cvt.cuh).
// Then either
//   - the CPU's 2^17-entry float32 table at index 2 * (b >> 16) + sticky (CVT = 0), or
//   - the hardware conversion of the round-to-odd float32 (b | inexact), which rounds to the
//     same code as x / s (24 bits hold the 8-bit formats' 2 + m bits) (CVT = 1 for E4M3, 2 for
//     E5M2, nearest even; NaN and non-saturating overflow, |b| >= special, go to the generic
//     encoder, as in fp8_encode_cvt).
// Scales below 2^-60 (where the remainder could underflow) divide in float64 and use the generic
// encoder on the float64 quotient, as the CPU does. TENSOR: one scale; else element i of the
// (P, R, C) array has scale scales[(p * nbR + r / BR) * nbC + c / BC].
#include "fp8_codec.cuh"
#include "fp8_cvt.cuh"

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
    // NaN: encoded from x itself (GPU arithmetic returns a NaN without x's sign; the CPU's keeps it)
    if ((xb & 0x7FFFFFFFu) > 0x7F800000u) return fp8_encode_f32_det<MODE, SAT>(xb, t);
    if (s < 0x1p-60f) {   // fp8lab._scaling_kernels._F32_PATH_MIN_SCALE
        const double q = (double)xv / (double)s;
        const u64 v = (u64)__double_as_longlong(q);
        return fp8_encode_generic<53, 1023, MODE, SAT>((v >> 63) != 0, (i64)(v & 0x7FFFFFFFFFFFFFFFull),
                                                       0x7FF0000000000000ll, t, 0, 0);
    }
    bool inexact;
    const u32 b = fp8q_trunc_div(xv, s, inexact);
    if (CVT) {
        const u32 odd = b | (u32)inexact;
        if ((odd & 0x7FFFFFFFu) >= special) return fp8_encode_f32_det<MODE, SAT>(odd, t);
        u16 two;
        if (CVT == 2)
            asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(two) : "f"(0.0f), "r"(odd));
        else
            asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(two) : "f"(0.0f), "r"(odd));
        return (u8)(two & 0xFFu);
    }
    return lut[((b >> 15) & 0x1FFFEu) | ((inexact || (b & 0xFFFFu) != 0u) ? 1u : 0u)];
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

// fp8_cast_transpose<MODE, SAT, CVT>: one pass over a 2-D float32 x (R x C, row stride ldx
// elements) at one scale held on the device (*scale, read by every block: no host round trip):
//   - the codes, fp8_quantize_elem per element (the same codes as fp8_quantize_f32), row-major
//     into out (row stride ldo bytes);
//   - if outt is not null, the same codes transposed into outt (C rows of stride ldt bytes), through
//     a 64 x 64 shared-memory tile (the layout fp8lab.gpu.gemm reads K-major operands in);
//   - the maximum finite |x|, atomicMax'ed once per block into *amax as float32 bits (non-negative
//     floats order as their bit patterns; Inf and NaN count as 0, as in the block maxima).
// Blocks of 256 threads (16 x 16, four consecutive columns each) walk the 64 x 64 tiles with a
// grid stride; each thread issues its four 16-byte loads before converting.
template <int MODE, bool SAT, int CVT>
__global__ void __launch_bounds__(256) fp8_cast_transpose(const float* __restrict__ x, u8* __restrict__ out,
                                                          u8* __restrict__ outt, u32* __restrict__ amax,
                                                          const float* __restrict__ scale, int R, int C,
                                                          i64 ldx, i64 ldo, i64 ldt, const u8* __restrict__ lut,
                                                          u32 special) {
    __shared__ FmtShared t;
    __shared__ u32 tile[64][17];   // 64 rows of 64 codes (+1 word: odd stride for the column reads)
    __shared__ u32 wmax[8];
    fmt_load_shared(t);
    __syncthreads();
    const float s = *scale;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const bool vec = (ldx & 3) == 0 && ((size_t)x & 15) == 0;
    const bool vecw = (ldo & 3) == 0 && ((size_t)out & 3) == 0;
    const bool vect = (ldt & 3) == 0 && ((size_t)outt & 3) == 0;
    const u8* tb = reinterpret_cast<const u8*>(&tile[0][0]);
    const int ntc = (C + 63) / 64;
    const int ntiles = ntc * ((R + 63) / 64);   // < 2^31 (checked by the caller)
    u32 m = 0;
    for (int tl = blockIdx.x; tl < ntiles; tl += gridDim.x) {
        const int r0 = (tl / ntc) * 64, c0 = (tl % ntc) * 64;
        const int c = c0 + 4 * tx;
        u32 xb[4][4];
#pragma unroll
        for (int p = 0; p < 4; p++) {
            const int r = r0 + ty + 16 * p;
            xb[p][0] = xb[p][1] = xb[p][2] = xb[p][3] = 0u;
            if (r < R) {
                const float* row = x + (i64)r * ldx;
                if (vec && c + 3 < C) {
                    const float4 v = *reinterpret_cast<const float4*>(row + c);
                    xb[p][0] = __float_as_uint(v.x); xb[p][1] = __float_as_uint(v.y);
                    xb[p][2] = __float_as_uint(v.z); xb[p][3] = __float_as_uint(v.w);
                } else {
                    for (int i = 0; i < 4; i++) if (c + i < C) xb[p][i] = __float_as_uint(row[c + i]);
                }
            }
        }
#pragma unroll
        for (int p = 0; p < 4; p++) {
            const int r = r0 + ty + 16 * p;
            u32 w = 0;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const u32 a = xb[p][i] & 0x7FFFFFFFu;
                if (a < 0x7F800000u) m = max(m, a);
                w |= (u32)fp8_quantize_elem<MODE, SAT, CVT>(xb[p][i], s, t, lut, special) << (8 * i);
            }
            if (r < R) {
                u8* orow = out + (i64)r * ldo;
                if (vecw && c + 3 < C) *reinterpret_cast<u32*>(orow + c) = w;
                else for (int i = 0; i < 4; i++) if (c + i < C) orow[c + i] = (u8)(w >> (8 * i));
            }
            tile[ty + 16 * p][tx] = w;
        }
        if (outt == nullptr) continue;
        __syncthreads();
#pragma unroll
        for (int p = 0; p < 4; p++) {
            const int cc = ty + 16 * p, ct = c0 + cc, r = r0 + 4 * tx;
            if (ct >= C) continue;
            u32 w = 0;
#pragma unroll
            for (int i = 0; i < 4; i++) w |= (u32)tb[(4 * tx + i) * 68 + cc] << (8 * i);
            u8* trow = outt + (i64)ct * ldt;
            if (vect && r + 3 < R) *reinterpret_cast<u32*>(trow + r) = w;
            else for (int i = 0; i < 4; i++) if (r + i < R) trow[r + i] = (u8)(w >> (8 * i));
        }
        __syncthreads();   // the tile is rewritten by the next iteration
    }
    m = __reduce_max_sync(0xFFFFFFFFu, m);
    if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < 8; w++) m = max(m, wmax[w]);
        if (m != 0u) atomicMax(amax, m);
    }
}
