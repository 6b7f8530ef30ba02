"""A model file cannot make the node allocate what the format does not imply (issue #44).

The bomb: a valid iris model file with two extra compressed arrays of 3 GiB of zeros each (6 MB on disk);
np.load made the node allocate 6.3 GB. Now each array is bounded by its .npy header and the zip's directory
before a byte of it is read (kernels/model_file.py, read_arrays). Through both doors: `run --model` here,
`policy load` into a running node in tests/test_lifecycle.py. Plus a hypothesis fuzz of .npz structure,
npy headers, dtypes (object / pickle too) and shapes, in the style of tests/test_import_hostile.py.
"""
from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import time
import tracemalloc
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy.lib import format as npy

from support.bomb import BOMB_ARRAY_BYTES, write_bomb
from support.nodeutil import write_node_config
from control_node.bench.harness import CHILD_CWD
from control_node.kernels import ModelFileError, load_model
from control_node.kernels.model_file import MAX_ENTRIES, MAX_FILE_BYTES, read_arrays

@pytest.fixture(scope="module")
def bomb(tmp_path_factory, iris_model_path):
    path = tmp_path_factory.mktemp("bomb") / "bomb.npz"
    write_bomb(path, iris_model_path)
    return str(path)


def test_the_bomb_is_a_valid_archive_of_the_model_and_two_3_gib_arrays(bomb):
    """The file is what the issue describes (so the refusal below is of the real thing): ~6 MB, a zip whose
    entries are the iris model's plus two arrays declaring 3 GiB each, whose first MiB decompresses."""
    assert os.path.getsize(bomb) < 8 << 20
    with zipfile.ZipFile(bomb) as z:
        names = z.namelist()
        assert "extra_a.npy" in names and "W0.npy" in names
        with z.open("extra_b.npy") as f:
            assert npy.read_magic(f) == (1, 0)
            shape, _, dtype = npy.read_array_header_1_0(f)
            assert shape[0] * dtype.itemsize == BOMB_ARRAY_BYTES
            assert f.read(1 << 20) == bytes(1 << 20)


def test_the_bomb_is_refused_from_its_headers_in_ms_without_allocating(bomb):
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(ModelFileError) as info:
            load_model(bomb)
        took = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    msg = str(info.value)
    assert info.value.field == "extra_a" and "\n" not in msg
    assert msg.startswith(f"cannot load {bomb}: field 'extra_a'"), msg
    assert "(402653184,)" in msg and "3 GiB" in msg and "256 MiB" in msg, msg
    assert took < 1.0, took
    assert peak < 16 << 20, peak


def test_a_field_the_format_defines_is_bounded_by_max_bytes_before_it_is_read(iris_model_path, tmp_path):
    """check_X is the one array whose rows the format leaves free: 3 GiB of rows are refused by the bound
    (the caller's, not the default), naming the field, its shape and the bound."""
    path = tmp_path / "rows.npz"
    with zipfile.ZipFile(iris_model_path) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for info in src.infolist():
            if info.filename != "check_X.npy":
                z.writestr(info.filename, src.read(info.filename))
        with z.open("check_X.npy", "w", force_zip64=True) as f:
            npy.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False, "shape": (100_000_000, 4)})
            f.write(bytes(1 << 20))
    with pytest.raises(ModelFileError) as info:
        load_model(path, max_bytes=64 << 20)
    msg = str(info.value)
    assert info.value.field == "check_X" and "(100000000, 4)" in msg and "64 MiB" in msg, msg


