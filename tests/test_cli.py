"""The ``fp8lab`` command line, run as a subprocess the way people run it.

* Golden output: each command's stdout is compared with a file in tests/golden/. After an
  intended change, regenerate them with ``FP8LAB_UPDATE_GOLDEN=1 pytest tests/test_cli.py`` and
  review the diff.
* The analyze JSON is checked against its schema, and every number in it against the library
  API (fp8lab.quantize + fp8lab.metrics.error_metrics) on the same tensors.
* Bad input: one subprocess per case, each beside a valid file that must still be analysed.

Variants that only change formatting run in-process through ``fp8lab.cli.main`` (no interpreter
start-up), to keep the suite fast.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fp8lab
from fp8lab import _io, cli

GOLDEN = Path(__file__).parent / "golden"
UPDATE = bool(os.environ.get("FP8LAB_UPDATE_GOLDEN"))
FAST = ["--formats", "e4m3", "--scaling", "tensor"]

# analyze needs the scaled-quantization and metrics modules of the library
needs_api = pytest.mark.skipif(
    importlib.util.find_spec("fp8lab.metrics") is None or not hasattr(fp8lab, "quantize"),
    reason="fp8lab.metrics / fp8lab.quantize not available")


def fp8lab_cmd(*args, cwd=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="100")
    return subprocess.run([sys.executable, "-m", "fp8lab", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with FP8LAB_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"output differs from {path}"


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("fp8lab: error:")]


def assert_clean_stderr(stderr: str) -> None:
    assert "Traceback" not in stderr
    assert "\r" not in stderr  # no progress bar when stderr is a pipe
    for ln in stderr.splitlines():
        assert ln.startswith("fp8lab: "), ln


# ----------------------------------------------------------------------------- fixture files
def _tensors():
    rng = np.random.default_rng(20261202)
    w = (0.05 * rng.standard_normal((32, 64))).astype(np.float32)
    act = rng.standard_t(3, size=(16, 128)).astype(np.float32)
    act[:, [7, 77]] *= 40.0
    bf = (1e-3 * rng.standard_normal((8, 32))).astype(np.float32)
    bf_bits = (bf.view(np.uint32) >> 16).astype(np.uint16)
    return w, act, bf_bits


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tensors")
    w, act, bf_bits = _tensors()
    _io.write_safetensors(d / "model.safetensors",
                          {"w": w, "ids": np.arange(6, dtype=np.int64), "bf": ("BF16", bf_bits)})
    np.save(d / "act.npy", act)
    return d


@pytest.fixture(scope="module")
def analyzed(data_dir):
    """One analyze run, reused by the golden, schema and API-equality tests."""
    out = data_dir / "out.json"
    proc = fp8lab_cmd("analyze", "act.npy", "model.safetensors", "--json", out.name,
                      cwd=data_dir)
    return proc, json.loads(out.read_text())


# ------------------------------------------------------------------------------------ golden
def test_formats_golden():
    proc = fp8lab_cmd("formats")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    check_golden("formats.txt", proc.stdout)


def test_table_golden():
    proc = fp8lab_cmd("table", "hif8", "--output", "csv")
    assert proc.returncode == 0, proc.stderr
    check_golden("table_hif8.csv", proc.stdout)
    lines = proc.stdout.splitlines()
    assert lines[0] == "code,bits,value,class" and len(lines) == 257
    assert "0x6e,0|11|0111|0,32768.0,normal" in lines  # largest finite (formats.md)
    assert "0x80,1|0000|000,nan,nan" in lines


def test_encode_golden():
    proc = fp8lab_cmd("encode", "0.3", "-1e6", "1e6", "448", "-inf", "nan", "1/3", "0x1.8p-9",
                      "--format", "e4m3")
    assert proc.returncode == 0, proc.stderr
    check_golden("encode_e4m3.txt", proc.stdout)


@needs_api
def test_analyze_golden(analyzed):
    proc, _ = analyzed
    assert proc.returncode == 0, proc.stderr
    check_golden("analyze.txt", proc.stdout)
    assert_clean_stderr(proc.stderr)
    notes = [ln for ln in proc.stderr.splitlines() if ln.startswith("fp8lab: note:")]
    assert any("ids" in n and "skipped" in n for n in notes)


def test_console_script_is_installed():
    import shutil

    exe = shutil.which("fp8lab") or str(Path(sys.executable).with_name("fp8lab"))
    if not Path(exe).exists():
        pytest.skip("fp8lab console script not installed")
    proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == f"fp8lab {fp8lab.__version__}"


# ------------------------------------------------------------------------- in-process variants
def test_formats_json_equals_finfo(capsys):
    assert cli.main(["formats", "--output", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == fp8lab.list_formats()
    for r in rows:
        fi = fp8lab.finfo(r["name"])
        assert (r["max"], r["smallest_normal"], r["smallest_subnormal"], r["eps"]) == \
            (fi.max, fi.smallest_normal, fi.smallest_subnormal, fi.eps)
        assert (tuple(r["nan_codes"]), tuple(r["inf_codes"]), r["max_code"]) == \
            (fi.nan_codes, fi.inf_codes, fi.max_code)


@pytest.mark.parametrize("name", fp8lab.list_formats())
def test_table_json_equals_the_format(capsys, name):
    assert cli.main(["table", name, "--output", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    fmt = fp8lab.get_format(name)
    decoded = fp8lab.decode(np.arange(256, dtype=np.uint8), name, dtype="float64")
    assert len(rows) == 256
    for c, r in enumerate(rows):
        assert (r["code"], r["bits"], r["class"]) == (c, fmt.fields[c], fmt.classes[c])
        v = r["value"]
        if fmt.classes[c] == "nan":
            assert v == "nan"
        else:
            assert float(v) == decoded[c]


def test_table_markdown_and_text(capsys):
    assert cli.main(["table", "e5m2", "--output", "md"]) == 0
    md = capsys.readouterr().out.splitlines()
    assert md[0] == "| code | bits | value | class |" and len(md) == 258
    assert cli.main(["table", "e5m2"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].split() == ["code", "bits", "value", "class"]
    assert text[1 + 0x7C].split() == ["0x7c", "0|11111|00", "inf", "inf"]


def test_encode_json_equals_the_api(capsys):
    values = [0.3, -1e6, 15.5, 1.0625, 2.0**-23, 40960.0, -0.0]
    for name in ("hif8", "e5m2"):
        assert cli.main(["encode", *map(repr, values), "--format", name, "--output",
                         "json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        codes = fp8lab.encode(np.array(values), name)
        dec = fp8lab.decode(codes, name, dtype="float64")
        for r, x, c, d in zip(rows, values, codes.tolist(), dec.tolist()):
            assert r["code"] == c and r["input"] == x
            assert (r["value"] == "nan" and math.isnan(d)) or float(r["value"]) == d
    # HiF8 ties away (formats.md): 1.0625 -> 1.125 with neighbours 1.0 and 1.125
    assert cli.main(["encode", "1.0625", "--format", "hif8", "--output", "json"]) == 0
    (r,) = json.loads(capsys.readouterr().out)
    assert (r["hex"], r["value"], r["below"], r["above"]) == ("0x09", 1.125, "1.0", "1.125")


def test_encode_saturate_and_rounding(capsys):
    assert cli.main(["encode", "1e6", "1.0625", "--format", "e4m3", "--saturate",
                     "--rounding", "toward_zero", "--output", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["value"] for r in rows] == [448.0, 1.0]


def test_usage_errors_exit_2(capsys):
    assert cli.main(["encode", "1", "--format", "e4m3x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fp8lab: error: unknown format 'e4m3x'; known: e4m3")
    assert cli.main(["encode", "abc", "--format", "e4m3"]) == 2
    assert "not a number: 'abc'" in capsys.readouterr().err
    assert cli.main(["analyze"]) == 2
    assert "--demo" in capsys.readouterr().err
    assert cli.main(["analyze", "--demo", "--budget", "snr>3"]) == 2
    assert "unknown metric 'snr'" in capsys.readouterr().err
    assert cli.main(["analyze", "--demo", "--scaling", "blocks"]) == 2
    assert "bad --scaling 'blocks'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["table"])
    assert exc.value.code == 2


def test_usage_error_through_a_subprocess():
    proc = fp8lab_cmd("analyze", "--formats", "e4m3,nope", "--demo")
    assert proc.returncode == 2 and proc.stdout == ""
    assert error_lines(proc.stderr) == [proc.stderr.strip()]
    assert "unknown format 'nope'" in proc.stderr


# --------------------------------------------------------------------------- analyze: JSON
RECORD_TYPES = {"file": str, "tensor": str, "dtype": str, "shape": list, "format": str,
                "scaling": str, "cost_rank": int, "sqnr_db": (float, str), "rel_error": float,
                "p99_row_error": float, "overflow_frac": float, "underflow_frac": float,
                "saturated_frac": float, "nan_count": int, "inf_count": int, "n": int,
                "meets_budget": bool, "recommended": bool}


@needs_api
def test_analyze_json_schema(analyzed):
    _, doc = analyzed
    assert set(doc) == {"fp8lab_version", "command", "options", "tensors", "records", "errors"}
    assert doc["fp8lab_version"] == fp8lab.__version__ and doc["command"] == "analyze"
    assert doc["options"] == {"paths": ["act.npy", "model.safetensors"], "demo": False,
                              "formats": ["e4m3", "e5m2", "hif8"],
                              "scaling": doc["options"]["scaling"],
                              "budget": cli.DEFAULT_BUDGET, "rounding": None, "saturate": False,
                              "seed": None}
    assert len(doc["options"]["scaling"]) == 3 and doc["errors"] == 0
    names = [(t["file"], t["tensor"]) for t in doc["tensors"]]
    assert names == [("act.npy", "act.npy"), ("model.safetensors", "w"),
                     ("model.safetensors", "bf")]
    assert [t["dtype"] for t in doc["tensors"]] == ["float32", "float32", "bfloat16"]
    assert len(doc["records"]) == 3 * 9
    for r in doc["records"]:
        for key, typ in RECORD_TYPES.items():
            assert isinstance(r[key], typ), (key, r[key])
        assert not isinstance(r["cost_rank"], bool)
    for t in doc["tensors"]:
        mine = [r for r in doc["records"] if (r["file"], r["tensor"]) == (t["file"], t["tensor"])]
        picked = [r for r in mine if r["recommended"]]
        if t["recommended"] is None:
            assert not picked and not any(r["meets_budget"] for r in mine)
        else:
            (p,) = picked
            assert t["recommended"] == {"format": p["format"], "scaling": p["scaling"]}
            cheapest = min(r["cost_rank"] for r in mine if r["meets_budget"])
            assert p["meets_budget"] and p["cost_rank"] == cheapest


@needs_api
def test_analyze_json_numbers_equal_the_api(analyzed, data_dir):
    from fp8lab.metrics import error_metrics
    from fp8lab.scaling import Scaling

    quantize = getattr(fp8lab, "quantize", None) or __import__(
        "fp8lab.qtensor", fromlist=["quantize"]).quantize
    _, doc = analyzed
    arrays = {}
    for ref in _io.scan([data_dir / "act.npy", data_dir / "model.safetensors"]):
        if isinstance(ref, _io.TensorRef):
            arrays[(Path(ref.file).name, ref.name)] = ref.load()
    w, act, bf_bits = _tensors()  # the loaders hand back exactly what was written
    np.testing.assert_array_equal(arrays[("act.npy", "act.npy")], act)
    np.testing.assert_array_equal(arrays[("model.safetensors", "bf")].view(np.uint32),
                                  bf_bits.astype(np.uint32) << 16)
    for r in doc["records"]:
        x = arrays[(r["file"], r["tensor"])]
        qt = quantize(x, r["format"], scaling=Scaling.parse(r["scaling"]))
        expect = error_metrics(x, qt, fmt=r["format"]).to_dict()
        for key, v in expect.items():
            got = r[key]
            if isinstance(got, str):
                got = float(got)
            if isinstance(v, float) and math.isnan(v):
                assert math.isnan(got), key
            else:
                assert got == v, (r["tensor"], r["format"], r["scaling"], key)


# ---------------------------------------------------------------------- analyze: bad input
class _Tripwire:
    """Unpickling this creates a file: proof that something unpickled it."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _safetensors_bytes(header, data=b"", length=None):
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


