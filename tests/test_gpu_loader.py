"""The kernel loader's compile step: NVRTC options (IEEE float32, never -ftz=true), the on-disk
cache and the cubin it keeps. Runs without a GPU: a stand-in NVRTC binding is injected where
CuPy's would be imported; with CuPy's binding installed, one kernel is also compiled for real."""

import shutil
import struct
import subprocess
import sys
import types

import pytest

from fp8lab.gpu import _loader

CODE = 'extern "C" __global__ void k(float* x) { x[0] = x[0] * x[1] + x[2]; }\n'


def _elf(end: int, phoff: int = 64) -> bytes:
    """A 64-bit ELF image whose program header table (one 56-byte entry) ends at ``end``."""
    head = bytearray(64)
    head[:5] = b"\x7fELF\x02"
    struct.pack_into("<QQ", head, 0x20, phoff, 0)
    struct.pack_into("<HHHH", head, 0x36, 56, 1, 64, 0)
    return bytes(head) + b"\x01" * (end - 64 - 56) + struct.pack("<7Q", 0, 0, 0, 0, 0, 0, 8)


class FakeNVRTC(types.ModuleType):
    """The calls compile_instance makes, recorded; the cubin is one byte short, as CuPy's is."""

    class NVRTCError(Exception):
        pass

    def __init__(self, fail=False):
        super().__init__("nvrtc")
        self.compiled, self.fail = [], fail

    def getVersion(self):
        return (13, 0)

    def createProgram(self, src, name, headers, include_names):
        return {"src": src}

    def addNameExpression(self, prog, expr):
        prog["expr"] = expr

    def compileProgram(self, prog, options):
        self.compiled.append((prog["expr"], tuple(options)))
        if self.fail:
            raise self.NVRTCError("compile failed")

    def getProgramLog(self, prog):
        return "k.cu(1): error: something the source got wrong"

    def getCUBIN(self, prog):
        return _elf(64 + 56 + 100, phoff=64 + 100)[:-1]

    def getLoweredName(self, prog, expr):
        return "_Z1kPf" if expr != "k" else "k"

    def destroyProgram(self, prog):
        pass


@pytest.fixture
def fake(monkeypatch, tmp_path):
    nv = FakeNVRTC()
    libs = types.ModuleType("cupy_backends.cuda.libs")
    libs.nvrtc = nv
    for name, mod in (("cupy_backends", types.ModuleType("cupy_backends")),
                      ("cupy_backends.cuda", types.ModuleType("cupy_backends.cuda")),
                      ("cupy_backends.cuda.libs", libs), ("cupy_backends.cuda.libs.nvrtc", nv)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setenv("FP8LAB_KERNEL_CACHE", str(tmp_path / "cache"))
    return nv


def test_kernel_loads_the_cached_cubin_by_its_mangled_name(fake, monkeypatch):
    loaded = []

    class RawModule:   # cupy.RawModule(path=...): what kernel() hands the cubin to
        def __init__(self, *, path):
            self.path = path

        def get_function(self, name):
            loaded.append((self.path, name))
            return ("kernel", name)

    cupy = types.ModuleType("cupy")
    cupy.RawModule = RawModule
    cupy.cuda = types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=0))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(_loader, "_modules", {})
    defines = (("FMT_E_LOW", -9),)
    k = _loader.kernel("quantize.cu", "fp8_scales<1>", defines)
    assert k == ("kernel", "_Z1kPf") and len(fake.compiled) == 1
    path, name = loaded[0]
    assert name == "_Z1kPf" and path.endswith(".cubin") and path.startswith(str(_loader.cache_dir()))
    assert _loader.kernel("quantize.cu", "fp8_scales<1>", defines) is k   # memoized in the process
    assert len(fake.compiled) == 1 and len(loaded) == 1


def test_options_keep_float32_subnormals():
    assert "-ftz=false" in _loader.OPTIONS and "-ftz=true" not in _loader.OPTIONS
    assert "-arch=sm_90a" in _loader.OPTIONS


def test_compiles_once_then_reads_the_cache(fake, tmp_path):
    path, name = _loader.compile_instance(CODE, "k")
    assert name == "k" and path.parent == tmp_path / "cache"
    assert fake.compiled == [("k", _loader.OPTIONS)]
    # the cubin is stored whole: the byte the binding drops is restored
    assert path.read_bytes() == _elf(64 + 56 + 100, phoff=64 + 100)
    assert _loader.compile_instance(CODE, "k") == (path, name)
    assert len(fake.compiled) == 1
    # another instance, other code: compiled anew
    _loader.compile_instance(CODE, "k2")
    _loader.compile_instance(CODE + "// changed\n", "k")
    assert len(fake.compiled) == 3


def test_the_key_ignores_where_the_sources_lie(fake):
    # a cache built on one machine (sources under one path) serves another (another path)
    here = '#line 1 "/home/a/fp8lab/gpu/k.cu"\n' + CODE
    there = '#line 1 "/opt/x/site-packages/fp8lab/gpu/k.cu"\n' + CODE
    elsewhere = '#line 1 "/opt/x/site-packages/fp8lab/gpu/other.cu"\n' + CODE
    assert _loader.compile_instance(here, "k") == _loader.compile_instance(there, "k")
    assert len(fake.compiled) == 1
    _loader.compile_instance(elsewhere, "k")   # another file name is another source
    assert len(fake.compiled) == 2


def test_a_damaged_cache_entry_is_compiled_again(fake):
    path, _ = _loader.compile_instance(CODE, "k")
    path.write_bytes(b"\x7fELF truncated")
    path2, _ = _loader.compile_instance(CODE, "k")
    assert path2 == path and len(fake.compiled) == 2
    assert path.read_bytes() == _elf(64 + 56 + 100, phoff=64 + 100)


def test_compile_errors_carry_the_log(fake):
    fake.fail = True
    with pytest.raises(RuntimeError, match="could not compile k:\nk.cu.1.: error: something"):
        _loader.compile_instance(CODE, "k")


def test_whole_elf_pads_only_a_short_image():
    full = _elf(300, phoff=300 - 56)
    assert _loader.whole_elf(full[:-1]) == full
    assert _loader.whole_elf(full) == full
    assert _loader.whole_elf(b"not an elf image") == b"not an elf image"


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("FP8LAB_KERNEL_CACHE", raising=False)
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path / "cupy"))
    assert _loader.cache_dir() == tmp_path / "cupy" / "fp8lab"
    monkeypatch.setenv("FP8LAB_KERNEL_CACHE", str(tmp_path / "own"))
    assert _loader.cache_dir() == tmp_path / "own"


CUOBJDUMP = shutil.which("cuobjdump")


@pytest.mark.skipif(CUOBJDUMP is None, reason="cuobjdump is not on PATH")
def test_real_nvrtc_emits_no_flush_to_zero(monkeypatch, tmp_path):
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="CuPy's NVRTC binding is not installed")
    monkeypatch.setenv("FP8LAB_KERNEL_CACHE", str(tmp_path))
    path, name = _loader.compile_instance(CODE, "k")
    sass = subprocess.run([CUOBJDUMP, "-sass", str(path)], capture_output=True, text=True, check=True).stdout
    assert "FFMA" in sass and ".FTZ" not in sass
