"""The tensor file readers behind ``fp8lab analyze`` (fp8lab._io), tested in-process.

The same bad inputs go through the command line as subprocesses in test_cli.py; here each reader
decision is checked directly: what is analysed, what is skipped with a note, what is an error,
and that float32 data is memory-mapped rather than copied.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from fp8lab import _io


def _events(*paths):
    out = list(_io.scan([str(p) for p in paths]))
    refs = [e for e in out if isinstance(e, _io.TensorRef)]
    errors = [e.message for e in out if isinstance(e, _io.Problem) and e.level == "error"]
    notes = [e.message for e in out if isinstance(e, _io.Problem) and e.level == "note"]
    return refs, errors, notes


def _raw_safetensors(path, header: dict | bytes, data: bytes = b"", length: int | None = None):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def test_safetensors_float_types_round_trip_exactly(tmp_path):
    rng = np.random.default_rng(0)
    f32 = rng.standard_normal((3, 5)).astype(np.float32)
    f16 = rng.standard_normal((7,)).astype(np.float16)
    f32_for_bf16 = rng.standard_normal((4, 2)).astype(np.float32)
    bf16_bits = (f32_for_bf16.view(np.uint32) >> 16).astype(np.uint16)
    path = tmp_path / "m.safetensors"
    _io.write_safetensors(path, {"a": f32, "b": f16, "c": ("BF16", bf16_bits)},
                          metadata={"format": "pt"})
    refs, errors, notes = _events(path)
    assert not errors and not notes
    got = {r.name: r for r in refs}
    assert [r.name for r in refs] == ["a", "b", "c"]  # data order
    assert (got["a"].dtype, got["b"].dtype, got["c"].dtype) == ("float32", "float16", "bfloat16")
    assert got["a"].shape == (3, 5) and got["a"].size == 15
    np.testing.assert_array_equal(got["a"].load(), f32)
    b = got["b"].load()
    assert b.dtype == np.float32
    np.testing.assert_array_equal(b, f16.astype(np.float32))
    c = got["c"].load()
    expect = (bf16_bits.astype(np.uint32) << 16).view(np.float32)
    assert c.dtype == np.float32 and c.shape == (4, 2)
    np.testing.assert_array_equal(c.view(np.uint32), expect.view(np.uint32))


def test_safetensors_float32_is_memory_mapped_not_copied(tmp_path):
    x = np.arange(4096, dtype=np.float32).reshape(64, 64)
    path = tmp_path / "m.safetensors"
    _io.write_safetensors(path, {"w": x})
    (ref,) = _events(path)[0]
    arr = ref.load()
    base = arr
    while base is not None and not isinstance(base, np.memmap):
        base = base.base
    assert isinstance(base, np.memmap)
    np.testing.assert_array_equal(arr, x)


def test_safetensors_matches_the_reference_package_when_installed(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    x = np.linspace(-3, 3, 60, dtype=np.float32).reshape(6, 10)
    y = np.arange(5, dtype=np.int64)
    path = tmp_path / "ref.safetensors"
    st.save_file({"x": x, "y": y}, str(path))
    refs, errors, notes = _events(path)
    assert not errors
    assert [r.name for r in refs] == ["x"]
    np.testing.assert_array_equal(refs[0].load(), x)
    assert len(notes) == 1 and "y" in notes[0] and "I64" in notes[0]


def test_safetensors_integer_and_empty_tensors_are_skipped_with_a_note(tmp_path):
    path = tmp_path / "m.safetensors"
    _io.write_safetensors(path, {"ids": np.arange(4, dtype=np.int64),
                                 "empty": np.zeros((0, 3), np.float32),
                                 "w": np.ones((2, 2), np.float32)})
    refs, errors, notes = _events(path)
    assert [r.name for r in refs] == ["w"] and not errors
    assert any("ids" in n and "I64" in n for n in notes)
    assert any("empty" in n and "empty tensor" in n for n in notes)


@pytest.mark.parametrize("case, expect", [
    ("short", "shorter than the 8-byte header length"),
    ("huge_length", "implausible header length"),
    ("header_past_end", "exceeds the file size"),
    ("not_json", "not valid JSON"),
    ("not_object", "not a JSON object"),
    ("missing_field", "missing 'data_offsets'"),
    ("bad_shape", "shape must be a list of non-negative integers"),
    ("offsets_out_of_range", "out of range"),
    ("offsets_reversed", "out of range"),
    ("size_mismatch", "need 16"),
    ("bad_metadata", "__metadata__"),
])
def test_safetensors_corrupt_headers_are_one_line_errors(tmp_path, case, expect):
    p = tmp_path / f"{case}.safetensors"
    good = {"t": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}
    data = bytes(16)
    if case == "short":
        p.write_bytes(b"\x01\x02\x03")
    elif case == "huge_length":
        _raw_safetensors(p, good, data, length=1 << 40)
    elif case == "header_past_end":
        _raw_safetensors(p, good, data, length=len(json.dumps(good)) + 1000)
    elif case == "not_json":
        _raw_safetensors(p, b"{not json", data)
    elif case == "not_object":
        _raw_safetensors(p, b"[1, 2]", data)
    elif case == "missing_field":
        _raw_safetensors(p, {"t": {"dtype": "F32", "shape": [2, 2]}}, data)
    elif case == "bad_shape":
        _raw_safetensors(p, {"t": {"dtype": "F32", "shape": [2, -2], "data_offsets": [0, 16]}},
                         data)
    elif case == "offsets_out_of_range":
        _raw_safetensors(p, {"t": {"dtype": "F32", "shape": [2, 2],
                                   "data_offsets": [0, 16]}}, bytes(8))
    elif case == "offsets_reversed":
        _raw_safetensors(p, {"t": {"dtype": "F32", "shape": [2, 2],
                                   "data_offsets": [16, 0]}}, data)
    elif case == "size_mismatch":
        _raw_safetensors(p, {"t": {"dtype": "F32", "shape": [2, 2],
                                   "data_offsets": [0, 12]}}, data)
    elif case == "bad_metadata":
        _raw_safetensors(p, {"__metadata__": {"a": 1}, **good}, data)
    refs, errors, notes = _events(p)
    assert not refs
    assert len(errors) == 1, errors
    assert expect in errors[0] and str(p) in errors[0] and "\n" not in errors[0]


def test_safetensors_unknown_dtype_is_an_error_but_other_tensors_are_read(tmp_path):
    p = tmp_path / "m.safetensors"
    header = {"odd": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 2]},
              "w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}
    data = bytes(8) + struct.pack("<2f", 1.5, -2.0)
    _raw_safetensors(p, json.dumps(header).encode() + b" " * 6, data)
    refs, errors, notes = _events(p)
    assert [r.name for r in refs] == ["w"]
    np.testing.assert_array_equal(refs[0].load(), np.array([1.5, -2.0], np.float32))
    assert len(errors) == 1 and "unknown safetensors dtype 'Q7'" in errors[0]


def test_npy_and_npz_read_lazily_and_refuse_pickles(tmp_path):
    np.save(tmp_path / "a.npy", np.full((3, 4), 2.5, np.float32))
    np.save(tmp_path / "obj.npy", np.array([{"x": 1}], dtype=object), allow_pickle=True)
    np.savez(tmp_path / "b.npz", w=np.ones(5, np.float16), ids=np.arange(3),
             bad=np.array([1, "x"], dtype=object))
    refs, errors, notes = _events(tmp_path)  # a directory: every tensor file in it
    assert [(r.file.split("/")[-1], r.name) for r in refs] == [("a.npy", "a.npy"), ("b.npz", "w")]
    assert refs[1].load().dtype == np.float32
    assert sum("refused: holds pickled Python objects" in e for e in errors) == 2
    assert any("ids" in n and "int64" in n for n in notes)


def test_missing_paths_empty_directories_and_unknown_suffixes(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("hi")
    (tmp_path / "broken.npz").write_bytes(b"PK\x03\x04 not really a zip")
    refs, errors, _ = _events(tmp_path / "nope.npy", tmp_path / "empty", tmp_path / "notes.txt",
                              tmp_path / "broken.npz")
    assert not refs
    assert "no such file or directory" in errors[0]
    assert "directory holds no .npy, .npz or .safetensors files" in errors[1]
    assert "unknown file type '.txt'" in errors[2]
    assert "not a valid .npz file" in errors[3]