_GOOD_HEADER = {"t": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}


def _make_bad(case: str, d: Path) -> Path:
    if case == "missing_file":
        return d / "nothing_here.safetensors"
    if case == "directory_without_tensors":
        (d / "empty_dir").mkdir()
        (d / "empty_dir" / "README.txt").write_text("no tensors")
        return d / "empty_dir"
    p = d / f"{case}.safetensors"
    if case == "truncated_safetensors":
        p.write_bytes(_safetensors_bytes(_GOOD_HEADER, bytes(16))[:5])
    elif case == "bad_header_length":
        p.write_bytes(_safetensors_bytes(_GOOD_HEADER, bytes(16), length=2**63))
    elif case == "header_larger_than_file":
        p.write_bytes(_safetensors_bytes(_GOOD_HEADER, bytes(16), length=4096))
    elif case == "offsets_out_of_range":
        hdr = {"t": {"dtype": "F32", "shape": [2, 2], "data_offsets": [8, 24]}}
        p.write_bytes(_safetensors_bytes(hdr, bytes(16)))
    elif case == "unknown_dtype":
        hdr = {"t": {"dtype": "F12", "shape": [2, 2], "data_offsets": [0, 16]}}
        p.write_bytes(_safetensors_bytes(hdr, bytes(16)))
    elif case == "npz_with_pickled_objects":
        p = d / "objects.npz"
        obj = np.empty(1, dtype=object)
        obj[0] = _Tripwire(d / "UNPICKLED")
        np.savez(p, objs=obj)
        assert b"UNPICKLED" in p.read_bytes()  # the payload really is in the file
    elif case == "integer_tensor":
        _io.write_safetensors(p, {"ids": np.arange(8, dtype=np.int32)})
    elif case == "empty_tensor":
        _io.write_safetensors(p, {"nothing": np.zeros((0, 4), np.float32)})
    elif case == "nan_and_inf_values":
        x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
        x[0, 0], x[1, 1], x[2, 2] = np.nan, np.inf, -np.inf
        _io.write_safetensors(p, {"t": x})
    return p


