"""Parts of the GPU modules that need no GPU: the GEMM's launch decisions (the SM count is
stubbed) and host-checkable helpers."""

import numpy as np
import pytest

import fp8lab.gpu.gemm as GM


@pytest.fixture
def sms(monkeypatch):
    monkeypatch.setattr(GM, "_sm_count", lambda: 132)
    return 132


@pytest.mark.parametrize("tiles,ktiles", [(1, 64), (2, 17), (4, 33), (8, 64), (66, 16), (32, 200)])
def test_split_k_fills_the_sms_with_whole_k_tiles(sms, tiles, ktiles):
    s = GM._splits(tiles, ktiles, 1)
    assert 2 <= s <= ktiles // 4           # every split has >= 4 K-tiles
    assert tiles * s <= sms                # one wave: no split waits for another
    assert tiles * (s + 1) > sms or s == ktiles // 4   # and no more SMs could be used


@pytest.mark.parametrize("tiles,ktiles,G", [(67, 64, 1), (8, 15, 1), (4, 33, 3), (108, 64, 1)])
def test_no_split_for_many_tiles_short_k_or_groups(sms, tiles, ktiles, G):
    assert GM._splits(tiles, ktiles, G) == 1


def test_split_k_can_be_switched_off(sms, monkeypatch):
    monkeypatch.setattr(GM, "SPLIT_K", False)
    assert GM._splits(1, 64, 1) == 1


def test_every_fused_instance_is_compiled_by_the_nvcc_check():
    # the CI nvcc build compiles _wg_instances(); gemm_fused must not launch anything else
    listed = set(GM._wg_instances())
    for ta in (0, 1):
        for tb in (0, 1):
            for qa in GM._QA_MODES:
                for out in GM.FUSED_OUT:
                    assert GM._fused_instance(ta, tb, out, qa) in listed
    # codes as A use gemm's own instance (overlapped promotion) for 16-bit and float32 outputs
    assert GM._fused_instance(0, 0, "bfloat16", 0) == GM._wg_instance(0, 0, "tensor", "bfloat16", True)


@pytest.mark.parametrize("M,K,itemsize", [(16384, 512, 2), (2048, 1024, 2), (8192, 256, 2), (8192, 256, 4),
                                            (100, 1, 4), (300, 520, 2), (64, 1 << 20, 2)])
