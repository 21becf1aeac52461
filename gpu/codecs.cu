// Element-wise codecs: encode (float -> 8-bit code) and decode (code -> float).
// Which kernel runs (fp8lab.gpu.codecs): float32 in a deterministic mode, fp8_encode_cvt (E4M3/E5M2,
// nearest even) or fp8_encode_lut32; float16/bfloat16/float64 and stochastic rounding, fp8_encode;
// decode, fp8_decode_v3.
//
// Mapping: elements go in groups of 4 (one 32-bit word of codes). A block handles UNROLL * blockDim
// groups per step, thread t taking groups t, t + blockDim, ... so that every load and store
// instruction of a warp is contiguous (coalesced): encode reads 4 inputs (16 bytes of float32) and
// writes one word; decode reads one word and writes 4 outputs (16 bytes of float32). Grid-stride.
// Elements past the last whole step (or all, when a pointer is not 16-byte aligned: `vec` = 0) go
// through a scalar grid-stride tail. Element i of the flat C-order array is
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
    // Inf/NaN by hand: cvt would canonicalize NaN and drop its sign (numpy keeps both)
    if ((h & 0x7C00u) == 0x7C00u)
        return ((u32)(h & 0x8000u) << 16) | 0x7F800000u | ((u32)(h & 0x3FFu) << 13);
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

#define UNROLL 4
// 4 elements of a given width in one vector load / store
struct U64x4 { ulonglong2 a, b; };
template <int BYTES> struct Vec4 { typedef uint4 T; };     // 4 x 4 bytes
template <> struct Vec4<2> { typedef uint2 T; };           // 4 x 2 bytes
template <> struct Vec4<8> { typedef U64x4 T; };           // 4 x 8 bytes (two 16-byte accesses)
__device__ __forceinline__ uint4 ldcs4(const uint4* p) { return __ldcs(p); }
__device__ __forceinline__ uint2 ldcs4(const uint2* p) { return __ldcs(p); }
__device__ __forceinline__ U64x4 ldcs4(const U64x4* p) {
    const ulonglong2* q = reinterpret_cast<const ulonglong2*>(p);
    U64x4 r; r.a = __ldcs(q); r.b = __ldcs(q + 1); return r;
}
__device__ __forceinline__ void stcs4(uint4* p, uint4 v) { __stcs(p, v); }
__device__ __forceinline__ void stcs4(uint2* p, uint2 v) { __stcs(p, v); }
__device__ __forceinline__ void stcs4(U64x4* p, U64x4 v) {
    ulonglong2* q = reinterpret_cast<ulonglong2*>(p); __stcs(q, v.a); __stcs(q + 1, v.b);
}

