// Hopper (sm_90a) scaled GEMM on wgmma: C = A * B^T with both operands K-major.
//
//   FP8 pairs (e4m3/e5m2 x e4m3/e5m2): QGMMA  wgmma.m64n128k32.f32.<ta>.<tb>, operands straight from
//   the codes. f16 (any other fp8lab format, decoded to fp16 beforehand, exact): HGMMA
//   wgmma.m64n128k16.f32.f16.f16.
//
// CTA tile 128 x 128 (wide tiles 128 x 192 / 128 x 256 and wgmma n192 / n256: BN below), K-tile
// 128 elements (one scale block: one promotion per K-tile).
// 384 threads: warpgroup 0 = producer (one thread issues TMA loads of A and B tiles into an
// ST-stage ring of 128B-swizzled shared memory, mbarrier full/empty per stage), warpgroups 1 and
// 2 = consumers, each owning 64 rows x 128 columns. Per K-tile a consumer issues 4 (fp8) or 8 (f16)
// wgmma into a partial fp32 accumulator (the first with scale-d = 0), waits, releases the stage
// and promotes: acc += partial (tensor, row_col) or acc += partial * sa[m, kb] * sb[nb, kb]
// (block). This bounds what the reduced-precision FP8 tensor-core accumulation can lose to one
// 128-element block. Ragged M, N, K: TMA fills out-of-bounds elements with zeros; the epilogue
// stores in bounds only. Tensor maps (2-D, 128B swizzle) are built on the host and passed in
// global memory (A's at tmaps[0..127], B's at tmaps[128..255]).
// OVL = 1 (overlapped promotion): two partial accumulators per consumer. The wgmma of K-tile
// kt+1 are issued before the partial of K-tile kt is promoted (wgmma.wait_group 1), so the tensor
// cores keep working while the consumer adds; same additions in the same order as OVL = 0 (bit-
// identical results). acc + 2 partials = 192 fp32 registers: the producer warpgroup gives its
// registers up (setmaxnreg.dec 40) and the consumers take them (setmaxnreg.inc 232).
// CMAP = 1 (16-bit outputs with 16-byte aligned rows): the epilogue goes through shared memory and
// TMA. Each consumer converts its 64 x BN sub-tile two values per instruction (cvt.rn.{bf16,f16}x2)
// and writes it with stmatrix (four 8 x 8 matrices of the accumulator's fragments per instruction;
// BN / 64 boxes of 64 x 64, 128B swizzle: conflict-free) into its own 128 BN-byte staging buffer
// behind the stage ring; without bias, ReLU or amax no per-element test is compiled in. One thread
// issues the TMA stores (out-of-bounds rows and columns clipped by the tensor map, a 3-D (N, M, G)
// map at tmaps[256..383]) and the warpgroup goes on to the next tile while the stores drain; the
// buffer is reused after cp.async.bulk.wait_group.read. Else each thread stores its fragments
// directly.
// BN > 128 (wide tiles, plain GEMMs: QA = 0, 16/32-bit outputs, OVL = 0; f16 without block scales):
// CTA tile 128 x BN, each consumer 64 x BN (wgmma m64nBN). Fewer shared-memory bytes per MAC:
// every wgmma reads its 64-row A slice and the whole B tile, so a wider B amortizes A's reads,
// and TMA writes (128 + BN) rows per 128 x BN outputs. FP8 (BN = 192): one partial, promoted as
// with OVL = 0 (96 + 96 registers), same additions per element as BN = 128 (block scales: a
// tile's columns span two of B's 128-column blocks, each element takes its own). FP8 BN = 256
// (HALVES): each K-tile runs as two m64n128 halves through one 64-register partial (128 + 64
// registers; a m64n256 partial would need 256): issue, wait and promote the left half, then the
// right one (its columns follow the left ones in the accumulator's layout, so the epilogue is that
// of m64n256); the stage is freed after the second; same additions per element. f16 (BN = 256,
// DIRECT): the products of fp16 values accumulate in fp32 in the tensor cores over the whole K
// (128 registers, no partial), K-tiles of 64 elements (one atom column; 48 KB stages).
// G > 1: G GEMMs of one shape in one launch (grouped): A is (G*M, K), B (G*N, K), C (G*M, ldc),
// scales per GEMM one after the other; the persistent CTAs take the tiles of all G GEMMs.
// gtab != null: G GEMMs of any shapes in one launch (QA = 0, no split). GEMM g's record is
// gtab[16g .. 16g + 15]: M, N, K, ldc, then 64-bit addresses of its C, sa and sb (words 4-9),
// kblocks (word 10); gtab[16G + g] is its first tile (GEMMs in order, tiles of one GEMM
// consecutive), gtab[16G + G] the total. Its tensor maps are A's at tmaps[128g], B's at
// tmaps[128(G + g)] and C's ((N, M, 1), CMAP only) at tmaps[128(2G + g)]. Of the shape
// arguments only G is read then (the count of GEMMs); C, M, N, K, ldc, kblocks, sa and sb come
// from the table.
//
// Fused quantize-on-load (QA = 1 bfloat16, 2 float16, 3 float32; G = 1, SCALE = 0): A is given in
// high precision (xa, row stride ldx elements: 16-byte aligned rows, readable up to K rounded up
// to 16 bytes) and the scale sa[0] on the device. Phase 1 (qa_phase, every thread of every CTA):
// A is converted once into TA's codes in the buffer xq (M x K, row stride ldq), the codes of
// fp8lab.quantize at that scale (nearest even, saturating per xspec/xcodes: blocks of chunks
// through fp8q_odd_fast without a branch, again through fp8q_pair when a magnitude reaches
// fp8q_fast_lim); xamax (optional): running max of finite |x|. CTAs claim units of rows from a
// counter in qsync and count each tile row's finished units there; phase 2 is the GEMM above on
// those codes (A's tensor map is xq's), whose producer waits for a tile row's count before its
// first TMA load of it. The buffer stays in L2 at the sizes this is for, and each element of A
// is converted once, not once per tile column. The last CTA zeroes qsync for the next launch.
// Fused epilogue (any QA, G = 1, no split): C = relu(acc * scales + bias[col]) (bias optional,
// float32; relu: x < 0 -> +0, NaN kept; the add rounds separately, never an fma); OUT = 3 / 4
// stores E4M3 / E5M2 codes of C at scale os[0] (fp8q_pair, as the quantize-on-load); oamax
// (optional): running max of finite |C| over the stored elements, before the 8-bit cast.
#include "fp8_cvt.cuh"

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define WG_BM 128
#define WG_BK 128
#define WG_THREADS 384
#ifndef QA_NB
#define QA_NB 4    // quantize-on-load once: 16-byte chunks of A per thread loaded at once (a multiple of 4)
#endif
#define QA_RAW 4   // quantize-on-load in the producer: staging slots of 16 KB (one pass of 128 threads x 8 chunks)
#ifndef WG_GROUP_M
#define WG_GROUP_M 16
#endif
template <bool B> struct WgFlag { static constexpr bool value = B; };

__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 ok;
    do {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}" : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
    } while (!ok);
}
__device__ __forceinline__ void tma_load_2d(u32 dst, u64 tmap, int x, int y, u32 bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];"
                 :: "r"(dst), "l"(tmap), "r"(x), "r"(y), "r"(bar) : "memory");
}

// TMA store of a (64 x 64 x 1) box of 16-bit elements from shared memory (bulk async group)
__device__ __forceinline__ void tma_store_3d(u64 tmap, u32 src, int x, int y, int z) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];"
                 :: "l"(tmap), "r"(x), "r"(y), "r"(z), "r"(src) : "memory");
}
__device__ __forceinline__ void named_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(n) : "memory");
}

// Shared-memory matrix descriptor: K-major, 128B swizzle, 8-row core-matrix groups 1024 B apart.
__device__ __forceinline__ u64 wg_desc(u32 addr) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
__device__ __forceinline__ void wg_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }

