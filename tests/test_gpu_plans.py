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
