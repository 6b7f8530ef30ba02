"""The model-file bomb of issue #44: a valid iris model file with two extra compressed arrays of 3 GiB of
zeros each, ~6 MB on disk (np.load made the node allocate 6.3 GB for it)."""
from __future__ import annotations

import io
import struct
import zipfile
import zlib

import numpy as np
from numpy.lib import format as npy

BOMB_ARRAY_BYTES = 3 << 30


def _zeros_entry(nbytes, descr="<f8"):
    """(deflated data, CRC, size) of a .npy entry of ``nbytes`` zero bytes of data, made without compressing
    gigabytes: a deflate stream of zeros flushed with Z_FULL_FLUSH repeats block for block, so one 64 MiB
    block's output is written over and over; the CRC is over the real bytes, so the entry is valid."""
    header = io.BytesIO()
    npy.write_array_header_1_0(header, {"descr": descr, "fortran_order": False,
                                        "shape": (nbytes // np.dtype(descr).itemsize,)})
    head = header.getvalue()
    block = bytes(64 << 20)
    assert nbytes % len(block) == 0
    co = zlib.compressobj(6, zlib.DEFLATED, -15)
    parts = [co.compress(head) + co.flush(zlib.Z_FULL_FLUSH)]
    one = co.compress(block) + co.flush(zlib.Z_FULL_FLUSH)
    crc = zlib.crc32(head)
    for _ in range(nbytes // len(block)):
        parts.append(one)
        crc = zlib.crc32(block, crc)
    parts.append(co.flush())
    return b"".join(parts), crc, len(head) + nbytes


def write_bomb(path, model_path):
    """The issue's file: the model's own entries, then extra_a and extra_b of 3 GiB of zeros each (zip64;
    written by hand, as zipfile would need each entry's whole payload in memory)."""
    with zipfile.ZipFile(model_path) as src:
        entries = [(i.filename, src.read(i.filename)) for i in src.infolist()]
    with open(path, "wb") as f:
        central = []
        for name, content in entries:
            comp = zlib.compressobj(6, zlib.DEFLATED, -15)
            data = comp.compress(content) + comp.flush()
            central.append(_local(f, name, data, zlib.crc32(content), len(content)))
        for name in ("extra_a.npy", "extra_b.npy"):
            data, crc, size = _zeros_entry(BOMB_ARRAY_BYTES)
            central.append(_local(f, name, data, crc, size))
        _central(f, central)


def _local(f, name, data, crc, size):
    """A local file header (zip64 extra field for the sizes) and its deflated data; returns what the central
    directory needs."""
    at = f.tell()
    raw = name.encode()
    extra = struct.pack("<HHQQ", 1, 16, size, len(data))
    f.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, 8, 0, 0, crc, 0xFFFFFFFF, 0xFFFFFFFF, len(raw),
                        len(extra)))
    f.write(raw + extra + data)
    return raw, crc, len(data), size, at


def _central(f, central):
    start = f.tell()
    for raw, crc, csize, size, at in central:
        extra = struct.pack("<HHQQQ", 1, 24, size, csize, at)
        f.write(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, 8, 0, 0, crc, 0xFFFFFFFF, 0xFFFFFFFF,
                            len(raw), len(extra), 0, 0, 0, 0, 0xFFFFFFFF))
        f.write(raw + extra)
    end = f.tell()
    n, size = len(central), end - start
    f.write(struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n, n, size, start))
    f.write(struct.pack("<IIQI", 0x07064B50, 0, end, 1))
    f.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0))
