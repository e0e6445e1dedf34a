"""Data plane: the plane decision, the transfer plan, the byte views, and a real gloo channel moving them."""

import threading

import pytest
import torch

from deadline import HANG_S
from draftsmith.remote import wire
from draftsmith.remote.nccl import (Channel, choose_data_plane, join_store, open_store, recv_view, send_view,
                                    transfer_entries, transfer_plan)


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
    with pytest.raises(ValueError, match="auto, nccl, gloo, wire"):
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


def test_nccl_not_between_two_ranks_on_one_gpu():
    plane, reason = choose_data_plane("auto", True, True, same_gpu=True)
    assert plane == "wire" and "same GPU" in reason


@pytest.mark.parametrize("requested,offered,plane", [
    ("gloo", ["wire", "gloo"], "gloo"), ("gloo", ["wire"], "wire"), ("auto", ["wire", "gloo"], "wire")])
def test_gloo_only_when_asked_and_offered(requested, offered, plane):
    assert choose_data_plane(requested, False, False, offered)[0] == plane


def test_plan_checks_counts_and_the_receivers_element_limit():
    with pytest.raises(ValueError, match="not a count"):
        transfer_plan([{"name": "a", "dtype": "float32", "shape": [2, -1]}])
    with pytest.raises(ValueError, match="more than 10 elements"):
        transfer_plan([{"name": "a", "dtype": "float32", "shape": [3, 3]},
                       {"name": "b", "dtype": "bool", "shape": [2]}], max_elements=10)
    with pytest.raises(ValueError, match="must be a list"):
        transfer_plan({"name": "a"})


def _pair(timeout_s=HANG_S):
    """Both ranks of one gloo channel in this process (rank 0 built on a thread: construction blocks)."""
    store, port = open_store("127.0.0.1", timeout_s)
    server = {}
    t = threading.Thread(target=lambda: server.setdefault("ch", Channel("gloo", store, 0, timeout_s)))
    t.start()
    client = Channel("gloo", join_store("127.0.0.1", port, timeout_s), 1, timeout_s)
    t.join(timeout_s)
    return server["ch"], client


def test_gloo_channel_moves_every_wire_dtype_in_header_order():
    server, client = _pair()
    g = torch.Generator().manual_seed(0)
    tensors = {"probs": torch.rand(2, 3, 5, generator=g), "half": torch.rand(4, generator=g).half(),
               "bf": torch.rand(3, 2, generator=g).bfloat16(), "ids": torch.randint(-9, 9, (2, 7), generator=g),
               "i32": torch.tensor([1, -2], dtype=torch.int32), "i16": torch.tensor([-2, 300], dtype=torch.int16),
               "i8": torch.tensor([-128, 127], dtype=torch.int8), "u8": torch.tensor([0, 255], dtype=torch.uint8),
               "mask": torch.rand(2, 7, generator=g) > 0.5, "empty": torch.zeros(0, 4)}
    entries = transfer_entries(tensors)
    assert [e["name"] for e in entries] == list(tensors)
    plan = transfer_plan(entries)
    sender = threading.Thread(target=lambda: (server.send_probe(), server.send(tensors, plan)))
    sender.start()
    client.recv_probe()
    got = client.recv(plan)
    sender.join(HANG_S)
    assert list(got) == list(tensors)
    for k, v in tensors.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape and torch.equal(got[k], v), k
    server.close(), client.close()


def test_gloo_channel_reports_a_dead_peer_instead_of_hanging():
    server, client = _pair()  # the dead peer surfaces as an error; the timeout is only a bound
    client.close()
    del client
    plan = transfer_plan(transfer_entries({"x": torch.zeros(1 << 16)}))
    with pytest.raises(RuntimeError):
        for _ in range(64):  # the first sends may land in socket buffers; the peer's close surfaces soon
            server.send({"x": torch.zeros(1 << 16)}, plan)
    server.close()


def test_the_store_owns_its_listening_descriptor():
    """Closing channels and dropping stores never closes a descriptor number the process reused since."""
    import gc
    import os

    def open_fds():
        return len(os.listdir("/proc/self/fd"))

    server, client = _pair()
    server.close(), client.close()
    r, w = os.pipe()  # may reuse a number a careless close just freed
    del server, client
    gc.collect()
    os.fstat(r), os.fstat(w)  # still ours: nobody closed them behind our back
    os.close(r), os.close(w)
    before = open_fds()
    for _ in range(3):
        a, b = _pair()
        a.close(), b.close()
        del a, b
    gc.collect()
    assert open_fds() <= before + 1  # no descriptor per session left behind


def test_a_store_that_fails_to_start_raises_its_own_error_and_leaks_no_descriptor():
    """A store start that times out (a slow machine) reports that, not EBADF from closing the
    descriptor the store had already closed, and leaves no descriptor behind."""
    import os

    def failed_start():
        with pytest.raises(RuntimeError, match="timed out"):  # torch's DistNetworkError
            open_store("127.0.0.1", 1e-6)

    failed_start()  # first use loads torch.distributed's lazy parts (they hold descriptors)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        failed_start()
    assert len(os.listdir("/proc/self/fd")) <= before


def test_config_choices_match_the_planes():
    from draftsmith.config import CHOICES
    from draftsmith.remote.nccl import PLANES

    assert CHOICES["target.remote_data_plane"] == PLANES