def test_the_configured_bound_is_the_one_applied(iris_model_path):
    """A real model: loaded under the default bound, refused under half of its own arrays' bytes."""
    total = sum(a.nbytes for a in read_arrays(str(iris_model_path)).values())
    assert load_model(iris_model_path, max_bytes=MAX_FILE_BYTES).layer_sizes == [4, 16, 3]
    with pytest.raises(ModelFileError, match=f"more than the bound of {total // 2} bytes"):
        load_model(iris_model_path, max_bytes=total // 2)


def _arrays(path):
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _zip(path, entries):
    """entries: name -> raw bytes of the entry."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, raw in entries.items():
            z.writestr(name, raw)
    return path


def _npy(arr):
    buf = io.BytesIO()
    npy.write_array(buf, arr, allow_pickle=True)
    return buf.getvalue()


def _entries(model_path):
    with zipfile.ZipFile(model_path) as z:
        return {n: z.read(n) for n in z.namelist()}


@pytest.mark.parametrize("case", ["object", "structured", "complex", "bytes"])
def test_dtypes_the_format_does_not_hold_are_refused_by_their_header(iris_model_path, tmp_path, case):
    e = _entries(iris_model_path)
    arr = {"object": np.array([object(), 1], dtype=object)[:1].repeat(16),
           "structured": np.zeros(16, dtype=[("a", "<f8")]), "complex": np.zeros(16, dtype=complex),
           "bytes": np.zeros(16, dtype="S4")}[case]
    e["b0.npy"] = _npy(arr) if case != "object" else _npy(np.array([None] * 16, dtype=object))
    with pytest.raises(ModelFileError) as info:
        load_model(_zip(tmp_path / "x.npz", e))
    assert info.value.field == "b0" and "a model file holds plain numbers and text only" in str(info.value)
    if case == "object":
        assert "pickle" in str(info.value)


def test_a_header_that_lies_about_its_data_is_refused_both_ways(iris_model_path, tmp_path):
    e = _entries(iris_model_path)
    raw = e["b0.npy"]
    e["b0.npy"] = raw + bytes(8)                     # more data than the header's shape
    with pytest.raises(ModelFileError, match="field 'b0': holds more bytes than its header"):
        load_model(_zip(tmp_path / "more.npz", e))
    e["b0.npy"] = raw[:-8]                           # less
    with pytest.raises(ModelFileError, match="field 'b0': is cut short"):
        load_model(_zip(tmp_path / "less.npz", e))


def test_an_archive_of_many_entries_is_refused_before_its_directory_is_parsed(tmp_path):
    path = tmp_path / "many.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for i in range(MAX_ENTRIES + 1):
            z.writestr(f"W{i}.npy", b"")
    with pytest.raises(ModelFileError, match=rf"lists {MAX_ENTRIES + 1} entries"):
        load_model(path)


def test_a_layer_the_layer_sizes_do_not_name_and_a_duplicate_are_refused(iris_model_path, tmp_path):
    e = _entries(iris_model_path)
    e["W7.npy"] = _npy(np.zeros((16, 3)))
    with pytest.raises(ModelFileError, match="field 'W7': is not a field of a file with these layer_sizes"):
        load_model(_zip(tmp_path / "w7.npz", e))
    path = tmp_path / "dup.npz"
    with zipfile.ZipFile(path, "w") as z, pytest.warns(UserWarning, match="Duplicate name"):
        for name, raw in _entries(iris_model_path).items():
            z.writestr(name, raw)
        z.writestr("mean.npy", _npy(np.zeros(4)))
    with pytest.raises(ModelFileError, match="field 'mean': appears twice"):
        load_model(path)


def test_bytes_of_a_model_file_load_like_the_file(iris_model_path):
    from control_node.kernels.model_file import model_bytes
    spec = load_model(iris_model_path)
    again = load_model(model_bytes(spec), label="(handed over)")
    assert again.sha256 == spec.sha256


# ------------------------------------------------------------------------------------------------ the run door
MEASURE = r"""
import json, resource, subprocess, sys
limit = int(sys.argv[1])
def cap():
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
p = subprocess.run(sys.argv[2:], capture_output=True, text=True, preexec_fn=cap)
print(json.dumps({"rc": p.returncode, "out": p.stdout, "err": p.stderr,
                  "maxrss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))
"""


def _run_measured(cwd, argv, as_limit=0):
    """``argv`` as the only child of a fresh process (so RUSAGE_CHILDREN is its peak RSS alone), optionally
    under an address-space limit (``ulimit -v``)."""
    p = subprocess.run([sys.executable, "-c", MEASURE, str(as_limit), *argv], cwd=cwd, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _cli(*args):
    return [sys.executable, "-m", "control_node", *args]


@pytest.mark.parametrize("as_limit", [0, 4_000_000 * 1024], ids=["unlimited", "ulimit-v-4000000"])
def test_run_refuses_the_bomb_in_one_line_with_status_2_writing_nothing(bomb, tmp_path, as_limit):
    work = tmp_path / "work"
    work.mkdir()
    r = _run_measured(str(work), _cli("run", "--model", bomb, "--duration", "1"), as_limit)
    lines = [ln for ln in r["err"].splitlines() if ln.strip()]
    assert r["rc"] == 2, r
    assert len(lines) == 1 and "Traceback" not in r["err"], r["err"]
    assert lines[0].startswith(f"control-node run: error: cannot load {bomb}: field 'extra_a'"), lines
    assert "(402653184,)" in lines[0] and "256 MiB" in lines[0], lines
    assert r["maxrss"] <= MAX_FILE_BYTES + (64 << 20), r["maxrss"]
    assert os.listdir(work) == [], os.listdir(work)          # no run directory, nothing written


def test_run_applies_the_configured_max_resident_mb(iris_model_path, tmp_path):
    cfg = tmp_path / "node.toml"
    total = sum(a.nbytes for a in read_arrays(str(iris_model_path)).values())
    write_node_config(str(cfg), str(tmp_path), f"[lifecycle]\nmax_resident_mb = {total / 2 / (1 << 20)!r}\n")
    p = subprocess.run(_cli("run", "--config", str(cfg), "--model", iris_model_path, "--duration", "1"),
                       cwd=CHILD_CWD, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"more than the bound of {total // 2} bytes" in p.stderr and "Traceback" not in p.stderr, p.stderr


# ------------------------------------------------------------------------------------------------ the fuzz
FUZZ = dict(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
FUZZ_MAX_BYTES = 1 << 20
DESCRS = ["<f8", "<f4", ">f8", "<i8", "|b1", "<U8", "<U100000000", "|O", "|V16", "<c16", "|S4", "<M8[s]", "<f2",
          "[('a', '<f8')]", "<f8, (2,)", "bogus"]
SHAPES = [(), (0,), (3,), (4,), (16,), (4, 16), (16, 3), (2 ** 31,), (2 ** 40, 4), (-1,), (3, -5),
          (2 ** 62, 2 ** 62), (1,) * 40]


def _header(draw):
    descr = draw(st.sampled_from(DESCRS))
    shape = draw(st.sampled_from(SHAPES))
    fortran = draw(st.booleans())
    text = "{'descr': %s, 'fortran_order': %s, 'shape': %s, }" % (
        descr if descr.startswith("[") else repr(descr), fortran, shape)
    if draw(st.integers(0, 9)) == 0:
        text = draw(st.text(max_size=60))
    body = text.encode("latin1", "replace")
    version = draw(st.sampled_from([(1, 0), (2, 0), (3, 0), (9, 9)]))
    pad = (-(10 + len(body) + 1)) % 64
    body = body + b" " * pad + b"\n"
    if version == (1, 0):
        head = b"\x93NUMPY" + bytes(version) + struct.pack("<H", len(body))
    else:
        head = b"\x93NUMPY" + bytes(version) + struct.pack("<I", len(body))
    return head + body + draw(st.binary(max_size=256))


@st.composite
def model_archives(draw, base):
    """A valid model file with entries replaced, added, dropped, renamed or cut; headers drawn from the
    dtypes and shapes above; the archive itself sometimes cut or flipped."""
    entries = dict(base)
    names = sorted(entries)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["header", "add", "drop", "rename", "cut", "flip"]))
        name = draw(st.sampled_from(names))
        if op == "header":
            entries[name] = _header(draw)
        elif op == "add":
            entries[draw(st.sampled_from(["extra.npy", "W9.npy", "check_X.npy", "x", "../evil.npy", "a\nb.npy"]))] = \
                _header(draw)
        elif op == "drop":
            entries.pop(name, None)
        elif op == "rename":
            if name in entries:
                entries[name.replace(".npy", "") + draw(st.sampled_from([".npz", "", ".NPY"]))] = entries.pop(name)
        elif op == "cut" and name in entries:
            raw = entries[name]
            entries[name] = raw[:draw(st.integers(0, max(0, len(raw) - 1)))]
        elif op == "flip" and name in entries and entries[name]:
            raw = bytearray(entries[name])
            i = draw(st.integers(0, len(raw) - 1))
            raw[i] ^= 1 << draw(st.integers(0, 7))
            entries[name] = bytes(raw)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", draw(st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]))) as z:
        for name, raw in entries.items():
            z.writestr(name, raw)
    data = buf.getvalue()
    if draw(st.integers(0, 5)) == 0:
        data = data[:draw(st.integers(0, len(data)))]
    if draw(st.integers(0, 5)) == 0 and data:
        raw = bytearray(data)
        raw[draw(st.integers(0, len(raw) - 1))] ^= 0xFF
        data = bytes(raw)
    return data


@pytest.fixture(scope="module")
def base_entries(iris_model_path):
    return _entries(iris_model_path)


@settings(max_examples=600, **FUZZ)
@given(data=st.data())
def test_fuzz_npz_model_files_load_or_are_refused_in_one_line_within_the_bound(base_entries, data, tmp_path_factory):
    raw = data.draw(model_archives(base_entries))
    tracemalloc.start()
    try:
        try:
            arrays = read_arrays(raw, FUZZ_MAX_BYTES, label="fuzz.npz")
            outcome = "read"
        except ModelFileError as e:
            msg = str(e)
            assert "\n" not in msg and msg.startswith("cannot load fuzz.npz: field '") and " Fix: " in msg, msg
            outcome = "refused"
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < FUZZ_MAX_BYTES + (4 << 20), peak
    if outcome == "read":
        assert sum(a.nbytes for a in arrays.values()) <= FUZZ_MAX_BYTES
        assert all(a.dtype.kind in "fiubU" for a in arrays.values())
        try:
            load_model(raw, FUZZ_MAX_BYTES, label="fuzz.npz")
        except ModelFileError as e:
            assert "\n" not in str(e)


def test_the_fuzz_base_loads(base_entries):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, raw in base_entries.items():
            z.writestr(name, raw)
    assert load_model(buf.getvalue(), FUZZ_MAX_BYTES, label="base.npz").layer_sizes == [4, 16, 3]
