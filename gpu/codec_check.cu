// Exhaustive self-check of the float32 encoders over all 2^32 inputs (used by
// benchmarks/gpu_check.py and the slow GPU tests; no data moves through memory).
//
// Mapping: grid-stride over input bit patterns u in [start, start + count). For each u, three
// device paths are compared with the CPU's 2^17-entry float32 table (fp8lab.codecs._lut, itself
// proven equal to the CPU's generic encoder; held in shared memory):
//   [0] fp8_encode_f32_det      the production float32 fast path (32-bit integers)
//   [1] fp8_encode_generic<24>  the 64-bit port of encode_one on the float32 bits
//   [2] fp8_encode_generic<53>  the float64 path, on the same value widened to float64
// mism[k] counts mismatches of path k; first[k] keeps the smallest mismatching u.
#include "fp8_codec.cuh"

template <int MODE, bool SAT>
__global__ void __launch_bounds__(1024) fp8_check_f32_all(const u8* __restrict__ lut, u64 start, u64 count,
                                                          u64* mism, u32* first) {
    __shared__ FmtShared t;
    extern __shared__ __align__(16) u8 lut_s[];
    fmt_load_shared(t);
    for (int i = threadIdx.x; i < (1 << 17) / 16; i += blockDim.x)
        reinterpret_cast<uint4*>(lut_s)[i] = reinterpret_cast<const uint4*>(lut)[i];
    __syncthreads();
    u32 bad[3] = {0, 0, 0};
    for (u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x; k < count; k += (u64)gridDim.x * blockDim.x) {
        const u32 u = (u32)(start + k);
        const u8 ref = lut_s[fp8_lut32_index(u)];
        const u8 c0 = fp8_encode_f32_det<MODE, SAT>(u, t);
        const u8 c1 = fp8_encode_generic<24, 127, MODE, SAT>((u >> 31) != 0, (i64)(u & 0x7FFFFFFFu),
                                                             0x7F800000ll, t, 0, 0);
        // widen to float64 by hand for Inf/NaN (keeps the sign and payload as numpy does)
        const u64 d = ((u >> 23) & 0xFFu) == 0xFFu
                          ? ((u64)(u >> 31) << 63) | (0x7FFull << 52) | ((u64)(u & 0x7FFFFFu) << 29)
                          : (u64)__double_as_longlong((double)__uint_as_float(u));
        const u8 c2 = fp8_encode_generic<53, 1023, MODE, SAT>((d >> 63) != 0, (i64)(d & 0x7FFFFFFFFFFFFFFFull),
                                                              0x7FF0000000000000ll, t, 0, 0);
        if (c0 != ref) { bad[0]++; atomicMin(first + 0, u); }
        if (c1 != ref) { bad[1]++; atomicMin(first + 1, u); }
        if (c2 != ref) { bad[2]++; atomicMin(first + 2, u); }
    }
#pragma unroll
    for (int j = 0; j < 3; j++)
        if (bad[j]) atomicAdd(reinterpret_cast<unsigned long long*>(mism + j), (unsigned long long)bad[j]);
}