template <int KIND, int MODE, bool SAT, bool USE_LUT>
__global__ void __launch_bounds__(1024) fp8_encode(const void* __restrict__ x, u8* __restrict__ out,
                                                  i64 n, int vec, u64 key, const u8* __restrict__ lut) {
    typedef typename Bits<KIND>::T BT;
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
    const i64 step = (i64)UNROLL * blockDim.x;                 // groups of 4 per block step
    const i64 nsteps = vec ? n / (4 * step) : 0;
    const i64 nfull = nsteps * step * 4;                       // elements of the vector part
    typedef typename Vec4<sizeof(BT)>::T V4;                   // 4 inputs in one load
    const V4* xv = reinterpret_cast<const V4*>(x);
    u32* ow = reinterpret_cast<u32*>(out);
    for (i64 st = blockIdx.x; st < nsteps; st += gridDim.x) {
        const i64 g0 = st * step + threadIdx.x;
        union { V4 v; BT b[4]; } buf[UNROLL];
#pragma unroll
        for (int j = 0; j < UNROLL; j++) buf[j].v = ldcs4(xv + g0 + j * blockDim.x);
#pragma unroll
        for (int j = 0; j < UNROLL; j++) {
            const i64 g = g0 + j * blockDim.x;
            u32 acc = 0;
#pragma unroll
            for (int k = 0; k < 4; k++)
                acc |= (u32)encode_elem<KIND, MODE, SAT, USE_LUT>(buf[j].b[k], t, lut_s, key, 4 * g + k) << (8 * k);
            __stcs(ow + g, acc);
        }
    }
    const BT* xs = reinterpret_cast<const BT*>(x);
    for (i64 i = nfull + (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = encode_elem<KIND, MODE, SAT, USE_LUT>(xs[i], t, lut_s, key, i);
}

// Decode tables hold the output type's bits (Format.decode_table(dtype)).
// OUT_BYTES: 2 (float16 / bfloat16), 4 (float32), 8 (float64).
template <int OUT_BYTES> struct OutBits { typedef u32 T; };
template <> struct OutBits<2> { typedef u16 T; };
template <> struct OutBits<8> { typedef u64 T; };

// ---- v3: float32 table encode and decode with more bytes in flight per SM -------------------
//
// The loop shared by the float32 encoders: groups of 4 elements (one uint4 in, one word of codes
// out), UNR groups per thread and block step with all loads issued first, thread t taking groups
// t, t + blockDim, ... (coalesced); then a scalar grid-stride tail. `enc.word(uint4)` encodes a
// group, `enc.one(u32)` one element. CS: streaming cache hints on the loads and stores.
template <int UNR, bool CS, class Enc>
__device__ __forceinline__ void encode_f32_groups(const u32* __restrict__ x, u8* __restrict__ out, i64 n,
                                                  int vec, const Enc& enc) {
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const i64 step = (i64)UNR * blockDim.x;
    const i64 nsteps = vec ? n / (4 * step) : 0;
    const i64 nfull = nsteps * step * 4;
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    u32* ow = reinterpret_cast<u32*>(out);
    for (i64 st = blockIdx.x; st < nsteps; st += gridDim.x) {
        const i64 g0 = st * step + threadIdx.x;
        uint4 buf[UNR];
#pragma unroll
        for (int j = 0; j < UNR; j++) buf[j] = CS ? __ldcs(xv + g0 + j * blockDim.x) : xv[g0 + j * blockDim.x];
#pragma unroll
        for (int j = 0; j < UNR; j++) {
            const u32 acc = enc.word(buf[j]);
            if (CS) __stcs(ow + g0 + j * blockDim.x, acc);
            else ow[g0 + j * blockDim.x] = acc;
        }
    }
    for (i64 i = nfull + (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = enc.one(x[i]);
}

// fp8_encode_lut32<UNR, HALF, CS, GLOBAL>: float32 deterministic modes through the CPU's float32
// table, in the loop of encode_f32_groups. HALF: the table in shared memory holds only the 2^16
// entries of the positive half (index bit 16 is the sign bit) plus a 256-entry map `neg` from a
// positive result code to the code of the negated input; fp8lab.gpu.codecs builds that map from
// the CPU table and uses HALF only when neg[lut[i]] == lut[i + 2^16] for all 2^16 i (checked on
// the host, so the halved lookup equals the full one entry for entry). 64 KB + 256 B per block:
// two or three blocks per SM instead of one.
// GLOBAL (not with HALF): no copy into shared memory; lookups read the table in global memory
// through the read-only cache (__ldg), so blocks need not stay resident (any grid shape).
template <bool HALF, bool GLOBAL>
struct LutEnc {
    const u8* lut;   // the table (shared or, GLOBAL, global memory)
    __device__ __forceinline__ u8 one(u32 u) const {
        if (HALF) {
            const u8 c = lut[((u >> 15) & 0xFFFEu) | ((u & 0xFFFFu) != 0u ? 1u : 0u)];
            return (u >> 31) ? lut[(1 << 16) + c] : c;   // the sign map follows the half table
        }
        return GLOBAL ? __ldg(lut + fp8_lut32_index(u)) : lut[fp8_lut32_index(u)];
    }
    __device__ __forceinline__ u32 word(uint4 w) const {
        return (u32)one(w.x) | ((u32)one(w.y) << 8) | ((u32)one(w.z) << 16) | ((u32)one(w.w) << 24);
    }
};

template <int UNR, bool HALF, bool CS, bool GLOBAL>
__global__ void __launch_bounds__(1024) fp8_encode_lut32(const u32* __restrict__ x, u8* __restrict__ out,
                                                        i64 n, int vec, const u8* __restrict__ lut) {
    static_assert(!(HALF && GLOBAL), "the half table lives in shared memory");
    extern __shared__ __align__(16) u8 lut_sm[];
    constexpr int TBYTES = HALF ? (1 << 16) + 256 : (1 << 17);
    if (!GLOBAL) {
        const uint4* src = reinterpret_cast<const uint4*>(lut);
        uint4* dst = reinterpret_cast<uint4*>(lut_sm);
        for (int i = threadIdx.x; i < TBYTES / 16; i += blockDim.x) dst[i] = __ldg(src + i);
        __syncthreads();
    }
    encode_f32_groups<UNR, CS>(x, out, n, vec, LutEnc<HALF, GLOBAL>{GLOBAL ? lut : lut_sm});
}

// fp8_decode_v3<OUT_BYTES, UNR, REPL>: each thread reads UNR words of 4 codes per step (all loads
// first) and writes 4 outputs per word through the 256-entry table (coalesced as in fp8_encode).
// REPL (OUT_BYTES 2 or 4): the table is held 32 times in shared memory, entry c of copy l at word
// 32 c + l, and lane l reads copy l: every lookup of a warp hits 32 distinct banks (no conflicts
// whatever the codes), 32 KB per block.
template <int OUT_BYTES, int UNR, bool REPL>
__global__ void __launch_bounds__(1024) fp8_decode_v3(const u8* __restrict__ codes, void* __restrict__ out,
                                                     i64 n, int vec, const void* __restrict__ table) {
    static_assert(!REPL || OUT_BYTES <= 4, "REPL holds table entries in 32-bit words");
    typedef typename OutBits<OUT_BYTES>::T OT;
    extern __shared__ __align__(16) u8 dsm[];
    u32* rtab = reinterpret_cast<u32*>(dsm);      // REPL: 256 x 32 words
    OT* tab = reinterpret_cast<OT*>(dsm);         // else: 256 entries
    if (REPL) {
        for (int i = threadIdx.x; i < 256 * 32; i += blockDim.x)
            rtab[i] = (u32)reinterpret_cast<const OT*>(table)[i >> 5];
    } else {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) tab[i] = reinterpret_cast<const OT*>(table)[i];
    }
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const i64 step = (i64)UNR * blockDim.x;
    const i64 nsteps = vec ? n / (4 * step) : 0;
    const i64 nfull = nsteps * step * 4;
    typedef typename Vec4<OUT_BYTES>::T V4;
    const u32* cw = reinterpret_cast<const u32*>(codes);
    V4* ov = reinterpret_cast<V4*>(out);
    for (i64 st = blockIdx.x; st < nsteps; st += gridDim.x) {
        const i64 g0 = st * step + threadIdx.x;
        u32 w[UNR];
#pragma unroll
        for (int j = 0; j < UNR; j++) w[j] = __ldcs(cw + g0 + j * blockDim.x);
#pragma unroll
        for (int j = 0; j < UNR; j++) {
            union { V4 v; OT b[4]; } buf;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const u32 c = (w[j] >> (8 * k)) & 0xFFu;
                buf.b[k] = REPL ? (OT)rtab[(c << 5) | lane] : tab[c];
            }
            stcs4(ov + g0 + j * blockDim.x, buf.v);
        }
    }
    OT* os = reinterpret_cast<OT*>(out);
    for (i64 i = nfull + (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const u32 c = codes[i];
        os[i] = REPL ? (OT)rtab[(c << 5) | lane] : tab[c];
    }
}

// ---- v4: float32 -> e4m3 / e5m2, round to nearest even, through the hardware conversion -------
//
// fp8_encode_cvt<E5M2, SAT, UNR>: `cvt.rn.satfinite.{e4m3,e5m2}x2.f32` (sm_89+) turns two float32
// into two OCP codes, correctly rounded to nearest even, with finite overflow and +-Inf going to
// +-max (the SATFINITE convention of the contract's saturating mode). What the instruction does
// differently from the contract is routed to the generic encoder (fp8_encode_f32_det, exact by
// construction): every element with |x| bits >= `special` (passed by fp8lab.gpu.codecs, derived
// from the CPU table: the first magnitude that overflows without saturation; NaN only with it),
// i.e. NaN (the contract keeps NaN's sign, E5M2 emits 0x7E) and non-saturating overflow. A group
// of 4 takes that branch only if one of its elements needs it. Loop: encode_f32_groups.
template <bool E5M2, bool SAT>
struct CvtEnc {
    const FmtShared* t;
    u32 special;
    __device__ __forceinline__ u8 one(u32 u) const { return fp8_encode_f32_det<MODE_NEAREST_EVEN, SAT>(u, *t); }
    __device__ __forceinline__ u32 word(uint4 w) const {
        u16 lo, hi;   // cvt packs its first source into the upper byte
        if (E5M2) {
            asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(lo) : "r"(w.y), "r"(w.x));
            asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(hi) : "r"(w.w), "r"(w.z));
        } else {
            asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "r"(w.y), "r"(w.x));
            asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "r"(w.w), "r"(w.z));
        }
        const bool any = ((w.x & 0x7FFFFFFFu) >= special) | ((w.y & 0x7FFFFFFFu) >= special) |
                         ((w.z & 0x7FFFFFFFu) >= special) | ((w.w & 0x7FFFFFFFu) >= special);
        if (any)
            return (u32)one(w.x) | ((u32)one(w.y) << 8) | ((u32)one(w.z) << 16) | ((u32)one(w.w) << 24);
        return (u32)lo | ((u32)hi << 16);
    }
};

template <bool E5M2, bool SAT, int UNR, bool CS>
__global__ void __launch_bounds__(1024) fp8_encode_cvt(const u32* __restrict__ x, u8* __restrict__ out,
                                                      i64 n, int vec, u32 special) {
    __shared__ FmtShared t;
    fmt_load_shared(t);
    __syncthreads();
    encode_f32_groups<UNR, CS>(x, out, n, vec, CvtEnc<E5M2, SAT>{&t, special});
}
