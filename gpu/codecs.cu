// Element-wise codecs: encode (float -> 8-bit code) and decode (code -> float).
//
// Mapping: grid-stride over chunks of 16 elements; each thread loads one chunk with 16-byte vector
// loads (1, 2, 4 or 8 uint4 depending on the input width), encodes or decodes it, and stores it
// with 16-byte stores. Elements past the last whole chunk (or all, when a pointer is not 16-byte
// aligned: `vec` = 0) go through a scalar grid-stride tail. Element i of the flat C-order array is
// element i here too, so stochastic rounding draws the same random bits as the CPU.
// Tables: the per-binade tables (FmtShared) and, for USE_LUT, the CPU's 2^17-entry float32 table
// live in shared memory; decode's 256-entry output table too.
#include "fp8_codec.cuh"

// Input kinds (template argument KIND), the names fp8lab.gpu.codecs uses.
#define KIND_F32 0
#define KIND_F64 1
#define KIND_F16 2
#define KIND_BF16 3

template <int KIND> struct Bits { typedef u32 T; };
template <> struct Bits<KIND_F64> { typedef u64 T; };
template <> struct Bits<KIND_F16> { typedef u16 T; };
template <> struct Bits<KIND_BF16> { typedef u16 T; };

__device__ __forceinline__ u32 f16_to_f32_bits(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));  // exact
    return __float_as_uint(f);
}

template <int KIND, int MODE, bool SAT, bool USE_LUT>
__device__ __forceinline__ u8 encode_elem(typename Bits<KIND>::T b, const FmtShared& t,
                                          const u8* lut_s, u64 key, i64 idx) {
    if (KIND == KIND_F64) {
        const u64 v = (u64)b;
        return fp8_encode_generic<53, 1023, MODE, SAT>((v >> 63) != 0, (i64)(v & 0x7FFFFFFFFFFFFFFFull),
                                                       0x7FF0000000000000ll, t, key, idx);
    } else {
        u32 u;
        if (KIND == KIND_F32) u = (u32)b;
        else if (KIND == KIND_BF16) u = ((u32)b) << 16;
        else u = f16_to_f32_bits((u16)b);
        if (MODE == MODE_STOCHASTIC)
            return fp8_encode_generic<24, 127, MODE, SAT>((u >> 31) != 0, (i64)(u & 0x7FFFFFFFu),
                                                          0x7F800000ll, t, key, idx);
        if (USE_LUT) return lut_s[fp8_lut32_index(u)];
        return fp8_encode_f32_det<MODE, SAT>(u, t);
    }
}

template <int KIND, int MODE, bool SAT, bool USE_LUT>
__global__ void __launch_bounds__(1024) fp8_encode(const void* __restrict__ x, u8* __restrict__ out,
                                                  i64 n, int vec, u64 key, const u8* __restrict__ lut) {
    typedef typename Bits<KIND>::T BT;
    constexpr int NV = (int)sizeof(BT);  // uint4 loads per 16-element chunk
    __shared__ FmtShared t;
    extern __shared__ __align__(16) u8 lut_s[];
    fmt_load_shared(t);
    if (USE_LUT) {
        const uint4* src = reinterpret_cast<const uint4*>(lut);
        uint4* dst = reinterpret_cast<uint4*>(lut_s);
        for (int i = threadIdx.x; i < (1 << 17) / 16; i += blockDim.x) dst[i] = src[i];
    }
    __syncthreads();
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const i64 nchunk = vec ? n / 16 : 0;
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    uint4* ov = reinterpret_cast<uint4*>(out);
    for (i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x; c < nchunk; c += stride) {
        union { uint4 v[NV]; BT b[16]; } buf;
#pragma unroll
        for (int j = 0; j < NV; j++) buf.v[j] = __ldcs(xv + c * NV + j);
        u32 w[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            u32 acc = 0;
#pragma unroll
            for (int k = 0; k < 4; k++)
                acc |= (u32)encode_elem<KIND, MODE, SAT, USE_LUT>(buf.b[4 * j + k], t, lut_s, key,
                                                                   c * 16 + 4 * j + k) << (8 * k);
            w[j] = acc;
        }
        __stcs(ov + c, make_uint4(w[0], w[1], w[2], w[3]));
    }
    const BT* xs = reinterpret_cast<const BT*>(x);
    for (i64 i = nchunk * 16 + (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = encode_elem<KIND, MODE, SAT, USE_LUT>(xs[i], t, lut_s, key, i);
}

// Decode through a 256-entry table of the output type's bits (Format.decode_table(dtype)).
// OUT_BYTES: 2 (float16 / bfloat16), 4 (float32), 8 (float64).
template <int OUT_BYTES> struct OutBits { typedef u32 T; };
template <> struct OutBits<2> { typedef u16 T; };
template <> struct OutBits<8> { typedef u64 T; };

template <int OUT_BYTES>
__global__ void __launch_bounds__(1024) fp8_decode(const u8* __restrict__ codes, void* __restrict__ out,
                                                  i64 n, int vec, const void* __restrict__ table) {
    typedef typename OutBits<OUT_BYTES>::T OT;
    constexpr int NV = OUT_BYTES;  // uint4 stores per 16 codes
    __shared__ OT tab[256];
    for (int i = threadIdx.x; i < 256; i += blockDim.x) tab[i] = reinterpret_cast<const OT*>(table)[i];
    __syncthreads();
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const i64 nchunk = vec ? n / 16 : 0;
    const uint4* cv = reinterpret_cast<const uint4*>(codes);
    uint4* ov = reinterpret_cast<uint4*>(out);
    for (i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x; c < nchunk; c += stride) {
        const uint4 in = __ldcs(cv + c);
        const u32 w[4] = {in.x, in.y, in.z, in.w};
        union { uint4 v[NV]; OT b[16]; } buf;
#pragma unroll
        for (int k = 0; k < 16; k++) buf.b[k] = tab[(w[k >> 2] >> (8 * (k & 3))) & 0xFFu];
#pragma unroll
        for (int j = 0; j < NV; j++) __stcs(ov + c * NV + j, buf.v[j]);
    }
    OT* os = reinterpret_cast<OT*>(out);
    for (i64 i = nchunk * 16 + (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        os[i] = tab[codes[i]];
}
