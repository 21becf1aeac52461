"""Launch decisions of the GPU GEMM that need no GPU (the SM count is stubbed)."""

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
            for qa in range(4):
                for out in GM.FUSED_OUT:
                    assert GM._fused_instance(ta, tb, out, qa) in listed
    # codes as A use gemm's own instance (overlapped promotion) for 16-bit and float32 outputs
    assert GM._fused_instance(0, 0, "bfloat16", 0) == GM._wg_instance(0, 0, "tensor", "bfloat16", True)


def test_quantize_on_load_staging_matches_the_kernel():
    # the host reserves the shared memory the kernel's QA_RAW staging slots (16 KB each) use
    import re

    from fp8lab.gpu import _loader
    m = re.search(r"^#define QA_RAW (\d+)", _loader.source("gemm_wgmma.cu"), re.M)
    assert m and int(m.group(1)) * 16384 == GM._QA_RAW_BYTES


@pytest.mark.parametrize("tiles_n,ktiles,size", [(4, 4, 4), (8, 8, 8), (2, 2, 2), (16, 64, 8), (27, 4, 3),
                                                 (4, 2, 2), (3, 1, 1), (7, 64, 7), (1, 9, 1), (9, 2, 1)])
def test_quantize_on_load_cluster_size(tiles_n, ktiles, size):
    # the largest size <= 8 that divides the tile columns, with a K-tile for each of its CTAs
    assert GM._fused_cluster(tiles_n, ktiles) == size


def test_quantize_on_load_cluster_size_can_be_capped(monkeypatch):
    monkeypatch.setattr(GM, "FUSED_CLUSTER", 2)
    assert GM._fused_cluster(8, 8) == 2
    monkeypatch.setattr(GM, "FUSED_CLUSTER", 1)
    assert GM._fused_cluster(8, 8) == 1


def test_cluster_launch_structs_match_the_driver_layout():
    # CUlaunchConfig: 7 unsigned, the stream at 32, attrs at 40, numAttrs at 48, 56 bytes;
    # CUlaunchAttribute: the id, padding to 8, a 64-byte value union: 72 bytes
    import ctypes
    C, A = GM._LaunchConfig, GM._LaunchAttr
    assert (ctypes.sizeof(C), C.stream.offset, C.attrs.offset, C.nattrs.offset) == (56, 32, 40, 48)
    assert (ctypes.sizeof(A), A.value.offset) == (72, 8)


def test_cluster_launch_marshals_scalars_and_refuses_others():
    import numpy as np
    assert GM._c_arg(np.int32(-3)).value == -3
    assert GM._c_arg(np.uint32(0xFFFFFFFF)).value == 0xFFFFFFFF
    assert GM._c_arg(np.int64(1 << 40)).value == 1 << 40
    assert GM._c_arg(np.float32(0.5)).value == 0.5
    with pytest.raises(TypeError, match="not marshalled"):
        GM._c_arg(3)
