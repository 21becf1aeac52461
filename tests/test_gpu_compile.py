"""Every CUDA source compiles for sm_90a with nvcc (CPU only; skipped when nvcc is absent)."""

import shutil
import subprocess
import sys

import pytest

from fp8lab.formats import data_dir
from fp8lab.gpu import _loader

NVCC = shutil.which("nvcc")
SOURCES = sorted(p.name for p in data_dir("gpu").glob("*.cu"))


def test_every_source_is_listed():
    assert set(SOURCES) == set(_loader._INSTANCE_LISTS), "add new .cu files to _loader._INSTANCE_LISTS"


def test_line_directives_name_real_files():
    src = _loader.source("codecs.cu")
    assert '#line 1 "' in src and "fp8_codec.cuh" in src and "codecs.cu" in src


# gemm_wgmma.cu holds 170-odd instances of one large kernel (tens of minutes in one unit on two
# cores): here every eighth of them, plain and fused alike; .ci/compile_cuda.sh compiles them all.
PART = {"gemm_wgmma.cu": "0/8"}


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("name", SOURCES)
def test_nvcc_compiles(name, tmp_path):
    cu = tmp_path / name
    cu.write_text(_loader.emit(name, "hif8", PART.get(name, "0/1")))
    r = subprocess.run([NVCC, "-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", "-cubin",
                        "-Xptxas", "-v", "-o", str(tmp_path / "out.cubin"), str(cu)],
                       capture_output=True, text=True)
    sys.stderr.write(r.stderr)
    assert r.returncode == 0, r.stderr[-4000:]
    # ptxas serializing wgmma (C7514...) would silently undo the overlapped promotion
    assert "Potential Performance Loss: wgmma" not in r.stderr, r.stderr[-4000:]
