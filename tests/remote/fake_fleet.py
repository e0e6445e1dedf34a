"""In-process `serve-target` servers over a fake engine (no model load), for the client tests and
bench/remote_failover.py: ``FakeEngine`` answers in ``delay_s`` or, given a ``gate``, only once the
gate is set (a server that never answers in time, without a clock in the test)."""

from __future__ import annotations

import threading
import time
from typing import Optional

import torch

from draftsmith.remote.server import TargetService, build_server
from draftsmith.targets import Features, TargetInfo
from draftsmith.targets.contract import TargetError


class FakeEngine:
    """aux (B, S, n, H=4) = input_id + layer id; logits one-hot-ish over V=16; ``delay_s`` per forward,
    or with ``gate`` a forward that waits for ``gate.set()`` (``entered``/``answered`` count them)."""

    def __init__(self, delay_s: float = 0.01, gate: Optional[threading.Event] = None):
        self.delay_s, self.gate = delay_s, gate
        self.entered = self.answered = 0

    def info(self):
        return TargetInfo(num_layers=4, hidden_size=4, vocab_size=16, dtype="float32", model_type="fake", tied=True)

    def features(self, batch, layer_ids, *, logits):
        self.entered += 1
        if self.gate is not None:
            self.gate.wait()
        else:
            time.sleep(self.delay_s)
        ids = batch.input_ids.float()
        aux = torch.stack([ids[..., None].expand(*ids.shape, 4) + i for i in layer_ids], dim=2)
        lg = torch.nn.functional.one_hot(batch.input_ids % 16, 16).float() * 3.0 if logits else None
        self.answered += 1
        return Features(aux, lg)

    def embeddings(self):
        return torch.arange(64, dtype=torch.float32).reshape(16, 4)

    def lm_head_weight(self):
        raise TargetError("the fake engine has no lm_head")

    def final_norm_weight(self):
        raise TargetError("the fake engine has no final norm")

    def close(self):
        pass


class Fleet:
    """Servers started with ``fleet(engine) -> (url, service)``; ``close()`` opens every gate and
    stops them all."""

    def __init__(self):
        self.made, self.gates = [], []

    def __call__(self, engine: FakeEngine):
        service = TargetService(engine, "fake", [1, 2, 3])
        srv = build_server(service, "127.0.0.1", 0)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.made.append(srv)
        if engine.gate is not None:
            self.gates.append(engine.gate)
        return f"http://127.0.0.1:{srv.server_address[1]}", service

    def close(self):
        for g in self.gates:
            g.set()
        for s in self.made:
            s.shutdown()
            s.server_close()


def batch(k: int):
    from draftsmith.targets import Batch

    ids = torch.full((1, 3), k % 16)
    return Batch(ids, torch.ones_like(ids), torch.ones_like(ids))
