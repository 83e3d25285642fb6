"""The wire's array (de)serialisation: the same bytes and values as Flower's own Array (np.save /
np.load), read directly only when the bytes are exactly np.save's; anything else goes through
np.load (allow_pickle=False) and its errors."""

from __future__ import annotations

import io

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from app import wire

SHAPES = [(), (1,), (7,), (5, 30), (2, 3, 4, 5), (0,), (3, 0), (6, 1, 5, 5)]


@pytest.mark.parametrize("shape", SHAPES)
def test_encoding_is_flowers_byte_for_byte(shape: tuple[int, ...]) -> None:
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    ours = wire.params_to_record({"w": x})["w"]
    flowers = Array(np.ascontiguousarray(x))  # what params_to_record gave before (0-d becomes 1-d)
    assert (ours.dtype, ours.shape, ours.stype, ours.data) == (flowers.dtype, flowers.shape, flowers.stype, flowers.data)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ">f4"])
def test_decoding_equals_np_load(shape: tuple[int, ...], dtype) -> None:
    x = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    out = wire.record_to_params(ArrayRecord({"w": Array(x)}))["w"]
    assert out.dtype == np.float32 and out.shape == x.shape
    assert np.array_equal(out, np.load(io.BytesIO(Array(x).data)).astype(np.float32))
    out[...] = 0  # writable, as np.load's result is


def _array(data: bytes, dtype: str = "float32", shape: tuple[int, ...] = (2,)) -> Array:
    return Array(dtype=dtype, shape=shape, stype=wire.NUMPY_STYPE, data=data)


def test_metadata_that_disagrees_with_the_bytes_is_read_as_np_load_reads_it() -> None:
    """A sender's dtype/shape fields are not trusted: with bytes for 3 values but fields saying 2
    (or float64), the header inside the bytes decides, as in np.load."""
    good = Array(np.array([1.0, 2.0, 3.0], dtype=np.float32)).data
    for arr in (_array(good, shape=(2,)), _array(good, dtype="float64", shape=(3,))):
        out = wire.record_to_params(ArrayRecord({"w": arr}))["w"]
        assert np.array_equal(out, [1.0, 2.0, 3.0])


@pytest.mark.parametrize("data", [b"", b"\x93NUMPY", b"not numpy at all", b"\x00" * 64])
def test_garbage_bytes_are_a_reply_error(data: bytes) -> None:
    with pytest.raises(wire.ReplyError, match="cannot be decoded"):
        wire.record_to_params(ArrayRecord({"w": _array(data)}))


def test_a_truncated_or_padded_buffer_is_not_read_directly() -> None:
    good = Array(np.arange(4, dtype=np.float32)).data
    with pytest.raises(wire.ReplyError):
        wire.record_to_params(ArrayRecord({"w": _array(good[:-2], shape=(4,))}))
    padded = wire.record_to_params(ArrayRecord({"w": _array(good + b"\x00" * 4, shape=(4,))}))["w"]
    assert np.array_equal(padded, np.arange(4))  # np.load ignores what follows the values


def test_pickled_objects_are_refused() -> None:
    obj = io.BytesIO()
    np.save(obj, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(wire.ReplyError):
        wire.record_to_params(ArrayRecord({"w": _array(obj.getvalue(), dtype="object", shape=(1,))}))