// Accumulator operands of a wgmma with R registers per thread (N = 2R columns): the register list,
// the operands, then the indices of the two descriptors and of scale-d
#define WG_REGS64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define WG_OPS64 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define WG_TAIL64 ", %64, %65, p, 1, 1"
#define WG_SD64 "%66"
#define WG_REGS96 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}"
#define WG_OPS96 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
#define WG_TAIL96 ", %96, %97, p, 1, 1"
#define WG_SD96 "%98"
#define WG_REGS128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define WG_OPS128 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define WG_TAIL128 ", %128, %129, p, 1, 1"
#define WG_SD128 "%130"
#define WG_MMA(R, SHAPE_TYPES, TAIL)                                                             \
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, " WG_SD##R ", 0;\n"                           \
                 " wgmma.mma_async.sync.aligned." SHAPE_TYPES " " WG_REGS##R WG_TAIL##R TAIL ";\n}\n" \
                 : WG_OPS##R : "l"(da), "l"(db), "r"(scale_d))

// T: 0 e4m3, 1 e5m2, 2 f16 (then both are f16); N columns (128, 192 or 256)
#define WG_MMA_N(R, N)                                                                          \
    if constexpr (TA == 2) WG_MMA(R, "m64n" #N "k16.f32.f16.f16", ", 0, 0");                      \
    else if constexpr (TA == 0 && TB == 0) WG_MMA(R, "m64n" #N "k32.f32.e4m3.e4m3", "");          \
    else if constexpr (TA == 1 && TB == 0) WG_MMA(R, "m64n" #N "k32.f32.e5m2.e4m3", "");          \
    else if constexpr (TA == 0 && TB == 1) WG_MMA(R, "m64n" #N "k32.f32.e4m3.e5m2", "");          \
    else WG_MMA(R, "m64n" #N "k32.f32.e5m2.e5m2", "")
template <int TA, int TB, int N>
__device__ __forceinline__ void wg_mma(float* d, u64 da, u64 db, int scale_d) {
    static_assert(N == 128 || N == 192 || N == 256, "wgmma widths: 128, 192, 256");
    if constexpr (N == 128) { WG_MMA_N(64, 128); }
    else if constexpr (N == 192) { WG_MMA_N(96, 192); }
    else { WG_MMA_N(128, 256); }
}
#undef WG_MMA_N

// row, 16-byte chunk -> byte offset inside a 128 x 128 B tile in TMA's 128B-swizzled layout (the
// chunk XORed with row % 8; `key`: that value where the caller knows it without the row)
__device__ __forceinline__ u32 wg_swz(int row, int chunk, int key) {
    return (u32)(row * 128 + ((chunk ^ key) << 4));
}

__device__ __forceinline__ void wg_warp_max(u32* dst, u32 m) {
    m = __reduce_max_sync(0xFFFFFFFFu, m);
    if ((threadIdx.x & 31) == 0 && m != 0u) atomicMax(dst, m);
}

// two 16-bit outputs in one word: lo in the low half, hi in the high half (the same rounding as
// two wg_out16)
__device__ __forceinline__ u32 wg_out16x2(float lo, float hi, int bf) {
    u32 w;
    if (bf) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
    else asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
    return w;
}

__device__ __forceinline__ u16 wg_out16(float x, int bf) {
    u16 h;
    if (bf) asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    else asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

// --- fused quantize-on-load: A converted once, before the GEMM ------------------------------------
// EPC elements of a 16-byte chunk of A (QA 1 bfloat16, 2 float16, 3 float32) as float32.
// NAN_SIGN: a float16 NaN keeps its sign (cvt.f32.f16 returns one without it; the careful route's
// fp8q_special reads the NaN code's sign from the float; the fast route never decides a NaN's code).
template <int QA, bool NAN_SIGN = false>
__device__ __forceinline__ void qa_unpack(const uint4& c, float (&f)[8]) {
    constexpr int EPC = QA == 3 ? 4 : 8;
    const u32 w[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int e = 0; e < EPC; e++) {
        if (QA == 3) f[e] = __uint_as_float(w[e]);
        else if (QA == 1) f[e] = __uint_as_float(e & 1 ? w[e >> 1] & 0xFFFF0000u : w[e >> 1] << 16);
        else {
            const u16 hb = (u16)(w[e >> 1] >> (16 * (e & 1)));
            asm("cvt.f32.f16 %0, %1;" : "=f"(f[e]) : "h"(hb));
            if (NAN_SIGN) f[e] = __uint_as_float(__float_as_uint(f[e]) | (u32)(hb & 0x8000u) << 16);
        }
    }
}

// The careful route of one chunk, out of line (rare: NaN, Inf or overflow in a block, or a scale
// outside [2^-60, 2^60]; inlined at every chunk it would flood the instruction cache): its codes
// (x, y: EPC / 4 words) and, TRACK, the maximum of finite |x| (z). qp by value: a reference would
// put it in local memory across the call. A NaN's code has the NaN's sign (float16 too).
template <int TA, int QA, int CP, bool TRACK>
__device__ __noinline__ uint4 qa_careful(uint4 v, Fp8Q qp) {
    constexpr int EPC = QA == 3 ? 4 : 8;
    float f[8];
    qa_unpack<QA, true>(v, f);
    u32 mx = 0, q[2] = {0u, 0u};
    if (TRACK) {
#pragma unroll
        for (int e = 0; e < EPC; e++) mx = max(mx, fp8q_mag(f[e]));
    }
#pragma unroll
    for (int e = 0; e < EPC / 4; e++)
        q[e] = fp8q_pair<TA + 1, CP>(f[4 * e], f[4 * e + 1], qp) | (fp8q_pair<TA + 1, CP>(f[4 * e + 2], f[4 * e + 3], qp) << 16);
    return make_uint4(q[0], q[1], mx, 0u);
}

// Codes (format TA) of NB chunks at the scale of qp into q (EPC / 4 words per chunk), and the
// running maximum mx of finite |x| (TRACK). PATH MUL / RCP: the branch-free fast route for the
// whole block (ptxas interleaves the chunks), redone through the careful route when some scaled
// magnitude reached fp8q_fast_lim (NaN, Inf or, without saturation, overflow); other paths: the
// careful route (qa_careful per chunk, out of line).
template <int TA, int QA, int PATH, bool TRACK, int NB>
__device__ __forceinline__ void qa_convert(const uint4 (&v)[NB], u32 (&q)[NB][2], const Fp8Q& qp, u32& mx) {
    constexpr int EPC = QA == 3 ? 4 : 8;
    if constexpr (PATH == FP8Q_MUL || PATH == FP8Q_RCP) {
        float big = 0.0f;
        u32 pm = 0;
#pragma unroll
        for (int i = 0; i < NB; i++) {
            float f[8];
            qa_unpack<QA>(v[i], f);
            if (TRACK) {   // bits of |x|: right when the block passes (no NaN or Inf in it)
#pragma unroll
                for (int e = 0; e < EPC; e++) pm = max(pm, __float_as_uint(f[e]) & 0x7FFFFFFFu);
            }
            u32 o[8];
#pragma unroll
            for (int e = 0; e < EPC; e++) o[e] = fp8q_odd_fast<PATH>(f[e], qp);
            // the chunk's maximum as a tree (short dependent chains), then the block's
            float m[4];
#pragma unroll
            for (int e = 0; e < EPC / 2; e++) m[e] = fp8q_absmax(fabsf(__uint_as_float(o[2 * e])), o[2 * e + 1]);
            if (EPC == 8) { m[0] = fp8q_absmax(m[0], __float_as_uint(m[2])); m[1] = fp8q_absmax(m[1], __float_as_uint(m[3])); }
            big = fp8q_absmax(big, __float_as_uint(fp8q_absmax(m[0], __float_as_uint(m[1]))));
#pragma unroll
            for (int e = 0; e < EPC / 4; e++)
                q[i][e] = fp8q_cvt2<TA + 1>(o[4 * e], o[4 * e + 1]) | (fp8q_cvt2<TA + 1>(o[4 * e + 2], o[4 * e + 3]) << 16);
        }
        if (__float_as_uint(big) < fp8q_fast_lim(qp)) {
            if (TRACK) mx = max(mx, pm);
            return;
        }
    }
    constexpr int CP = PATH == FP8Q_RCP ? FP8Q_DIV : PATH;   // the careful route of the path
#pragma unroll
    for (int i = 0; i < NB; i++) {
        const uint4 r = qa_careful<TA, QA, CP, TRACK>(v[i], qp);
        q[i][0] = r.x;
        q[i][1] = r.y;
        if (TRACK) mx = max(mx, r.z);
    }
}

// Phase 1 of a quantize-on-load launch, run by all threads of every CTA before the GEMM: A (M x K,
// row stride ldx elements, 16-byte aligned rows readable up to K rounded up to 16 bytes) into
// TA's codes at xq (row stride ldq bytes, a multiple of 16), each element once. The work is cut
// into units of WG_BM / qparts rows of one tile row; CTAs claim units from the counter qsync[0]
// until none is left, so every claimed unit belongs to a running CTA (no wait on a CTA that is
// not resident). When a unit's codes are written, qsync[2 + tile row] counts it (release); the
// producer loads a tile row's A only when its count reaches qparts (qa_wait). xamax: the
// running maximum of finite |A|.
template <int TA, int QA, int PATH, bool TRACK>
__device__ __forceinline__ void qa_phase(const u8* __restrict__ x8, long long ldx, int M, int K, u8* __restrict__ xq,
                                      int ldq, u32* qsync, int qparts, Fp8Q qp, u32* xamax) {
    constexpr int XES = QA == 3 ? 4 : 2, EPC = 16 / XES, NB = QA_NB, NT = WG_THREADS;
    static_assert(NB % 4 == 0, "QA_NB: converted 4 chunks at a time");
    __shared__ int unit_s[2];
    const int units = ((M + WG_BM - 1) / WG_BM) * qparts, rows_per = WG_BM / qparts;
    const int cpr = (K + EPC - 1) / EPC;          // chunks per row
    const int dr = NT / cpr, dc = NT % cpr;       // a chunk index advanced by NT: rows, chunks
    u32 mx = 0;
    if (threadIdx.x == 0) unit_s[0] = atomicAdd(&qsync[0], 1u);
    __syncthreads();
    for (int n = 0;; n++) {
        const int u = unit_s[n & 1];
        if (u >= units) break;
        // the next unit claimed while this one converts (read after the barrier below; the slot
        // written here was read by every thread before the previous unit's barrier)
        if (threadIdx.x == 0) unit_s[(n + 1) & 1] = atomicAdd(&qsync[0], 1u);
        const int tm = u / qparts, r0 = tm * WG_BM + (u % qparts) * rows_per;
        const int total = max(0, min(rows_per, M - r0)) * cpr;
        int row = threadIdx.x / cpr, col = threadIdx.x % cpr;   // of chunk c0 below
        for (int c0 = threadIdx.x; c0 < total; c0 += NB * NT) {
            uint4 v[NB];
            int rr[NB], cc[NB];
#pragma unroll
            for (int i = 0; i < NB; i++) {   // the NB loads issued back to back: no branch around them
                rr[i] = row; cc[i] = col;
                const bool in = c0 + i * NT < total;
                const u8* src = in ? x8 + ((size_t)(r0 + row) * ldx + (size_t)col * EPC) * XES : x8;
                v[i] = __ldcs(reinterpret_cast<const uint4*>(src));
                col += dc; row += dr;
                if (col >= cpr) { col -= cpr; row++; }
            }
#pragma unroll
            for (int i = 0; i < NB; i++)
                if (c0 + i * NT >= total) v[i] = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
            for (int i = 0; i < NB; i++) {   // the chunk that straddles K: what lies past K is not A's
                const int kv = K - cc[i] * EPC;
                if (kv < EPC) {
                    u32 w[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        w[j] &= EPC == 4 ? (j < kv ? 0xFFFFFFFFu : 0u)
                                         : (2 * j < kv ? 0x0000FFFFu : 0u) | (2 * j + 1 < kv ? 0xFFFF0000u : 0u);
                    v[i] = make_uint4(w[0], w[1], w[2], w[3]);
                }
            }
#pragma unroll
            for (int h = 0; h < NB; h += 4) {   // converted 4 chunks at a time (registers)
                const uint4 w[4] = {v[h], v[h + 1], v[h + 2], v[h + 3]};
                u32 q[4][2];
                qa_convert<TA, QA, PATH, TRACK, 4>(w, q, qp, mx);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    if (c0 + (h + i) * NT >= total) continue;
                    u8* d = xq + (size_t)(r0 + rr[h + i]) * ldq + cc[h + i] * EPC;
                    if (EPC == 8) *reinterpret_cast<uint2*>(d) = make_uint2(q[i][0], q[i][1]);
                    else *reinterpret_cast<u32*>(d) = q[i][0];
                }
            }
        }
        // the codes into the async proxy (TMA reads them), then the unit is counted by thread 0
        asm volatile("fence.proxy.async.global;" ::: "memory");
        __syncthreads();
        if (threadIdx.x == 0)
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(qsync + 2 + tm) : "memory");
    }
    if (TRACK) wg_warp_max(xamax, mx);
}

// The producer's wait for tile row tm's codes (qa_phase), then a fence so that its TMA loads
// (async proxy) see them
__device__ __forceinline__ void qa_wait(const u32* qsync, int tm, int qparts) {
    u32 n;
    for (;;) {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(n) : "l"(qsync + 2 + tm) : "memory");
        if ((int)n >= qparts) break;
        __nanosleep(128);
    }
    asm volatile("fence.proxy.async.global;" ::: "memory");
}

// After the last tile of a CTA: the last CTA to get here zeroes qsync for the next launch (every
// claim and every wait of this launch is behind it)
__device__ __forceinline__ void qa_done(u32* qsync, int tiles_m) {
    __threadfence();
    if (atomicAdd(&qsync[1], 1u) == gridDim.x - 1) {
        __threadfence();
        for (int i = 0; i < 2 + tiles_m; i++) qsync[i] = 0u;
        __threadfence();
    }
}

template <int TA, int TB, int SCALE, int OUT, int ST, int OVL, int QA = 0, int BN = 128>
__global__ void __launch_bounds__(WG_THREADS, 1) gemm_wgmma(
        const u8* __restrict__ tmaps, void* __restrict__ C, int M, int N, int K, int ldc,
        const float* __restrict__ sa, const float* __restrict__ sb, int kblocks, int G, int cmap,
        int splits, float* __restrict__ ws, const int* __restrict__ gtab,
        const void* __restrict__ xa, long long ldx, u32 xspec, u32 xcodes, u32* __restrict__ xamax,
        const float* __restrict__ bias, int relu, const float* __restrict__ os, u32 ospec,
        u32 ocodes, u32* __restrict__ oamax, u8* __restrict__ xq, int ldq, u32* __restrict__ qsync, int qparts) {
    static_assert(QA == 0 || (SCALE == 0 && TA < 2 && TB < 2), "quantize-on-load: FP8, tensor scales");
    constexpr int QIN = QA & 3;         // quantize-on-load input: 1 bfloat16, 2 float16, 3 float32
    constexpr bool QONCE = QA >= 4;     // converted once before the GEMM (else in the producer)
    static_assert(OUT < 3 || TA < 2, "8-bit outputs: FP8 operands");
    static_assert(BN == 128 || (QA == 0 && OUT < 3 && OVL == 0), "wide tiles: plain GEMM, no overlap");
    constexpr int ES = TA == 2 ? 2 : 1;               // bytes per element
    constexpr bool DIRECT = TA == 2 && BN > 128;      // f16 wide tiles: accumulate in the tensor cores
    static_assert(!(DIRECT && SCALE == 2), "block scales need the promoted partials");
    constexpr bool BIG = OVL || BN > 128;             // consumers take the producer's registers
    constexpr int KA = DIRECT ? 1 : ES;               // 128-byte atom columns of K per stage
    constexpr int KB = 128 * KA / ES;                 // K elements per stage (a K-tile): 128, DIRECT 64
    constexpr int ATOM = 128 * 128;                   // 128 rows x 128 B (one swizzle atom column of A)
    constexpr int TILE_A = ATOM * KA, TILE_B = BN * 128 * KA;
    constexpr int STAGE_BYTES = TILE_A + TILE_B;
    constexpr int STEPS = 4 * KA;                     // wgmma per K-tile (32 B of K each)
    constexpr int NR = BN / 2;                        // accumulator registers per thread
    constexpr bool HALVES = TA < 2 && BN == 256;      // FP8 256 wide: two m64n128 halves, one partial
    constexpr int WN = HALVES ? 128 : BN;             // columns per wgmma
    constexpr int NP = DIRECT ? 1 : WN / 2;           // partial accumulator registers per thread
    extern __shared__ u8 dsm[];
    __shared__ __align__(8) u64 full_bar[ST], empty_bar[ST];
    u8* smem = reinterpret_cast<u8*>((reinterpret_cast<size_t>(dsm) + 1023) & ~(size_t)1023);
    const u32 sbase = smem_u32(smem);

    // Shapes of the GEMM a tile belongs to: the arguments' one, or (gtab) each GEMM's own, loaded
    // by tile_mn into these per-thread variables (and M, N, K, ldc, kblocks) as the thread moves on
    int tiles_m = (M + WG_BM - 1) / WG_BM, tiles_n = (N + BN - 1) / BN;
    const int per_gemm = tiles_m * tiles_n;   // stacked GEMMs only
    int per_group = WG_GROUP_M * tiles_n;
    int ktiles = (K + KB - 1) / KB;
    const int* gstart = gtab + 16 * G;   // gtab: each GEMM's first tile, then the total
    const int ntiles = gtab != nullptr ? gstart[G] : G * per_gemm * splits;
    int gv = 0;   // gtab: the GEMM of this thread's current tile (its tiles only increase)
    // tile -> (g, tm, tn): GEMM g (of G stacked ones: A rows g*M.., B rows g*N.., C rows g*M..;
    // or gtab's GEMM g), then groups of WG_GROUP_M tile rows, M fastest inside a group (L2 reuse)
    // split-K (splits > 1, G = 1): work item -> (output tile, split sp), sp fastest; split sp
    // takes K-tiles [kb0, kb0 + nk) and leaves its fp32 sum in ws[sp] for splitk_reduce
    auto tile_mn = [&](int tile, int& g, int& tm, int& tn, int& sp, int& kb0, int& nk) {
        if (gtab != nullptr) {
            while (gstart[gv + 1] <= tile) gv++;   // GEMMs without tiles skipped
            const int* r = gtab + 16 * gv;
            M = r[0]; N = r[1]; K = r[2]; ldc = r[3]; kblocks = r[10];
            tiles_m = (M + WG_BM - 1) / WG_BM; tiles_n = (N + BN - 1) / BN;
            per_group = WG_GROUP_M * tiles_n;
            ktiles = (K + KB - 1) / KB;
            g = gv; sp = 0; kb0 = 0; nk = ktiles;
            tile -= gstart[gv];
        } else {
            sp = tile % splits;
            tile /= splits;
            kb0 = (int)((long long)sp * ktiles / splits);
            nk = (int)((long long)(sp + 1) * ktiles / splits) - kb0;
            g = tile / per_gemm;
            tile -= g * per_gemm;
        }
        const int first_m = (tile / per_group) * WG_GROUP_M;
        const int gsz = min(tiles_m - first_m, WG_GROUP_M);
        tm = first_m + (tile % per_group) % gsz;
        tn = (tile % per_group) / gsz;
    };
    const int wg = threadIdx.x >> 7;
    // Tensor map `which` (0 A, 1 B, 2 C) of GEMM g: one each, or (gtab) one each per GEMM
    auto tmap_of = [&](int which, int g) {
        return reinterpret_cast<u64>(tmaps + 128 * (gtab != nullptr ? which * G + g : which));
    };
    auto tmap_acquire = [](u64 m) {
        asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" :: "l"(m) : "memory");
    };

    if (threadIdx.x == 0) {
        for (int s = 0; s < ST; s++) {
            mbar_init(smem_u32(&full_bar[s]), QA != 0 && !QONCE ? 5 : 1);   // B's transaction + 4 converter warps
            mbar_init(smem_u32(&empty_bar[s]), 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if constexpr (QONCE) {   // phase 1: A into codes at xq (all threads)
        const Fp8Q qp = fp8q_make(sa[0], xspec, xcodes);
        const u8* x8 = reinterpret_cast<const u8*>(xa);
        const int path = fp8q_path(qp);
#define QA_PHASE(P, T) qa_phase<TA, QIN, P, T>(x8, ldx, M, K, xq, ldq, qsync, qparts, qp, xamax)
        if (xamax != nullptr) {
            if (path == FP8Q_MUL) QA_PHASE(FP8Q_MUL, true);
            else if (path == FP8Q_RCP) QA_PHASE(FP8Q_RCP, true);
            else if (path == FP8Q_DIV) QA_PHASE(FP8Q_DIV, true);
            else QA_PHASE(FP8Q_F64, true);
        } else {
            if (path == FP8Q_MUL) QA_PHASE(FP8Q_MUL, false);
            else if (path == FP8Q_RCP) QA_PHASE(FP8Q_RCP, false);
            else if (path == FP8Q_DIV) QA_PHASE(FP8Q_DIV, false);
            else QA_PHASE(FP8Q_F64, false);
        }
#undef QA_PHASE
    }

    // Persistent: CTA b takes tiles b, b + grid, ...; the stage ring runs on across tiles, so the
    // producer already loads the next tile while the consumers run the epilogue.
    if (wg == 0) {  // producer
        if (BIG) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if constexpr (QA != 0 && !QONCE) {   // quantize-on-load in the producer
            constexpr int XES = QIN == 3 ? 4 : 2;        // input bytes per element
            constexpr int EPC = 16 / XES;               // elements per 16-byte chunk
            constexpr int CPR = WG_BK / EPC;            // chunks per row of a K-tile (16 or 32)
            constexpr int PASS = 8;                     // chunks per thread per pass (32 registers)
            constexpr int NP = CPR / PASS;              // passes per K-tile
            const int tp = threadIdx.x;
            const u64 tb = tmap_of(1, 0);
            if (tp == 0) tmap_acquire(tb);
            const Fp8Q qp = fp8q_make(sa[0], xspec, xcodes);
            const int qpath = fp8q_path(qp);
            const u32 fast_lim = fp8q_fast_lim(qp);
            const u8* x8 = reinterpret_cast<const u8*>(xa);
            u32 mx = 0;
            int it = 0;   // K-tiles started (the stage ring's position)
            // A pass: PASS chunks of one K-tile per thread. Chunk tp + 128 (PASS h + i) of a K-tile
            // is row (that) / CPR, 16-byte column (that) % CPR: a warp reads whole rows.
            struct QPos { int tile, kt, kend, h, m0, n0; bool ok, track; };
            auto at_tile = [&](int tile) {
                QPos p{};
                p.ok = tile < ntiles;
                if (!p.ok) return p;
                int g, tm, tn, sp, kb0, nk;
                tile_mn(tile, g, tm, tn, sp, kb0, nk);
                p.tile = tile; p.kt = kb0; p.kend = kb0 + nk; p.h = 0;
                p.m0 = tm * WG_BM; p.n0 = tn * BN;
                p.track = xamax != nullptr && tn == 0;   // each element of A once
                return p;
            };
            auto advance = [&](QPos p) {
                if (++p.h < NP) return p;
                p.h = 0;
                if (++p.kt < p.kend) return p;
                return at_tile(p.tile + gridDim.x);
            };
            // A pass's PASS 16-byte chunks, copied by this thread from global memory into its own
            // slots of staging buffer `slot` (cp.async, zero-filled outside A; no registers held
            // while in flight). The host guarantees 16-byte aligned rows readable up to K rounded
            // up to EPC.
            const u32 raw = sbase + ST * STAGE_BYTES + 2 * 128 * BN;
            auto issue_pass = [&](const QPos& p, int slot) {
                if (p.ok) {
#pragma unroll
                    for (int i = 0; i < PASS; i++) {
                        const int c = tp + 128 * (p.h * PASS + i), row = c / CPR, col = c % CPR;
                        const int gr = p.m0 + row, gk = p.kt * WG_BK + col * EPC;
                        const bool in = gr < M && gk < K;
                        const u8* src = in ? x8 + ((size_t)gr * ldx + gk) * XES : x8;
                        const u32 dst = raw + slot * (PASS * 2048) + (i * 128 + tp) * 16;
                        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                                     :: "r"(dst), "l"(src), "r"(in ? 16 : 0) : "memory");
                    }
                }
                asm volatile("cp.async.commit_group;" ::: "memory");   // empty past the end: counts stay aligned
            };
            // Byte offset in a stage's swizzled A tile of the codes of this thread's chunk i of
            // a pass: row tp / CPR + RS * (h * PASS + i), the same column in every chunk (128 is a
            // multiple of CPR); with RS = 8 the swizzle is the same too.
            constexpr int RS = 128 / CPR;
            const int col = tp % CPR, row0 = tp / CPR;
            auto chunk_off = [&](const QPos& p, int i) {
                const int row = row0 + RS * (p.h * PASS + i), key = RS == 8 ? row0 & 7 : row & 7;
                return EPC == 8 ? wg_swz(row, col >> 1, key) + (col & 1) * 8 : wg_swz(row, col >> 2, key) + (col & 3) * 4;
            };
            auto convert = [&](const QPos& p, const uint4 (&v)[PASS], u32 (&q)[PASS][2], auto path) {
                constexpr int PATH = decltype(path)::value;
#pragma unroll
                for (int h = 0; h < PASS; h += 4) {   // 4 chunks at a time (registers)
                    const uint4 w[4] = {v[h], v[h + 1], v[h + 2], v[h + 3]};
                    u32 o[4][2];
                    if (p.track) qa_convert<TA, QIN, PATH, true, 4>(w, o, qp, mx);
                    else qa_convert<TA, QIN, PATH, false, 4>(w, o, qp, mx);
#pragma unroll
                    for (int i = 0; i < 4; i++) { q[h + i][0] = o[i][0]; q[h + i][1] = o[i][1]; }
                }
            };
            // one pass whose loads were issued earlier: its K-tile's first pass waits for the stage
            // (and thread 0 starts B's TMA), its last makes the codes visible and arrives
            auto process = [&](const QPos& p, int slot) {
                uint4 v[PASS];
#pragma unroll
                for (int i = 0; i < PASS; i++) {
                    const u32 a = raw + slot * (PASS * 2048) + (i * 128 + tp) * 16;
                    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                                 : "=r"(v[i].x), "=r"(v[i].y), "=r"(v[i].z), "=r"(v[i].w) : "r"(a) : "memory");
                }
                // the chunk that straddles K (the same column in every chunk of the pass): what
                // lies past K in the row is not A's
                const int kv = K - (p.kt * WG_BK + col * EPC);
                if (kv < EPC) {
                    u32 keep[4];
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        keep[j] = EPC == 4 ? (j < kv ? 0xFFFFFFFFu : 0u)
                                           : (2 * j < kv ? 0x0000FFFFu : 0u) | (2 * j + 1 < kv ? 0xFFFF0000u : 0u);
#pragma unroll
                    for (int i = 0; i < PASS; i++) {
                        v[i].x &= keep[0]; v[i].y &= keep[1]; v[i].z &= keep[2]; v[i].w &= keep[3];
                    }
                }
                const int s = it % ST;
                const u32 fb = smem_u32(&full_bar[s]);
                const u32 dA = sbase + s * STAGE_BYTES;
                if (p.h == 0) {
                    if (it >= ST) mbar_wait(smem_u32(&empty_bar[s]), ((it / ST) - 1) & 1);
                    if (tp == 0) {
                        mbar_expect_tx(fb, TILE_B);
                        tma_load_2d(dA + TILE_A, tb, p.kt * WG_BK, p.n0, fb);
                    }
                }
                u32 q[PASS][2];
                if (qpath == FP8Q_MUL) convert(p, v, q, Fp8qPath<FP8Q_MUL>());
                else if (qpath == FP8Q_RCP) convert(p, v, q, Fp8qPath<FP8Q_RCP>());
                else if (qpath == FP8Q_DIV) convert(p, v, q, Fp8qPath<FP8Q_DIV>());
                else convert(p, v, q, Fp8qPath<FP8Q_F64>());
#pragma unroll
                for (int i = 0; i < PASS; i++) {
                    const u32 addr = dA + chunk_off(p, i);
                    if (EPC == 8) asm volatile("st.shared.v2.u32 [%0], {%1, %2};" :: "r"(addr), "r"(q[i][0]), "r"(q[i][1]) : "memory");
                    else asm volatile("st.shared.u32 [%0], %1;" :: "r"(addr), "r"(q[i][0]) : "memory");
                }
                if (p.h == NP - 1) {
                    // each thread's codes into wgmma's (async) proxy, then one arrival per warp
                    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                    __syncwarp();
                    if ((tp & 31) == 0) mbar_arrive(fb);
                    it++;
                }
            };
            // QA_RAW passes in flight: pass n + QA_RAW - 1 is issued before pass n is converted
            // (into the slot pass n - 1 used: this thread's own chunks, already read back)
            QPos pi = at_tile(blockIdx.x), pp = pi;
            for (int d = 0; d < QA_RAW - 1; d++) {
                issue_pass(pi, d);
                if (pi.ok) pi = advance(pi);
            }
            for (int n = 0; pp.ok; n++) {
                issue_pass(pi, (n + QA_RAW - 1) % QA_RAW);
                if (pi.ok) pi = advance(pi);
                asm volatile("cp.async.wait_group %0;" :: "n"(QA_RAW - 1) : "memory");   // pass n landed
                process(pp, n % QA_RAW);
                pp = advance(pp);
            }
            asm volatile("cp.async.wait_all;" ::: "memory");
            if (xamax != nullptr) wg_warp_max(xamax, mx);
            return;
        }
        if (threadIdx.x == 0) {
            int it = 0, qtm = -1;
            u64 ta = 0;
            for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
                int g, tm, tn, sp, kb0, nk;
                tile_mn(tile, g, tm, tn, sp, kb0, nk);
                const u64 tb = tmap_of(1, g);
                if (tmap_of(0, g) != ta) {   // a map not used before by this thread
                    ta = tmap_of(0, g);
                    tmap_acquire(ta);
                    tmap_acquire(tb);
                }
                // stacked GEMMs: rows of a partial tile past M (N) come from the next GEMM; they
                // only reach outputs the epilogue does not store. gtab: each GEMM its own maps.
                const int m0 = (gtab != nullptr ? 0 : g * M) + tm * WG_BM;
                const int n0 = (gtab != nullptr ? 0 : g * N) + tn * BN;
                if constexpr (QONCE) {
                    if (tm != qtm) { qa_wait(qsync, tm, qparts); qtm = tm; }
                }
                for (int kt = kb0; kt < kb0 + nk; kt++, it++) {
                    const int s = it % ST;
                    if (it >= ST) mbar_wait(smem_u32(&empty_bar[s]), ((it / ST) - 1) & 1);
                    const u32 fb = smem_u32(&full_bar[s]);
                    mbar_expect_tx(fb, STAGE_BYTES);
                    const u32 dA = sbase + s * STAGE_BYTES, dB = dA + TILE_A;
#pragma unroll
                    for (int a = 0; a < KA; a++) {
                        const int x = kt * KB + a * (128 / ES);
                        tma_load_2d(dA + a * ATOM, ta, x, m0, fb);
                        tma_load_2d(dB + a * BN * 128, tb, x, n0, fb);
                    }
                }
            }
            if constexpr (QONCE) qa_done(qsync, tiles_m);
        }
        return;
    }

    // consumers
    if (BIG) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int cw = wg - 1, t = threadIdx.x & 127, warp = t >> 5, lane = t & 31;
    float acc[NR], part[NP], part2[OVL ? NR : 1];
    const bool use_cmap = (OUT == 1 || OUT == 2) && cmap;
    u64 tc = 0;   // C's tensor map of the current tile, acquired
    const u32 stage_c = sbase + ST * STAGE_BYTES + cw * 128 * BN;   // this consumer's staging buffer (64 x BN)
    // per-row scales with the TMA-store epilogue: this consumer's tile's BN column scales and 64
    // row scales, copied in by cp.async when the tile starts and waited for at its epilogue. Static,
    // beside the host's dynamic request (_wg_smem): the 128-wide 6-stage per-row instance is then
    // less than 1 KB below the CTA's limit, and a launch over it fails rather than runs.
    __shared__ __align__(16) float rcs_all[SCALE == 1 ? 2 * (BN + 64) : 1];
    float* const rcs = rcs_all + (SCALE == 1 ? cw * (BN + 64) : 0);
    const Fp8Q oq = fp8q_make(OUT >= 3 ? os[0] : 1.f, ospec, ocodes);
    u32 omax = 0;
    // bias, ReLU and the running maximum of one output pair (row r, columns c, c + 1)
    auto finish = [&](float& v0, float& v1, int r, int c) {
        if (bias != nullptr) {
            if (c < N) v0 = __fadd_rn(v0, bias[c]);
            if (c + 1 < N) v1 = __fadd_rn(v1, bias[c + 1]);
        }
        if (relu) { v0 = v0 < 0.f ? 0.f : v0; v1 = v1 < 0.f ? 0.f : v1; }
        if (oamax != nullptr && r < M) {
            if (c < N) omax = max(omax, fp8q_mag(v0));
            if (c + 1 < N) omax = max(omax, fp8q_mag(v1));
        }
    };
    int it = 0;
    for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        int g, tm, tn, sp, kb0, nk;
        tile_mn(tile, g, tm, tn, sp, kb0, nk);
        const int m0 = tm * WG_BM, n0 = tn * BN;   // inside GEMM g
        // B's 128 x 128 scale blocks (block scaling): nbs per GEMM; the tile's columns lie in block
        // nb0 up to column 8 jsplit of the tile, in block nb0 + 1 after it (BN = 192)
        const int nbs = (N + 127) / 128, nb0 = n0 / 128, jsplit = ((nb0 + 1) * 128 - n0) / 8;
        // GEMM g's scales and output (gtab: its own pointers, as 64-bit words at r[4..9])
        const float* sag = sa + (SCALE == 0 ? g : SCALE == 1 ? (size_t)g * M : (size_t)g * M * kblocks);
        const float* sbg = sb + (SCALE == 0 ? g : SCALE == 1 ? (size_t)g * N : (size_t)g * nbs * kblocks);
        void* Cg = C;
        size_t crow = (size_t)g * M;
        if (gtab != nullptr) {
            const long long* r = reinterpret_cast<const long long*>(gtab + 16 * g + 4);
            Cg = reinterpret_cast<void*>(r[0]);
            sag = reinterpret_cast<const float*>(r[1]);
            sbg = reinterpret_cast<const float*>(r[2]);
            crow = 0;
        }
        constexpr int OES = OUT == 0 ? 4 : OUT <= 2 ? 2 : 1;   // output bytes per element
        const bool pair_ok = (ldc & 1) == 0 && (reinterpret_cast<size_t>(Cg) & (2 * OES - 1)) == 0;
        // this tile's per-row scales into rcs (the previous tile's epilogue read it before its
        // second named_sync, so it is free again)
        const bool rc_staged = SCALE == 1 && use_cmap && splits == 1;
        if (rc_staged) {
#pragma unroll
            for (int i = t; i < BN + 64; i += 128) {
                const int c = i < BN ? n0 + i : m0 + cw * 64 + (i - BN);
                const bool in = i < BN ? c < N : c < M;
                const float* src = in ? (i < BN ? sbg : sag) + c : sbg;
                asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
                             :: "r"(smem_u32(rcs + i)), "l"(src), "r"(in ? 4 : 0) : "memory");
            }
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
#pragma unroll
        for (int i = 0; i < NR; i++) acc[i] = 0.f;
        const int r0 = m0 + cw * 64 + warp * 16 + (lane >> 2), r1 = r0 + 8;
        // block scales of K-tile kt for rows r0, r1 (1 otherwise); hi (BN > 128): those of B's
        // next block, 0 past N
        auto scales_of = [&](int kt, float& s0, float& s1, float* hi = nullptr) {   // kt counts from kb0
            kt += kb0;
            s0 = s1 = 1.f;
            if (SCALE == 2) {
                const float a0 = r0 < M ? sag[(size_t)r0 * kblocks + kt] : 0.f;
                const float a1 = r1 < M ? sag[(size_t)r1 * kblocks + kt] : 0.f;
                const float b = sbg[(size_t)nb0 * kblocks + kt];
                s0 = a0 * b;
                s1 = a1 * b;
                if constexpr (BN > 128) {
                    const float b2 = nb0 + 1 < nbs ? sbg[(size_t)(nb0 + 1) * kblocks + kt] : 0.f;
                    hi[0] = a0 * b2;
                    hi[1] = a1 * b2;
                }
            }
        };
        // wait for stage s (unless `ready`), issue its wgmma of columns WN * half.. into p (the
        // first with scale-d = `keep`), commit
        auto issue = [&](float* p, int s, int keep = 0, int half = 0, bool ready = false) {
            if (!ready) mbar_wait(smem_u32(&full_bar[s]), (it / ST) & 1);
            const u32 aT = sbase + s * STAGE_BYTES + cw * 64 * 128;
            const u32 bT = sbase + s * STAGE_BYTES + TILE_A + half * WN * 128;
            wg_fence();
#pragma unroll
            for (int k = 0; k < STEPS; k++) {
                const u32 off = (k & 3) * 32;
                wg_mma<TA, TB, WN>(p, wg_desc(aT + (k >> 2) * ATOM + off), wg_desc(bT + (k >> 2) * BN * 128 + off),
                                   k > 0 || keep);
            }
            wg_commit();
        };
        // acc[half * NP ..] += p (scaled per row for block scaling): the partial of wgmma columns
        // WN * half .., which lie in the accumulator's layout right after those of the half before
        auto promote = [&](const float* p, float s0, float s1, float t0 = 0.f, float t1 = 0.f, int half = 0) {
#pragma unroll
            for (int j = 0; j < NP / 4; j++) {
                const int a = half * NP + 4 * j;   // acc index of p[4 j]; column group a / 4
                if (SCALE == 2) {
                    const bool lo = BN == 128 || a / 4 < jsplit;   // column block nb0 (else nb0 + 1: t0, t1)
                    const float u0 = lo ? s0 : t0, u1 = lo ? s1 : t1;
                    acc[a + 0] = fmaf(p[4 * j + 0], u0, acc[a + 0]);
                    acc[a + 1] = fmaf(p[4 * j + 1], u0, acc[a + 1]);
                    acc[a + 2] = fmaf(p[4 * j + 2], u1, acc[a + 2]);
                    acc[a + 3] = fmaf(p[4 * j + 3], u1, acc[a + 3]);
                } else {
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[a + e] += p[4 * j + e];
                }
            }
        };
        auto release = [&](int s) { if (lane == 0) mbar_arrive(smem_u32(&empty_bar[s])); };
        if constexpr (DIRECT) {
            // fp16 products accumulate in fp32 in the tensor cores across all K-tiles (no
            // partial to promote: 128 accumulator registers); a stage is released once the
            // next K-tile's wgmma are issued and its own have completed
            if (nk > 0) {
                issue(acc, it % ST);
                it++;
                for (int kt = 1; kt < nk; kt++, it++) {
                    issue(acc, it % ST, 1);
                    wg_wait1();
                    release((it - 1) % ST);
                }
                wg_wait0();
                release((it - 1) % ST);
            }
        } else if (HALVES) {
            // each K-tile as two 128-column halves through one partial: issue, wait, promote;
            // the stage is released once both halves' wgmma have completed
            for (int kt = 0; kt < nk; kt++, it++) {
                float s0, s1, hi[2] = {0.f, 0.f};
                scales_of(kt, s0, s1, hi);
                issue(part, it % ST);
                wg_wait0();
                promote(part, s0, s1);
                issue(part, it % ST, 0, 1, true);
                wg_wait0();
                release(it % ST);
                promote(part, s0, s1, hi[0], hi[1], 1);
            }
        } else if (!OVL) {
            for (int kt = 0; kt < nk; kt++, it++) {
                float s0, s1, hi[2] = {0.f, 0.f};
                scales_of(kt, s0, s1, hi);
                issue(part, it % ST);
                wg_wait0();
                release(it % ST);
                promote(part, s0, s1, hi[0], hi[1]);
            }
        } else {
            // K-tile kt goes into part (kt even) or part2 (kt odd); while it runs the previous
            // one is promoted. Static register arrays: K-tile 0 first, then two at a time (a
            // conditional inside the loop makes ptxas serialize the wgmma, C7514).
            float q0, q1, n0, n1;
            scales_of(0, q0, q1);
            issue(part, it % ST);
            it++;
            int kt = 1;
            for (; kt + 1 < nk; kt += 2) {
                scales_of(kt, n0, n1);
                issue(part2, it % ST);
                wg_wait1();
                release((it - 1) % ST);
                promote(part, q0, q1);
                it++;
                scales_of(kt + 1, q0, q1);
                issue(part, it % ST);
                wg_wait1();
                release((it - 1) % ST);
                promote(part2, n0, n1);
                it++;
            }
            if (kt < nk) {
                scales_of(kt, n0, n1);
                issue(part2, it % ST);
                wg_wait1();
                release((it - 1) % ST);
                promote(part, q0, q1);
                it++;
                wg_wait0();
                release((it - 1) % ST);
                promote(part2, n0, n1);
            } else {
                wg_wait0();
                release((it - 1) % ST);
                promote(part, q0, q1);
            }
        }

        // epilogue: thread holds rows r0, r1 and columns n0 + 8j + 2(lane%4) + {0,1}
        const float st = SCALE == 0 ? sag[0] * sbg[0] : 1.f;
        float ra0 = SCALE == 1 && !rc_staged && r0 < M ? sag[r0] : 1.f;
        float ra1 = SCALE == 1 && !rc_staged && r1 < M ? sag[r1] : 1.f;
        if (splits > 1) {   // this split's unscaled fp32 sum (block scales already applied)
            float* w = ws + (size_t)sp * M * N;
#pragma unroll
            for (int j = 0; j < NR / 4; j++) {
                const int c = n0 + 8 * j + 2 * (lane & 3);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = h ? r1 : r0;
                    if (r >= M) continue;
                    if (c < N) w[(size_t)r * N + c] = acc[4 * j + 2 * h];
                    if (c + 1 < N) w[(size_t)r * N + c + 1] = acc[4 * j + 2 * h + 1];
                }
            }
            continue;
        }
        if (use_cmap) {
            if (t == 0) {
                asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
                if (tmap_of(2, g) != tc) {
                    tc = tmap_of(2, g);
                    tmap_acquire(tc);
                }
            }
            if (rc_staged) asm volatile("cp.async.wait_all;" ::: "memory");
            named_sync(1 + cw, 128);                    // the staging buffer is free again (and rcs filled)
            if (rc_staged) {
                ra0 = rcs[BN + r0 - (m0 + cw * 64)];   // rcs[BN + i]: row m0 + cw * 64 + i
                ra1 = rcs[BN + r1 - (m0 + cw * 64)];
            }
            // The packed outputs of column groups j, j + 1 and both row halves are the four 8 x 8
            // matrices of one stmatrix (the accumulator's fragment layout is stmatrix's): lane
            // gives the address of row lane % 8 of matrix lane / 8, a 16-byte row of the swizzled
            // box (conflict-free). Without bias, ReLU or amax (PLAIN) no per-element test is left.
            auto stage_out = [&](auto plain) {
                constexpr bool PLAIN = decltype(plain)::value;
                // Column scales (SCALE 1) of column groups j, j + 1 from rcs, read one step ahead:
                // the stmatrix's memory clobber keeps a load from moving above the previous store.
                float cbn[4] = {1.f, 1.f, 1.f, 1.f};
                auto col_scales = [&](int j, float* cb) {
#pragma unroll
                    for (int q = 0; q < 4; q += 2) {
                        const float2 v = *reinterpret_cast<const float2*>(rcs + 8 * (j + (q >> 1)) + 2 * (lane & 3));
                        cb[q] = v.x;
                        cb[q + 1] = v.y;
                    }
                };
                if (SCALE == 1) col_scales(0, cbn);
#pragma unroll
                for (int j = 0; j < NR / 4; j += 2) {
                    u32 w[4];
                    const float cb[4] = {cbn[0], cbn[1], cbn[2], cbn[3]};
                    if (SCALE == 1 && j + 2 < NR / 4) col_scales(j + 2, cbn);
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        const int jj = j + (q >> 1), h = q & 1;
                        const int c = n0 + 8 * jj + 2 * (lane & 3);
                        float v0 = acc[4 * jj + 2 * h], v1 = acc[4 * jj + 2 * h + 1];
                        if (SCALE == 0) { v0 *= st; v1 *= st; }
                        else if (SCALE == 1) {
                            const float ra = h ? ra1 : ra0;
                            v0 *= ra * cb[q & 2];
                            v1 *= ra * cb[(q & 2) + 1];
                        }
                        if constexpr (!PLAIN) finish(v0, v1, m0 + cw * 64 + warp * 16 + (lane >> 2) + 8 * h, c);
                        w[q] = wg_out16x2(v0, v1, OUT == 1);
                    }
                    const int mi = lane >> 3, jj = j + (mi >> 1), row = warp * 16 + (mi & 1) * 8 + (lane & 7);
                    const u32 addr = stage_c + (jj >> 3) * 8192 + wg_swz(row, jj & 7, lane & 7);
                    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
                                 :: "r"(addr), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");
                }
            };
            if (bias == nullptr && !relu && oamax == nullptr) stage_out(WgFlag<true>());
            else stage_out(WgFlag<false>());
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            named_sync(1 + cw, 128);
            if (t == 0) {
                const int z = gtab != nullptr ? 0 : g;   // gtab: C's maps are (N, M, 1)
#pragma unroll
                for (int b = 0; b < BN / 64; b++) tma_store_3d(tc, stage_c + b * 8192, n0 + 64 * b, m0 + cw * 64, z);
                asm volatile("cp.async.bulk.commit_group;" ::: "memory");
            }
            continue;
        }
#pragma unroll
        for (int j = 0; j < NR / 4; j++) {
            const int c = n0 + 8 * j + 2 * (lane & 3);
            if (c >= N) continue;
            const bool two = c + 1 < N;
            float cb0 = 1.f, cb1 = 1.f;
            if (SCALE == 1) { cb0 = sbg[c]; cb1 = two ? sbg[c + 1] : 1.f; }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = h ? r1 : r0;
                if (r >= M) continue;
                float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
                if (SCALE == 0) { v0 *= st; v1 *= st; }
                else if (SCALE == 1) { const float ra = h ? ra1 : ra0; v0 *= ra * cb0; v1 *= ra * cb1; }
                finish(v0, v1, r, c);
                const size_t o = (crow + r) * ldc + c;
                if (OUT >= 3) {
                    u8* p = reinterpret_cast<u8*>(Cg) + o;
                    const u32 w = fp8q_pair<OUT - 2>(v0, v1, oq);
                    if (two && pair_ok) *reinterpret_cast<u16*>(p) = (u16)w;
                    else { p[0] = (u8)w; if (two) p[1] = (u8)(w >> 8); }
                } else if (OUT == 0) {
                    float* p = reinterpret_cast<float*>(Cg) + o;
                    if (two && pair_ok) *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
                    else { p[0] = v0; if (two) p[1] = v1; }
                } else {
                    u16* p = reinterpret_cast<u16*>(Cg) + o;
                    const u16 h0 = wg_out16(v0, OUT == 1), h1 = wg_out16(v1, OUT == 1);
                    if (two && pair_ok) *reinterpret_cast<u32*>(p) = (u32)h0 | ((u32)h1 << 16);
                    else { p[0] = h0; if (two) p[1] = h1; }
                }
            }
        }
    }
    if (use_cmap && t == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    if (oamax != nullptr) wg_warp_max(oamax, omax);
}

// C = (sum over s of ws[s]) with gemm_wgmma's epilogue scaling and conversion: the splits' fp32
// sums added in split order (deterministic), then scaled exactly as the one-split epilogue does.
template <int SCALE, int OUT>
__global__ void __launch_bounds__(256) splitk_reduce(const float* __restrict__ ws, void* __restrict__ C,
                                                     int M, int N, int splits, const float* __restrict__ sa,
                                                     const float* __restrict__ sb) {
    const size_t total = (size_t)M * N;
    const float st = SCALE == 0 ? sa[0] * sb[0] : 1.f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        float v = ws[i];
        for (int s = 1; s < splits; s++) v += ws[(size_t)s * total + i];
        if (SCALE == 0) v *= st;
        else if (SCALE == 1) v *= sa[i / N] * sb[i % N];
        if (OUT == 0) reinterpret_cast<float*>(C)[i] = v;
        else reinterpret_cast<u16*>(C)[i] = wg_out16(v, OUT == 1);
    }
}

