"""A tiny training setup shared by the remote parity and fault tests."""

from contextlib import contextmanager

import torch
from safetensors.torch import load_file

from draftsmith.config import build_config
from fixtures import make_tiny_llama, make_tokenizer, write_chats  # noqa: F401  (write_chats re-exported)
from remote_helpers import AUX, start_servers


@contextmanager
def tiny_target_and_servers(root, n=2):
    """A tiny target, its chat data and ``n`` serve-target processes (1 thread each); always killed."""
    target = make_tiny_llama(root / "target", make_tokenizer("chatml"))
    servers = []
    try:
        servers = start_servers(target, n, ["--num-threads", "1"])
        yield target, write_chats(root / "chats.jsonl"), servers
    finally:
        for s in servers:
            s.kill()


def train_config(target, data, out, engine="hf", urls=(), **target_extra):
    train = target_extra.pop("train", {})
    draft = target_extra.pop("draft", {})
    return build_config({
        "target": {"path": str(target), "aux_layer_ids": AUX, "engine": engine, "remote_urls": list(urls),
                   **target_extra},
        "data": {"sources": [str(data)], "max_length": 48, "eval_size": 2, "draft_vocab_size": 64},
        "draft": {"ttt_steps": 2, **draft},
        # the draft on the CPU on any machine: these tests compare supervision paths bit for bit
        "train": {"epochs": 1, "batch_size": 2, "lr": 3e-3, "max_steps": 6, "eval_max_batches": 1, "device": "cpu",
                  **train},
        "output": {"dir": str(out), "tensorboard": False},
    })


def final_weights(result) -> dict:
    return load_file(str(result.checkpoint / "model" / "consolidated" / "model.safetensors"))


def same_weights(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
