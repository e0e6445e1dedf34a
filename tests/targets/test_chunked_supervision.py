"""Target logits in chunks of positions: no engine hands over (B, S, V), and the chunks change nothing."""

import pathlib
import sys

import pytest
import torch

try:
    import fixtures
except ImportError:
    sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
    import fixtures

from draftsmith.targets import Batch, Features, supervision_for, target_head
from draftsmith.targets.contract import TargetHead, chunk_rows, draft_vocab_targets, rebuild_logits
from draftsmith.drafts.eagle_supervision import eagle3_supervision
from draftsmith.targets.hf import HFEngine


def _reference(logits: torch.Tensor, draft_ids):
    """The unchunked formula on a whole (B, S, V) tensor."""
    top = logits.argmax(-1)
    if draft_ids is None:
        return torch.softmax(logits.float(), -1), torch.ones_like(top, dtype=torch.bool)
    return torch.softmax(logits[..., draft_ids].float(), -1), torch.isin(top, draft_ids)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pruned", [True, False])
def test_chunks_equal_the_whole_tensor(dtype, pruned):
    g = torch.Generator().manual_seed(0)
    B, S, H, V = 2, 9, 16, 50
    h = torch.randn(B, S, H, generator=g).to(dtype)
    w, head_w = torch.rand(H, generator=g) + 0.5, torch.randn(V, H, generator=g)
    head = TargetHead.from_weights(w, head_w, 1e-6)
    ids = torch.arange(0, V, 3) if pruned else None
    want_p, want_m = _reference(rebuild_logits(h, w, head_w, 1e-6), ids)
    for elements in (V, 4 * V, 7 * V, 10**9):  # 1, 4 and 7 rows a chunk (18 rows: uneven tail), one chunk
        p, m = draft_vocab_targets(h, head, ids, max_elements=elements)
        want = want_p
        if dtype == torch.bfloat16:  # a bf16 target's probs are stored in bf16: the fp32 softmax, rounded
            assert p.dtype == torch.bfloat16 and torch.equal(p, want_p.to(torch.bfloat16))
            p, want = p.float(), want_p.to(torch.bfloat16).float()
        assert p.dtype == torch.float32
        # A GEMM over fewer rows may round differently in the last bit (fp32 logits agree to ~1e-7);
        # the entropy, the sum a soft CE takes over these probs, agrees to 1e-6 relative.
        torch.testing.assert_close(p, want, rtol=1e-5, atol=1e-7)
        ent, want_ent = -(p * p.clamp_min(1e-30).log()).sum(), -(want * want.clamp_min(1e-30).log()).sum()
        assert abs(float(ent / want_ent) - 1) < 1e-6
        assert torch.equal(m, want_m)
    assert chunk_rows(V, 7 * V) == 7 and chunk_rows(V, 1) == 1


def test_no_chunk_holds_more_than_its_rows():
    seen = []
    V = 64

    def project(x):
        seen.append(x.shape[0])
        return x @ torch.ones(x.shape[-1], V)

    draft_vocab_targets(torch.randn(3, 11, 8), TargetHead(project, V), torch.arange(10), max_elements=5 * V)
    assert seen == [5] * 6 + [3]  # 33 positions in chunks of 5: the (33, V) tensor never exists


class _RecordingEngine(HFEngine):
    """The hf engine, recording what supervision asks of it."""

    calls: list = []

    def features(self, batch, layer_ids, *, logits):
        self.calls.append((list(layer_ids), logits))
        return super().features(batch, layer_ids, logits=logits)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = _RecordingEngine(fixtures.make_tiny_llama(tmp_path_factory.mktemp("t"), num_layers=3))
    yield eng
    eng.close()


def _batch(vocab):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(10, vocab, (2, 8), generator=g)
    attn, loss = torch.ones_like(ids), torch.zeros_like(ids)
    attn[1, 6:] = 0
    loss[:, 2:7] = 1
    return Batch(ids, attn, loss)


@pytest.mark.parametrize("aux", [[1, 2], [1, 3]])  # id L = 3 requested extra, or already among the draft's
def test_supervision_asks_for_the_layer_L_state_not_logits(engine, aux):
    vocab = engine.info().vocab_size
    batch, ids = _batch(vocab), torch.arange(0, vocab, 4)
    engine.calls.clear()
    sup = supervision_for(engine, "eagle3", batch, aux, ids)
    assert engine.calls == [(aux if 3 in aux else aux + [3], False)]  # no (B, S, V) logits from the engine
    whole = eagle3_supervision(batch, engine.features(batch, aux, logits=True), ids)  # the old path
    assert torch.equal(sup.aux_hidden, whole.aux_hidden) and sup.aux_hidden.shape[2] == len(aux)
    torch.testing.assert_close(sup.target_probs, whole.target_probs, rtol=1e-6, atol=1e-7)
    assert torch.equal(sup.position_mask, whole.position_mask)
    assert torch.equal(sup.loss_mask, whole.loss_mask) and torch.equal(sup.input_ids, whole.input_ids)