// B (K x N, row-major, ldb) -> Bt (N x ldt, row-major): Bt[n, k] = B[k, n]; 64 x 64 byte tiles.
__global__ void __launch_bounds__(256) transpose_u8(const u8* __restrict__ B, u8* __restrict__ Bt,
                                                    int K, int N, int ldb, int ldt) {
    __shared__ u8 tile[64][65];
    const int k0 = blockIdx.y * 64, n0 = blockIdx.x * 64;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;   // 16 x 16 threads, 4 bytes each
    const bool vec = (ldb & 3) == 0 && ((size_t)B & 3) == 0;
#pragma unroll
    for (int p = 0; p < 4; p++) {
        const int k = k0 + ty + 16 * p, n = n0 + 4 * tx;
        u32 w = 0;
        if (k < K) {
            if (vec && n + 3 < N) w = *reinterpret_cast<const u32*>(B + (size_t)k * ldb + n);
            else for (int i = 0; i < 4; i++) if (n + i < N) w |= (u32)B[(size_t)k * ldb + n + i] << (8 * i);
        }
#pragma unroll
        for (int i = 0; i < 4; i++) tile[ty + 16 * p][4 * tx + i] = (u8)(w >> (8 * i));
    }
    __syncthreads();
    const bool vecw = (ldt & 3) == 0 && ((size_t)Bt & 3) == 0;
#pragma unroll
    for (int p = 0; p < 4; p++) {
        const int n = n0 + ty + 16 * p, k = k0 + 4 * tx;
        if (n >= N) continue;
        u32 w = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) w |= (u32)tile[4 * tx + i][ty + 16 * p] << (8 * i);
        if (vecw && k + 3 < K) *reinterpret_cast<u32*>(Bt + (size_t)n * ldt + k) = w;
        else for (int i = 0; i < 4; i++) if (k + i < K) Bt[(size_t)n * ldt + k + i] = (u8)(w >> (8 * i));
    }
}

