"""NCCL data plane, pure parts: the data-plane decision, the transfer plan and the byte views."""

import pytest
import torch

from draftsmith.remote import wire
from draftsmith.remote.nccl import choose_data_plane, recv_view, send_view, transfer_plan


@pytest.mark.parametrize("requested,local,remote,plane", [
    ("auto", True, True, "nccl"), ("nccl", True, True, "nccl"), ("wire", True, True, "wire"),
    ("auto", False, True, "wire"), ("auto", True, False, "wire"), ("nccl", False, False, "wire"),
])
def test_nccl_only_when_both_sides_have_cuda(requested, local, remote, plane):
    got, reason = choose_data_plane(requested, local, remote)
    assert got == plane
    if plane == "wire" and requested != "wire":
        assert "no CUDA" in reason and (("this side" in reason) == (not local)) and (("server" in reason) == (not remote))


def test_unknown_data_plane_is_an_error():
    with pytest.raises(ValueError, match="auto, nccl, wire"):
        choose_data_plane("tcp", True, True)


def test_plan_follows_header_order_and_byte_views_small_ints():
    tensors = {"probs": torch.rand(2, 3), "mask": torch.tensor([[True, False, True]]),
               "i8": torch.tensor([-1, 5], dtype=torch.int8), "i16": torch.tensor([[-2, 300]], dtype=torch.int16),
               "ids": torch.tensor([7, 8, 9])}
    header = wire.decode(wire.encode(tensors)).tensors  # header order == insertion order
    entries = [{"name": k, "dtype": next(n for n, (d, _) in wire.DTYPES.items() if d == v.dtype), "shape": list(v.shape)}
               for k, v in header.items()]
    plan = transfer_plan(entries)
    assert [p.name for p in plan] == ["probs", "mask", "i8", "i16", "ids"]
    assert [(p.send_dtype, p.send_numel) for p in plan] == [
        ("float32", 6), ("uint8", 3), ("uint8", 2), ("uint8", 4), ("int64", 3)]
    for item in plan:
        buf = send_view(tensors[item.name])
        assert buf.dtype == wire.DTYPES[item.send_dtype][0] and buf.numel() == item.send_numel
        back = recv_view(buf.clone(), item)  # what the receiving rank reconstructs
        assert back.dtype == tensors[item.name].dtype and torch.equal(back, tensors[item.name])
    # int16 300 = 0x012C travels as little-endian bytes 2C 01; -2 = FE FF
    assert send_view(tensors["i16"]).tolist() == [0xFE, 0xFF, 0x2C, 0x01]
    assert send_view(tensors["mask"]).tolist() == [1, 0, 1]


def test_plan_rejects_unknown_dtype_or_repeated_name():
    with pytest.raises(ValueError, match="unknown dtype"):
        transfer_plan([{"name": "a", "dtype": "complex64", "shape": [1]}])
    with pytest.raises(ValueError, match="repeated"):
        transfer_plan([{"name": "a", "dtype": "bool", "shape": [1]}] * 2)