def test_hf_head_is_the_forward_head(engine):
    """The hf engine's head is the model's own norm + lm_head: its logits are the forward's."""
    batch = _batch(engine.info().vocab_size)
    feats = engine.features(batch, [3], logits=True)
    h = feats.aux_hidden[:, :, 0]
    got = target_head(engine).project(h.reshape(-1, h.shape[-1])).reshape(feats.logits.shape)
    torch.testing.assert_close(got, feats.logits, rtol=1e-6, atol=1e-6)
    weights = TargetHead.from_weights(engine.final_norm_weight(), engine.lm_head_weight(), engine.info().rms_norm_eps)
    torch.testing.assert_close(weights.project(h), feats.logits, rtol=1e-5, atol=1e-5)


def test_dflash_kd_gets_the_layer_L_state_and_a_whole_logits_kind_still_gets_logits(engine, monkeypatch):
    """dflash_kd carries the state at id L (the JetSpec draft rebuilds the teacher rows it needs); a kind
    that reads (B, S, V) logits whole (a family outside draftsmith) gets them built once from that state."""
    from dataclasses import dataclass

    from draftsmith.targets.contract import SUPERVISION, SupervisionKind

    batch = _batch(engine.info().vocab_size)
    engine.calls.clear()
    sup = supervision_for(engine, "dflash_kd", batch, [1, 2], None)
    assert engine.calls == [([1, 2, 3], False)]  # no (B, S, V) logits from the engine
    want = engine.features(batch, [1, 2, 3], logits=True)
    assert torch.equal(sup.aux_hidden, want.aux_hidden[:, :, :2]) and torch.equal(sup.last_hidden, want.aux_hidden[:, :, 2])
    h = sup.last_hidden.reshape(-1, sup.last_hidden.shape[-1])
    torch.testing.assert_close(target_head(engine).project(h).reshape(want.logits.shape), want.logits, rtol=1e-6, atol=1e-6)

    @dataclass
    class Whole:
        aux_hidden: torch.Tensor
        logits: torch.Tensor

    monkeypatch.setitem(SUPERVISION, "whole", SupervisionKind("whole", Whole, lambda b, f: Whole(f.aux_hidden, f.logits),
                                                              logits=True, vocab=False))
    sup = supervision_for(engine, "whole", batch, [1, 2], None)
    torch.testing.assert_close(sup.logits, want.logits, rtol=1e-6, atol=1e-6)
    assert torch.equal(sup.aux_hidden, want.aux_hidden[:, :, :2])


@pytest.mark.gpu
def test_chunked_supervision_and_blocked_eagle3_loss_on_cuda(tmp_path):
    """On a GPU: supervision built in chunks on the device equals the whole-logits path, and the
    EAGLE-3 loss in checkpointed blocks equals one block (gradients too)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    eng = HFEngine(fixtures.make_tiny_llama(tmp_path / "t", num_layers=3), device="cuda")
    vocab = eng.info().vocab_size
    batch, ids = _batch(vocab).to("cuda"), torch.arange(0, vocab, 4, device="cuda")
    sup = supervision_for(eng, "eagle3", batch, [1, 2], ids)
    whole = eagle3_supervision(batch, eng.features(batch, [1, 2], logits=True), ids)
    assert sup.target_probs.device.type == "cuda"
    torch.testing.assert_close(sup.target_probs, whole.target_probs, rtol=1e-5, atol=1e-6)
    sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "drafts"))
    from test_eagle3 import make_batch, make_draft

    aux, tok, probs, mask = (x.cuda() for x in make_batch(t=13, seed=4))
    grads = []
    for budget in (10**9, 2 * 2 * 13):
        d = make_draft(seed=3).cuda()
        d.max_score_elements = d.max_logit_elements = budget
        d.activation_checkpointing = budget < 10**9
        out = d(aux, tok, probs, mask)
        out.loss.backward()
        grads.append((out.loss.detach(), [p.grad for p in d.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-5, atol=0)
    for a, b in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
