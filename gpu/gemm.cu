// Scaled GEMM of 8-bit operands of any fp8lab format, decoded in the kernel to fp16 and multiplied
// on fp16 tensor cores (mma.sync m16n8k16) with fp32 accumulation. Every fp8lab format's values
// are exact in fp16, so the products are exact and only fp32 accumulation rounds.
//
//   C[m, n] = sum_k decA(A[m, k]) * decB(B[k, n]) * scales       (out: float32, bfloat16, float16)
//   A: M x K row-major (lda).  B: NT layout (C = A * B^T): N x K row-major; NN (C = A * B): K x N.
//   Scales (SCALE): 0 per-tensor sa[0] * sb[0]; 1 per-row sa[m] * per-column sb[n];
//   2 blocks: sa[m, kb] (1 x 128, shape M x KB) and sb[nb, kb] (128 x 128, shape NB x KB), applied
//   to an fp32 partial sum promoted into the fp32 accumulator every 128 K-elements.
//
// Tiles: block 128 x 128 x 32, 256 threads = 8 warps as 2 (m) x 4 (n), warp tile 64 x 32 = 4 x 4
// mma tiles. Global -> registers (prefetch of the next K-tile) -> decode through the 256-entry fp16
// tables in shared memory -> shared tiles As[m][k], Bs[n][k] (rows padded by 8 halves: conflict-free
// fragment loads) -> fragments. Ragged M, N, K: out-of-range elements load as 0.
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#define BK 32
#define PAD 8
#define NTHREADS 256
#define SCALE_BLOCK 128