// Decode the 8 codes at row r, columns k..k+7 (zeros past K) into 16 bytes of fp16; STREAM
// marks the codes as read once (ld.global.cs).
template <bool STREAM>
__device__ __forceinline__ void decode8_f16(const u8* __restrict__ src, u16* __restrict__ dst, int r, int k,
                                            int K, int lds, int ldd, bool vec, const u16* t) {
    const u8* p = src + (size_t)r * lds + k;
    u32 lo = 0, hi = 0;
    if (vec && k + 8 <= K) {
        const uint2 v = STREAM ? __ldcs(reinterpret_cast<const uint2*>(p))
                               : *reinterpret_cast<const uint2*>(p);
        lo = v.x; hi = v.y;
    } else {
        for (int i = 0; i < 8; i++) {
            const u32 c = k + i < K ? p[i] : 0u;
            if (i < 4) lo |= c << (8 * i); else hi |= c << (8 * (i - 4));
        }
    }
    uint4 o;
    o.x = (u32)t[lo & 0xFF] | ((u32)t[(lo >> 8) & 0xFF] << 16);
    o.y = (u32)t[(lo >> 16) & 0xFF] | ((u32)t[lo >> 24] << 16);
    o.z = (u32)t[hi & 0xFF] | ((u32)t[(hi >> 8) & 0xFF] << 16);
    o.w = (u32)t[(hi >> 16) & 0xFF] | ((u32)t[hi >> 24] << 16);
    if (k + 8 > K) {  // zero the padding (code 0 may not decode to +0 in every format)
        u32 m[4] = {o.x, o.y, o.z, o.w};
        for (int i = 0; i < 8; i++) if (k + i >= K) m[i >> 1] &= (i & 1) ? 0x0000FFFFu : 0xFFFF0000u;
        o = make_uint4(m[0], m[1], m[2], m[3]);
    }
    *reinterpret_cast<uint4*>(dst + (size_t)r * ldd + k) = o;
}