# case -> (exit status, the one error line must contain this; None: no error line)
BAD_INPUT = {
    "missing_file": (1, "no such file or directory"),
    "directory_without_tensors": (1, "directory holds no .npy, .npz or .safetensors files"),
    "truncated_safetensors": (1, "truncated safetensors file: 5 bytes"),
    "bad_header_length": (1, "implausible header length 9223372036854775808"),
    "header_larger_than_file": (1, "header length 4096 exceeds the file size"),
    "offsets_out_of_range": (1, "data_offsets [8, 24] out of range"),
    "unknown_dtype": (1, "unknown safetensors dtype 'F12'"),
    "npz_with_pickled_objects": (1, "objs: refused: holds pickled Python objects"),
    "integer_tensor": (0, None),
    "empty_tensor": (0, None),
    "nan_and_inf_values": (1, "holds 1 NaN and 2 Inf values"),
}


@needs_api
@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_one_line_and_valid_tensors_still_run(tmp_path, case):
    bad = _make_bad(case, tmp_path)
    np.save(tmp_path / "good.npy", np.linspace(-2, 2, 256, dtype=np.float32).reshape(16, 16))
    proc = fp8lab_cmd("analyze", bad, tmp_path / "good.npy", *FAST)
    rc, expect = BAD_INPUT[case]
    assert proc.returncode == rc, proc.stderr
    assert_clean_stderr(proc.stderr)
    errors = error_lines(proc.stderr)
    if expect is None:
        assert errors == []
        notes = [ln for ln in proc.stderr.splitlines() if ln.startswith("fp8lab: note:")]
        assert len(notes) == 1 and "skipped" in notes[0] and str(bad) in notes[0]
    else:
        assert len(errors) == 1 and expect in errors[0], proc.stderr
        assert str(bad) in errors[0]
    rows = proc.stdout.splitlines()
    assert any("good.npy" in ln and "e4m3" in ln for ln in rows), proc.stdout
    if case == "nan_and_inf_values":  # the tensor is analysed too, its non-finite values counted
        assert any(ln.split()[0].endswith(":t") for ln in rows[1:] if ln.strip()), proc.stdout
    assert not (tmp_path / "UNPICKLED").exists()


