"""Binary frame: exact byte layout, round trips of every dtype, and each malformation refused."""

import json
import struct

import pytest
import torch

from draftsmith.remote import wire
from draftsmith.remote.wire import FrameError, Limits, decode, encode


def _frame(header: dict, payload: bytes = b"", magic=b"DSTF", version=1, reserved=0, hlen=None) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack("<4sHHI", magic, version, reserved, len(h) if hlen is None else hlen) + h + payload


def test_layout_is_magic_version_header_then_packed_payload():
    b = encode({"x": torch.tensor([1, 2], dtype=torch.int16), "y": torch.tensor([True])}, {"k": 7})
    assert b[:4] == b"DSTF" and struct.unpack_from("<HHI", b, 4)[:2] == (1, 0)
    hlen = struct.unpack_from("<I", b, 8)[0]
    assert (12 + hlen) % 64 == 0  # padded so the payload is 64-byte aligned
    header = json.loads(b[12 : 12 + hlen])
    assert header == {"meta": {"k": 7}, "tensors": [
        {"name": "x", "dtype": "int16", "shape": [2], "offset": 0, "nbytes": 4},
        {"name": "y", "dtype": "bool", "shape": [1], "offset": 4, "nbytes": 1}]}
    assert b[12 + hlen :] == b"\x01\x00\x02\x00\x01"  # little-endian int16 1, 2 then bool True


@pytest.mark.parametrize("dtype", [d for d, _ in wire.DTYPES.values()])
def test_round_trip_every_whitelisted_dtype(dtype):
    g = torch.Generator().manual_seed(0)
    src = (torch.randn(3, 0, 2) if dtype != torch.bool else torch.zeros(3, 0, 2)).to(dtype)
    x = (torch.randn(2, 3, 4, generator=g) * 50).to(dtype)
    f = decode(encode({"x": x, "scalar": x.reshape(-1)[0].clone(), "empty": src}, {"m": [1, "a"]}))
    assert f.meta == {"m": [1, "a"]} and list(f.tensors) == ["x", "scalar", "empty"]
    for k, ref in (("x", x), ("scalar", x.reshape(-1)[0]), ("empty", src)):
        assert f.tensors[k].dtype == dtype and f.tensors[k].shape == ref.shape
        assert torch.equal(f.tensors[k], ref)


def test_encode_rejects_unsupported_dtype():
    with pytest.raises(FrameError, match="complex64"):
        encode({"z": torch.zeros(2, dtype=torch.complex64)})


GOOD = {"name": "a", "dtype": "float32", "shape": [2], "offset": 0, "nbytes": 8}


@pytest.mark.parametrize("body,match,status", [
    (b"", "shorter", 400),
    (_frame({"meta": {}, "tensors": []}, magic=b"XXXX"), "bad magic", 400),
    (_frame({"meta": {}, "tensors": []}, version=2), "version 2", 400),
    (_frame({"meta": {}, "tensors": []}, reserved=1), "reserved", 400),
    (_frame({"meta": {}, "tensors": []}, hlen=10_000), "header length", 400),
    (b"DSTF\x01\x00\x00\x00\x02\x00\x00\x00\xff\xfe", "not UTF-8 JSON", 400),
    (_frame([1, 2]), "exactly the keys", 400),
    (_frame({"meta": {}, "tensors": [GOOD]}, b"\0" * 4), "ends at payload byte 8", 400),  # lying nbytes/body
    (_frame({"meta": {}, "tensors": [GOOD]}, b"\0" * 12), "payload has 12", 400),  # trailing bytes
    (_frame({"meta": {}, "tensors": [{**GOOD, "dtype": "object"}]}, b"\0" * 8), "dtype 'object'", 400),
    (_frame({"meta": {}, "tensors": [{**GOOD, "nbytes": 4}]}, b"\0" * 8), "nbytes 4 != numel 2", 400),
    (_frame({"meta": {}, "tensors": [{**GOOD, "offset": 4}]}, b"\0" * 8), "offset 4, expected 0", 400),
    (_frame({"meta": {}, "tensors": [{**GOOD, "shape": [-1]}]}, b"\0" * 8), "dimension -1", 413),
    (_frame({"meta": {}, "tensors": [{**GOOD, "shape": [1 << 20, 1 << 20]}]}), "more than", 413),
    (_frame({"meta": {}, "tensors": [{**GOOD, "shape": [2.0]}]}, b"\0" * 8), "must be an integer", 400),
    (_frame({"meta": {}, "tensors": [{**GOOD, "shape": [1] * 7}]}, b"\0" * 8), "<= 6 dims", 400),
    (_frame({"meta": {}, "tensors": [GOOD, {**GOOD, "offset": 8}]}, b"\0" * 16), "repeated", 400),
    (_frame({"meta": {}, "tensors": [{**GOOD, "extra": 1}]}, b"\0" * 8), "exactly name", 400),
    (_frame({"meta": {}, "tensors": [{**GOOD, "dtype": "bool", "shape": [2], "nbytes": 2}]}, b"\x01\x02"),
     "other than 0/1", 400),
    (_frame({"meta": {}, "tensors": [{**GOOD, "name": f"t{i}", "offset": 0, "shape": [0], "nbytes": 0}
                                     for i in range(17)]}), "17 tensors", 413),
])
def test_malformed_frames_are_refused_with_the_reason(body, match, status):
    with pytest.raises(FrameError, match=match) as e:
        decode(body)
    assert e.value.status == status


def test_limits_apply_to_body_and_total_elements():
    b = encode({"a": torch.zeros(10), "b": torch.zeros(10)})
    with pytest.raises(FrameError, match="exceeds the limit") as e:
        decode(b, Limits(max_body=len(b) - 1))
    assert e.value.status == 413
    with pytest.raises(FrameError, match="more than 15 elements in all tensors"):
        decode(b, Limits(max_elements=15))
    assert torch.equal(decode(b, Limits(max_elements=20)).tensors["b"], torch.zeros(10))