// Codes (rows x K, row stride lds bytes) -> fp16 (rows x ldd halves, ldd >= K, a multiple of 8)
// through the format's 256-entry fp16 table; columns K..ldd-1 are written as zeros. 8 codes per
// thread per step (16 bytes out), grid-stride.
__global__ void __launch_bounds__(256) decode_f16_rows(const u8* __restrict__ src, u16* __restrict__ dst,
                                                       int rows, int K, int lds, int ldd,
                                                       const u16* __restrict__ tab) {
    __shared__ u16 t[256];
    t[threadIdx.x] = tab[threadIdx.x];
    __syncthreads();
    const int cpr = ldd >> 3;
    const size_t total = (size_t)rows * cpr;
    const bool vec = (lds & 7) == 0 && ((size_t)src & 7) == 0;
    for (size_t w = (size_t)blockIdx.x * blockDim.x + threadIdx.x; w < total; w += (size_t)gridDim.x * blockDim.x) {
        decode8_f16<false>(src, dst, (int)(w / cpr), (int)(w % cpr) * 8, K, lds, ldd, vec, t);
    }
}

// Both operands of an f16 GEMM in one launch: A codes (rowsA x K, stride lda) -> dA and B codes
// (rowsB x K, stride ldb) -> dB, each (rows x ldd halves, zero padding), through their formats'
// fp16 tables tA / tB. Work item w < rowsA * ldd/8 is A's, the rest B's; 8 codes per item, as
// decode_f16_rows (one launch and one table load instead of two).