def test_quantize_on_load_units(M, K, itemsize):
    # units of one tile row: a power of two up to 128, each unit at least _qa_chunks() chunks where
    # a tile row has that many, and no larger than needed (doubling would go below the floor)
    p = GM._qa_parts(M, K, itemsize)
    cpr = -(-K * itemsize // 16)
    assert p in (1, 2, 4, 8, 16, 32, 64, 128)
    assert p == 1 or (128 // p) * cpr >= GM._qa_chunks()
    assert p == 128 or (128 // (2 * p)) * cpr < GM._qa_chunks()


def test_quantize_on_load_staging_matches_the_kernel():
    # the host reserves the shared memory the kernel's QA_RAW staging slots (16 KB each) use
    import re

    from fp8lab.gpu import _loader
    m = re.search(r"^#define QA_RAW (\d+)", _loader.source("gemm_wgmma.cu"), re.M)
    assert m and int(m.group(1)) * 16384 == GM._QA_RAW_BYTES


def test_quantize_on_load_constants_match_the_kernel():
    # loads per thread of the convert-once phase, threads per CTA, and the QA offset that selects it
    import re

    from fp8lab.gpu import _loader
    src = _loader.source("gemm_wgmma.cu")
    m = re.search(r"^#define QA_NB (\d+)", src, re.M)
    assert m and int(m.group(1)) == GM._QA_NB
    m = re.search(r"^#define WG_THREADS (\d+)", src, re.M)
    assert m and int(m.group(1)) == GM._WG_THREADS
    assert f"constexpr bool QONCE = QA >= {GM._QA_ONCE};" in src
    assert GM._QA_MODES == (0, 1, 2, 3, 5, 6, 7)


def test_launch_arguments_match_the_kernel_signature():
    # the host passes 14 leading arguments, then _NO_FUSION's (or the fused call's) tail; a
    # count that differs from gemm_wgmma's parameters would shift every argument after it
    import re

    from fp8lab.gpu import _loader
    src = _loader.source("gemm_wgmma.cu")
    m = re.search(r"__global__ void __launch_bounds__\(WG_THREADS, 1\) gemm_wgmma\((.*?)\) \{", src, re.S)
    assert m, "gemm_wgmma's signature not found"
    assert m.group(1).count(",") + 1 == 14 + len(GM._NO_FUSION)


def test_ragged_table_lists_each_gemm_and_its_first_tile():
    # (M, N, K, ldc, C, sa, sb) per GEMM; an empty output and K = 0 get no tiles
    rows = [(300, 200, 100, 200, 2 ** 40 + 16, 5, 7), (0, 5, 5, 5, 1, 1, 1), (128, 129, 256, 129, 3, 3, 3),
            (7, 9, 0, 9, 1, 1, 1), (1, 1, 1, 1, 8, 8, 8)]
    t = GM._ragged_table(rows)
    G = len(rows)
    assert t.dtype == np.int32 and t.size == 16 * G + G + 1
    assert list(t[16 * G:]) == [0, 6, 6, 8, 8, 9]     # 3x2, 0, 1x2, 0, 1x1 tiles
    for g, (M, N, K, ldc, c, pa, pb) in enumerate(rows):
        r = t[16 * g:16 * g + 16]
        assert list(r[:4]) == [M, N, K, ldc] and r[10] == -(-K // 128)
        assert list(r[4:10].view(np.int64)) == [c, pa, pb]


def test_ragged_table_refuses_int32_tile_overflow():
    with pytest.raises(ValueError, match="output tiles"):
        GM._ragged_table([(2 ** 20, 2 ** 20, 128, 2 ** 20, 0, 0, 0)] * 40)


def test_wide_tile_choice(sms, monkeypatch):
    assert GM.WIDE_TILES == "auto" and GM.WIDE_FP8 == "auto"
    assert GM._tile_n(1, "tensor", 1, 1, 8192, 8192, 8192) == 192
    assert GM._tile_n(2, "row_col", 1, 1, 8192, 8192, 8192) == 256
    # 1024 columns in 192-wide tiles leave 12.5% unused, in 256-wide ones none
    assert GM._tile_n(1, "tensor", 1, 1, 65536, 1024, 8192) == 256
    assert GM._tile_n(1, "tensor", 1, 1, 8192, 1024, 8192) == 128    # 64 x 4 = 256 tiles < 2 x 132
    assert GM._tile_n(1, "tensor", 1, 1, 128, 8192, 8192) == 128     # 43 tiles: fewer than twice the SMs
    assert GM._tile_n(1, "tensor", 1, 1, 768, 8192, 8192) == 128     # 6 x 43 = 258 and 6 x 32 tiles < 2 x 132
    assert GM._tile_n(1, "tensor", 1, 1, 896, 8192, 8192) == 192     # 7 x 43 = 301
    assert GM._tile_n(1, "tensor", 1, 1, 65536, 1000, 8192) == 256   # 4 x 256 columns, as many as 8 x 128
    assert GM._tile_n(1, "tensor", 1, 1, 65536, 640, 8192) == 128    # 3 x 256 = 768 columns against 640
    # short K loops: 256 first (half the tiles' fixed costs), long ones: 192 first
    assert GM._tile_n(1, "tensor", 1, 1, 65536, 4096, 512) == 256
    assert GM._tile_n(1, "row_col", 1, 1, 8192, 3456, 512) == 256    # 14 x 256 = 3584: 3.7% more columns
    assert GM._tile_n(1, "tensor", 1, 1, 65536, 4096, 2048) == 192
    assert GM._tile_n(1, "tensor", 1, 1, 8192, 3072, 512) == 256
    assert GM._tile_n(1, "tensor", 1, 1, 8192, 2880, 512) == 192     # 12 x 256 = 3072 > 1.04 x 2944; 15 x 192
    # block scales: 256 (192 measured slower than 128)
    assert GM._tile_n(1, "block", 1, 1, 8192, 8192, 8192) == 256
    assert GM._tile_n(1, "block", 1, 1, 16384, 768, 8192) == 256     # 128 x 3 tiles
    assert GM._tile_n(1, "block", 1, 1, 2048, 1024, 8192) == 128     # 16 x 4 tiles
    monkeypatch.setattr(GM, "WIDE_FP8", 256)
    assert GM._tile_n(1, "tensor", 1, 1, 8192, 8192, 8192) == 256
    assert GM._wg_instance(0, 0, "tensor", "bfloat16", bn=256) in GM._wg_instances()
    monkeypatch.setattr(GM, "WIDE_FP8", "auto")
    monkeypatch.setattr(GM, "WIDE_TILES", "always")
    assert GM._tile_n(1, "block", 1, 1, 8192, 8192, 8192) == 256
    assert GM._tile_n(1, "tensor", 1, 1, 65536, 1024, 8192) == 192
    assert GM._tile_n(2, "block", 1, 1, 8192, 8192, 8192) == 128   # f16 block scales need promoted partials
    assert GM._tile_n(1, "tensor", 2, 1, 8192, 8192, 8192) == 128
    assert GM._tile_n(1, "tensor", 1, 4, 8192, 8192, 8192) == 128
    monkeypatch.setattr(GM, "WIDE_FP8", 128)
    with pytest.raises(ValueError, match="'auto' or one of 192, 256"):
        GM._tile_n(1, "tensor", 1, 1, 8192, 8192, 8192)
    monkeypatch.setattr(GM, "WIDE_FP8", "auto")
    monkeypatch.setattr(GM, "WIDE_TILES", "yes")
    with pytest.raises(ValueError, match="'auto', 'always' or 'never'"):
        GM._tile_n(1, "tensor", 1, 1, 8192, 8192, 8192)


def test_forget_plans_drops_every_cache_that_holds_a_kernel(monkeypatch):
    # benchmarks that swap builds of a kernel source (benchmarks/gpu_ab.py) rely on this: a plan
    # left in any cache would keep launching the kernel of the build it was made under
    from fp8lab.gpu._cache import BoundedCache
    no_kernels = {"_tmap_cache", "_work", "_scalars"}   # tensor maps, workspaces, device scalars
    caches = {n for n, v in vars(GM).items() if isinstance(v, BoundedCache)} - no_kernels
    assert {"_plans", "_gemm_fast", "_fused_fast"} <= caches
    for n in caches:
        monkeypatch.setattr(GM, n, BoundedCache(4, capturing=lambda: False))
        getattr(GM, n).put(("key", n), "plan")
    GM._forget_plans()
    assert {n: len(getattr(GM, n)) for n in caches} == {n: 0 for n in caches}


def test_ab_host_settings_apply_per_build_and_never_reach_the_defines(monkeypatch):
    # gpu_ab.py times builds side by side; a host setting (@NAME=VALUE) left over from one build
    # would silently change what the next build is timed on
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gpu_ab
    monkeypatch.setattr(gpu_ab, "_HOST_SAVED", {})
    monkeypatch.setattr(GM, "WIDE_FP8", "auto")
    monkeypatch.setattr(GM, "WIDE_TILES", "auto")
    monkeypatch.setattr(GM._loader, "kernel", GM._loader.kernel)   # use() reroutes it
    monkeypatch.setattr(gpu_ab, "_KERNEL", None)
    monkeypatch.setattr(gpu_ab, "_QA_NB", None)
    monkeypatch.setattr(GM, "_QA_NB", GM._QA_NB)
    builds = gpu_ab.parse_builds("base=WG_X=0;w=@WIDE_FP8=192,WG_X=1;t=@WIDE_TILES=always")
    assert gpu_ab.device_defs(builds["w"]) == (("WG_X", "1"),)
    seen = []
    for name in ("w", "t", "base", "w"):
        gpu_ab.use(name, builds[name])
        seen.append((GM.WIDE_FP8, GM.WIDE_TILES))
    assert seen == [(192, "auto"), ("auto", "always"), ("auto", "auto"), (192, "auto")]
    with pytest.raises(SystemExit, match="no setting 'NOPE'"):
        gpu_ab.use("bad", gpu_ab.parse_builds("bad=@NOPE=1")["bad"])
    with pytest.raises(ValueError, match="NAME=VALUE"):
        gpu_ab.parse_builds("bad=@=1")


class _HalfToFloatLikeTheDevice:
    """NumPy, but widening float16 as the device's cvt.f32.f16 does: a NaN loses its sign."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def ascontiguousarray(x, dtype=None):
        y = np.ascontiguousarray(x, dtype=dtype)
        if x.dtype == np.float16 and y.dtype == np.float32:
            y.view(np.uint32)[np.isnan(y)] &= 0x7FFFFFFF
        return y


@pytest.mark.parametrize("xp", [np, _HalfToFloatLikeTheDevice()], ids=["numpy", "device-like"])
def test_widen_float16_is_exact_and_keeps_every_sign(xp):
    from fp8lab.gpu.codecs import _widen_float16
    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16).reshape(256, 256)
    for x in (every, every[:, ::3]):   # all 2^16 codes; strided rows
        y = _widen_float16(x, xp)
        assert y.dtype == np.float32 and y.flags.c_contiguous and y.shape == x.shape
        assert np.array_equal(y.view(np.uint32) >> 31, x.view(np.uint16) >> 15)   # NaNs too
        ok = ~np.isnan(x)
        assert np.array_equal(y[ok].view(np.uint32), x[ok].astype(np.float32).view(np.uint32))
        assert np.isnan(y).sum() == np.isnan(x).sum() > 0
