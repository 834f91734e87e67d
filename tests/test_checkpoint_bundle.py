"""The checkpoint service's own tensor-bundle writer against TensorFlow's, byte for byte; procsv.common.crc32c."""

from __future__ import annotations

import filecmp
import mmap
import os
import zlib

import numpy as np
import pytest

from procsv.common import crc32c
from procsv.services.checkpoint.bundle import BundleTensor, data_filename, write_bundle


def _arrays(n_keys: int, key_len: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    out: dict[str, np.ndarray] = {
        "zeta/.ATTRIBUTES/VARIABLE_VALUE": rng.random((30, 7)).astype(np.float32),
        "a/b": np.asarray(np.int64(42)),
        "model/layer/kernel": rng.random((3, 4, 5)),
        "model/layer/bias": np.zeros((0,), np.float32),
        "flags": np.array([True, False, True]),
        "half": rng.random(5).astype(np.float16),
        "u8": rng.integers(0, 255, 9).astype(np.uint8),
    }
    for i in range(n_keys):
        out[f"optimizer/{'x' * key_len}/slot_{i:05d}/m"] = rng.random(i % 13 + 1).astype(np.float32)
    return out


def _lay_out(arrays: dict[str, np.ndarray], align: int) -> tuple[mmap.mmap, np.ndarray, list[BundleTensor], int]:
    import tensorflow as tf

    total = sum(a.nbytes + align for a in arrays.values())
    mm = mmap.mmap(-1, max(4096, -(-total // 4096) * 4096))
    buf = np.frombuffer(mm, np.uint8)
    buf[:] = 0xAB  # padding between tensors must land in the file and its checksum as it is
    tensors, pos = [], 0
    for key, a in arrays.items():
        pos = -(-pos // align) * align
        buf[pos:pos + a.nbytes] = a.reshape(-1).view(np.uint8)
        tensors.append(BundleTensor(key, tf.as_dtype(a.dtype).as_datatype_enum, tuple(a.shape), pos, a.nbytes))
        pos += a.nbytes
    return mm, buf, tensors, pos


@pytest.mark.parametrize("n_keys,key_len", [(40, 1), (6000, 60)], ids=["one-block", "many-index-blocks"])
@pytest.mark.slow
def test_bundle_is_byte_identical_to_tensorflows_savev2(tmp_path, n_keys, key_len):
    import tensorflow as tf

    arrays = _arrays(n_keys, key_len)
    keys = list(arrays)
    tf_prefix = str(tmp_path / "tf")
    tf.raw_ops.SaveV2(prefix=tf_prefix, tensor_names=keys, shape_and_slices=[""] * len(keys),
                      tensors=[tf.constant(arrays[k]) for k in keys])
    mm, buf, tensors, length = _lay_out(arrays, align=1)
    mine = str(tmp_path / "mine")
    crc = write_bundle(mine, tensors, buf.ctypes.data, memoryview(mm), length)
    assert filecmp.cmp(data_filename(tf_prefix), data_filename(mine), shallow=False)
    assert filecmp.cmp(tf_prefix + ".index", mine + ".index", shallow=False)
    assert crc == crc32c.file_checksum(data_filename(mine))


def test_aligned_bundle_with_padding_reads_back_and_its_file_checksum_is_exact(tmp_path):
    import tensorflow as tf

    arrays = _arrays(20, 3)
    mm, buf, tensors, length = _lay_out(arrays, align=64)
    prefix = str(tmp_path / "aligned")
    crc = write_bundle(prefix, tensors, buf.ctypes.data, memoryview(mm), length)
    assert os.path.getsize(data_filename(prefix)) == length  # O_DIRECT's padded tail is cut off
    assert crc == crc32c.file_checksum(data_filename(prefix))
    reader = tf.train.load_checkpoint(prefix)
    for key, a in arrays.items():
        got = reader.get_tensor(key)
        assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a), key


def test_overlapping_tensors_are_refused(tmp_path):
    mm = mmap.mmap(-1, 4096)
    buf = np.frombuffer(mm, np.uint8)
    ts = [BundleTensor("a", 1, (4,), 0, 16), BundleTensor("b", 1, (4,), 8, 16)]
    with pytest.raises(ValueError, match="overlaps"):
        write_bundle(str(tmp_path / "x"), ts, buf.ctypes.data, memoryview(mm), 24)
    assert not os.listdir(tmp_path)


def test_crc32c_matches_the_standard_and_combines_without_the_bytes():
    assert crc32c.value(b"123456789") == crc32c.CHECK_VALUE == 0xE3069283
    rng = np.random.default_rng(3)
    for _ in range(30):
        a = rng.integers(0, 256, int(rng.integers(0, 3000)), dtype=np.uint8).tobytes()
        b = rng.integers(0, 256, int(rng.integers(0, 3000)), dtype=np.uint8).tobytes()
        whole = crc32c.value(a + b)
        assert crc32c.extend(crc32c.value(a), b) == whole
        assert crc32c.combine(crc32c.value(a), crc32c.value(b), len(b)) == whole
        buf = np.frombuffer(b, np.uint8)
        assert crc32c.extend_at(crc32c.value(a), buf.ctypes.data, buf.size) == whole


def test_crc32c_at_an_address_reads_shared_memory_in_place():
    mm = mmap.mmap(-1, 3 * 4096)
    buf = np.frombuffer(mm, np.uint8)
    buf[:] = np.random.default_rng(4).integers(0, 256, buf.size, dtype=np.uint8)
    assert crc32c.extend_at(0, buf.ctypes.data, buf.size) == crc32c.value(bytes(mm))
    buf[5000] ^= 0xFF  # the checksum follows the memory, not a copy of it
    assert crc32c.extend_at(0, buf.ctypes.data, buf.size) == crc32c.value(bytes(mm))
    assert crc32c.extend_at(123, buf.ctypes.data, 0) == 123


def test_public_extend_refuses_a_memoryview_of_shared_memory():
    """Why procsv.common.crc32c calls the C library by address: google-crc32c's extend() needs a copy."""
    mm = mmap.mmap(-1, 4096)
    with pytest.raises(TypeError):
        crc32c.extend(0, memoryview(mm))  # type: ignore[arg-type]


def test_masked_crc_is_tensorflows():
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    for data in (b"", b"x", bytes(range(256)) * 9):
        assert crc32c.masked(data) == crc32c.mask(crc32c.value(data)) == masked_crc32c(data)


def test_file_checksum_is_crc32c_by_default(tmp_path):
    path = tmp_path / "f"
    data = os.urandom(9 * 1024 * 1024 + 5)  # more than one read chunk
    path.write_bytes(data)
    assert crc32c.file_checksum(str(path)) == crc32c.value(data)
    assert crc32c.file_checksum(str(tmp_path / "f"), "crc32c") == crc32c.value(data)
    (tmp_path / "empty").write_bytes(b"")
    assert crc32c.file_checksum(str(tmp_path / "empty")) == 0


@pytest.mark.parametrize("size", [1, 64 * 1024 - 1, 64 * 1024, 64 * 1024 + 1, 8 * 1024 * 1024 - 1, 8 * 1024 * 1024,
                                  8 * 1024 * 1024 + 1])
def test_stream_checksum_covers_what_is_left_at_every_buffer_size(tmp_path, size):
    """The read buffer is sized to what is left of the file: every size around its bounds, from a
    handle already partly read, gives the CRC of exactly the rest."""
    path = tmp_path / "f"
    data = os.urandom(size)
    path.write_bytes(data)
    with open(path, "rb", buffering=0) as fh:
        skip = min(size, 7)
        fh.read(skip)
        assert crc32c.stream_checksum(fh) == crc32c.value(data[skip:])
    with open(path, "rb", buffering=0) as fh:
        assert crc32c.stream_checksum(fh, "crc32") == zlib.crc32(data)


def test_stream_checksum_reads_a_file_that_grew_after_the_buffer_was_sized(tmp_path, monkeypatch):
    """The buffer is sized from fstat; bytes appended after that are still read (in more chunks)."""
    path = tmp_path / "f"
    head, tail = os.urandom(1000), os.urandom(200 * 1024)
    path.write_bytes(head)
    real = os.fstat

    def grow_after_stat(fd):
        st = real(fd)
        with open(path, "ab") as out:
            out.write(tail)
        return st

    monkeypatch.setattr(crc32c.os, "fstat", grow_after_stat)
    with open(path, "rb", buffering=0) as fh:
        crc = crc32c.stream_checksum(fh)
    monkeypatch.undo()
    assert crc == crc32c.value(head + tail)


def test_file_checksum_crc32_is_zlibs(tmp_path):
    """The checksum of version-1 manifests, still verified."""
    path = tmp_path / "f"
    data = os.urandom(3 * 1024 * 1024 + 17)
    path.write_bytes(data)
    assert crc32c.file_checksum(str(path), "crc32") == zlib.crc32(data)