__global__ void __launch_bounds__(256) decode_f16_pair(const u8* __restrict__ srcA, u16* __restrict__ dA, int rowsA,
                                                       int lda, const u8* __restrict__ srcB, u16* __restrict__ dB,
                                                       int rowsB, int ldb, int K, int ldd,
                                                       const u16* __restrict__ tA, const u16* __restrict__ tB) {
    __shared__ u16 t[512];
    t[threadIdx.x] = tA[threadIdx.x];
    t[256 + threadIdx.x] = tB[threadIdx.x];
    __syncthreads();
    const int cpr = ldd >> 3;
    const size_t na = (size_t)rowsA * cpr, total = na + (size_t)rowsB * cpr;
    const bool va = (lda & 7) == 0 && ((size_t)srcA & 7) == 0;
    const bool vb = (ldb & 7) == 0 && ((size_t)srcB & 7) == 0;
    for (size_t w = (size_t)blockIdx.x * blockDim.x + threadIdx.x; w < total; w += (size_t)gridDim.x * blockDim.x) {
        if (w < na) decode8_f16<true>(srcA, dA, (int)(w / cpr), (int)(w % cpr) * 8, K, lda, ldd, va, t);
        else {
            const size_t v = w - na;
            decode8_f16<true>(srcB, dB, (int)(v / cpr), (int)(v % cpr) * 8, K, ldb, ldd, vb, t + 256);
        }
    }
}

// The conversions of the quantize-on-load and of the 8-bit epilogue over an array (x: 2n float32
// -> out: 2n codes) at the scale *s, checked on their own against the CPU's quantize
// (benchmarks/gpu_fused.py --check). F: 1 E4M3, 2 E5M2. FAST = 0: fp8q_pair (the epilogue's);
// 1: fp8q_pair_fast (the quantize-on-load's fast route, careful where it gives up).
template <int F, int FAST>
__global__ void __launch_bounds__(256) fp8q_check(const float2* __restrict__ x, u16* __restrict__ out, long long n,
                                                  const float* __restrict__ s, u32 special, u32 codes) {
    const Fp8Q p = fp8q_make(*s, special, codes);
    const int path = fp8q_path(p);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float2 v = x[i];
        if (!FAST) out[i] = (u16)fp8q_pair<F>(v.x, v.y, p);
        else if (path == FP8Q_MUL) out[i] = (u16)fp8q_pair_fast<F, FP8Q_MUL>(v.x, v.y, p);
        else if (path == FP8Q_RCP) out[i] = (u16)fp8q_pair_fast<F, FP8Q_RCP>(v.x, v.y, p);
        else out[i] = (u16)fp8q_pair<F>(v.x, v.y, p);
    }
}