@needs_api
def test_debug_shows_the_traceback(tmp_path):
    bad = _make_bad("header_larger_than_file", tmp_path)
    proc = fp8lab_cmd("analyze", bad, "--debug", *FAST)
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "InputError" in proc.stderr


def test_only_bad_input_fails_with_nothing_on_stdout(tmp_path):
    proc = fp8lab_cmd("analyze", tmp_path / "nope.npy", *FAST)
    assert proc.returncode == 1 and proc.stdout == ""
    assert len(error_lines(proc.stderr)) == 1


# --------------------------------------------------------------------- analyze: in-process
class _TTY:
    """A stand-in for a terminal on stderr."""

    def __init__(self):
        self.parts = []

    def write(self, s):
        self.parts.append(s)

    def flush(self):
        pass

    def isatty(self):
        return True


@needs_api
def test_progress_bar_on_a_terminal_only(data_dir, capsys, monkeypatch):
    tty = _TTY()
    monkeypatch.setattr(sys, "stderr", tty)
    paths = [str(data_dir / "act.npy"), str(data_dir / "model.safetensors")]
    assert cli.main(["analyze", *paths, *FAST, "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)  # --json -: JSON alone on stdout
    assert [t["tensor"] for t in doc["tensors"]] == ["act.npy", "w", "bf"]
    stderr = "".join(tty.parts)
    assert "\r[" in stderr and "tensors" in stderr  # the bar was drawn
    tty.parts.clear()
    assert cli.main(["analyze", *paths, *FAST, "--quiet"]) == 0
    assert "".join(tty.parts) == ""  # --quiet: no bar, no notes
    capsys.readouterr()


@needs_api
def test_plots_are_written(data_dir, tmp_path, capsys):
    out = tmp_path / "plots"
    rc = cli.main(["analyze", str(data_dir / "act.npy"), "--formats", "e4m3,hif8",
                   "--scaling", "tensor,block", "--plot", str(out)])
    assert rc == 0
    assert f"plots written to {out}" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["hist_000_act.npy.png", "sqnr_heatmap.png"]
    for p in out.iterdir():
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000


@needs_api
def test_demo_runs(capsys):
    assert cli.main(["analyze", "--demo", "--quiet", "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [t["tensor"] for t in doc["tensors"]] == ["weight.gaussian", "act.outlier_channels",
                                                     "grad.tiny"]
    assert len(doc["records"]) == 27 and doc["errors"] == 0


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert cli.main(["analyze", "--demo", "--plot", str(tmp_path), *FAST]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == ("fp8lab: error: --plot needs matplotlib, an optional extra: "
                                    "pip install 'fp8lab[plot]'")


@needs_api
def test_budget_changes_the_recommendation(data_dir, capsys):
    args = ["analyze", str(data_dir / "act.npy"), "--formats", "e4m3,e5m2",
            "--scaling", "tensor,block", "--json", "-", "--quiet"]
    assert cli.main([*args, "--budget", "1000"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert all(t["recommended"] is None for t in doc["tensors"])
    assert cli.main([*args, "--budget", "sqnr_db>=0"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # every recipe meets it: the cheapest (per-tensor) wins, the higher SQNR breaks the tie
    (t,) = doc["tensors"]
    best = max((r for r in doc["records"] if r["scaling"] == "tensor"), key=lambda r: r["sqnr_db"])
    assert t["recommended"] == {"format": best["format"], "scaling": "tensor"}


def test_parse_budget():
    assert cli.parse_budget("30") == [("sqnr_db", ">=", 30.0)]
    assert cli.parse_budget("sqnr_db>=25, overflow_frac<=0") == [
        ("sqnr_db", ">=", 25.0), ("overflow_frac", "<=", 0.0)]
    with pytest.raises(cli.UsageError):
        cli.parse_budget("sqnr_db=>3")


def test_pickle_tripwire_works():
    # the bad-input test relies on this: unpickling the object does create the marker
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        marker = Path(d) / "m"
        pickle.loads(pickle.dumps(_Tripwire(marker))).close()
        assert marker.exists()