__device__ __forceinline__ u16 f32_to_out16(float x, int bf) {
    u16 h;
    if (bf) asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    else asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

// 16 consecutive bytes of a row (bounds-checked: bytes past `lim` read as code 0 = value 0)
__device__ __forceinline__ uint4 load16(const u8* p, int avail, bool vec_ok) {
    if (vec_ok && avail >= 16) return __ldg(reinterpret_cast<const uint4*>(p));
    u32 w[4] = {0, 0, 0, 0};
    for (int i = 0; i < 16 && i < avail; i++) w[i >> 2] |= (u32)p[i] << (8 * (i & 3));
    return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ u32 dec2(const u16* tab, u32 w, int sh) {
    return (u32)tab[(w >> sh) & 0xFF] | ((u32)tab[(w >> (sh + 8)) & 0xFF] << 16);
}

template <int NN, int SCALE, int OUT>
__global__ void __launch_bounds__(NTHREADS) fp8_gemm_f16(
        const u8* __restrict__ A, const u8* __restrict__ B, void* __restrict__ C,
        int M, int N, int K, int lda, int ldb, int ldc,
        const u16* __restrict__ tabA, const u16* __restrict__ tabB,
        const float* __restrict__ sa, const float* __restrict__ sb, int kblocks) {
    __shared__ __align__(16) u16 As[BM][BK + PAD];
    __shared__ __align__(16) u16 Bs[BN][BK + PAD];
    __shared__ u16 tA[256], tB[256];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 2, wn = warp & 3, g = lane >> 2, t4 = lane & 3;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    tA[tid] = tabA[tid];
    tB[tid] = tabB[tid];
    const bool vecA = (lda % 16) == 0 && ((size_t)A % 16) == 0;
    const bool vecB = (ldb % 16) == 0 && ((size_t)B % 16) == 0;

    float acc[4][4][4], part[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[i][j][r] = 0.f, part[i][j][r] = 0.f;

    // A: thread -> row tid/2, bytes (tid%2)*16 of the K-tile. B (NT) likewise over N rows.
    // B (NN): thread -> k-row tid/8, bytes (tid%8)*16 of the 128 columns.
    const int ar = tid >> 1, ac = (tid & 1) * 16;
    const int bkr = tid >> 3, bnc = (tid & 7) * 16;
    auto loadA = [&](int k0) -> uint4 {
        const int m = m0 + ar, k = k0 + ac;
        if (m >= M || k >= K) return make_uint4(0, 0, 0, 0);
        return load16(A + (size_t)m * lda + k, K - k, vecA);
    };
    auto loadB = [&](int k0) -> uint4 {
        if (NN) {
            const int k = k0 + bkr, n = n0 + bnc;
            if (k >= K || n >= N) return make_uint4(0, 0, 0, 0);
            return load16(B + (size_t)k * ldb + n, N - n, vecB);
        } else {
            const int n = n0 + ar, k = k0 + ac;
            if (n >= N || k >= K) return make_uint4(0, 0, 0, 0);
            return load16(B + (size_t)n * ldb + k, K - k, vecB);
        }
    };
    uint4 ra = loadA(0), rb = loadB(0);
    __syncthreads();  // tables
    const int ktiles = (K + BK - 1) / BK;
    for (int kt = 0; kt < ktiles; kt++) {
        {   // decode the prefetched tile into shared memory
            const u32 wa[4] = {ra.x, ra.y, ra.z, ra.w};
            uint4 lo, hi;
            lo = make_uint4(dec2(tA, wa[0], 0), dec2(tA, wa[0], 16), dec2(tA, wa[1], 0), dec2(tA, wa[1], 16));
            hi = make_uint4(dec2(tA, wa[2], 0), dec2(tA, wa[2], 16), dec2(tA, wa[3], 0), dec2(tA, wa[3], 16));
            *reinterpret_cast<uint4*>(&As[ar][ac]) = lo;
            *reinterpret_cast<uint4*>(&As[ar][ac + 8]) = hi;
            const u32 wb[4] = {rb.x, rb.y, rb.z, rb.w};
            if (NN) {
#pragma unroll
                for (int i = 0; i < 16; i++) Bs[bnc + i][bkr] = tB[(wb[i >> 2] >> (8 * (i & 3))) & 0xFF];
            } else {
                lo = make_uint4(dec2(tB, wb[0], 0), dec2(tB, wb[0], 16), dec2(tB, wb[1], 0), dec2(tB, wb[1], 16));
                hi = make_uint4(dec2(tB, wb[2], 0), dec2(tB, wb[2], 16), dec2(tB, wb[3], 0), dec2(tB, wb[3], 16));
                *reinterpret_cast<uint4*>(&Bs[ar][ac]) = lo;
                *reinterpret_cast<uint4*>(&Bs[ar][ac + 8]) = hi;
            }
        }
        __syncthreads();
        if (kt + 1 < ktiles) { ra = loadA((kt + 1) * BK); rb = loadB((kt + 1) * BK); }
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            u32 af[4][4], bf[4][2];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = wm * 64 + i * 16 + g;
                af[i][0] = *reinterpret_cast<const u32*>(&As[r][kk + 2 * t4]);
                af[i][1] = *reinterpret_cast<const u32*>(&As[r + 8][kk + 2 * t4]);
                af[i][2] = *reinterpret_cast<const u32*>(&As[r][kk + 8 + 2 * t4]);
                af[i][3] = *reinterpret_cast<const u32*>(&As[r + 8][kk + 8 + 2 * t4]);
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int c = wn * 32 + j * 8 + g;
                bf[j][0] = *reinterpret_cast<const u32*>(&Bs[c][kk + 2 * t4]);
                bf[j][1] = *reinterpret_cast<const u32*>(&Bs[c][kk + 8 + 2 * t4]);
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float* d = SCALE == 2 ? part[i][j] : acc[i][j];
                    asm volatile(
                        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                        : "r"(af[i][0]), "r"(af[i][1]), "r"(af[i][2]), "r"(af[i][3]),
                          "r"(bf[j][0]), "r"(bf[j][1]));
                }
        }
        if (SCALE == 2 && (((kt + 1) * BK) % SCALE_BLOCK == 0 || kt + 1 == ktiles)) {
            // promote the 128-K partial sums: acc += part * sa[m, kb] * sb[nb, kb]
            const int kb = (kt * BK) / SCALE_BLOCK;
            const float s_b = sb[(size_t)(n0 / SCALE_BLOCK) * kblocks + kb];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = m0 + wm * 64 + i * 16 + g;
                const float s0 = r < M ? sa[(size_t)r * kblocks + kb] * s_b : 0.f;
                const float s1 = r + 8 < M ? sa[(size_t)(r + 8) * kblocks + kb] * s_b : 0.f;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    acc[i][j][0] = fmaf(part[i][j][0], s0, acc[i][j][0]);
                    acc[i][j][1] = fmaf(part[i][j][1], s0, acc[i][j][1]);
                    acc[i][j][2] = fmaf(part[i][j][2], s1, acc[i][j][2]);
                    acc[i][j][3] = fmaf(part[i][j][3], s1, acc[i][j][3]);
                    part[i][j][0] = part[i][j][1] = part[i][j][2] = part[i][j][3] = 0.f;
                }
            }
        }
        __syncthreads();
    }
    // epilogue
    const float st = SCALE == 0 ? sa[0] * sb[0] : 1.f;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = m0 + wm * 64 + i * 16 + g + 8 * h;
                const int c = n0 + wn * 32 + j * 8 + 2 * t4;
                if (r >= M) continue;
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    if (c + e >= N) continue;
                    float v = acc[i][j][2 * h + e];
                    if (SCALE == 0) v *= st;
                    else if (SCALE == 1) v *= sa[r] * sb[c + e];
                    if (OUT == 0) reinterpret_cast<float*>(C)[(size_t)r * ldc + c + e] = v;
                    else reinterpret_cast<u16*>(C)[(size_t)r * ldc + c + e] = f32_to_out16(v, OUT == 1);
                }
            }
}
