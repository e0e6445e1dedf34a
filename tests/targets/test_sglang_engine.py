"""The sglang engine adapter against a fake runner that follows the Runner protocol.

SGLang needs a CUDA GPU (no CPU packages), so the adapter (layer-id order, padding, logits rebuilt
from id L, supervision) is tested here with a fake runner computing states with plain transformers;
the real-engine test runs only where sglang and a GPU exist.
"""

import importlib.util

import pytest
import torch

import fixtures
from draftsmith.targets import Batch
from draftsmith.targets.contract import TargetError
from draftsmith.drafts.block_supervision import dflash_ids_to_engine
from draftsmith.drafts.eagle_supervision import eagle3_supervision
from draftsmith.targets.hf import HFEngine
from draftsmith.targets.sglang import SGLangEngine, check_available, sglang_capture_ids

L = 4


class FakeRunner:
    """Runner protocol over a plain transformers model, one unpadded forward per row.

    Returns (T, n, H) at the sorted capture ids: id i < L is ``hidden_states[i]``, id L is the
    final norm's input (computed independently of the hf engine's code path).
    """

    def __init__(self, path):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.capture, self.set_calls, self.rows_seen, self.closed = None, 0, [], False

    def set_capture_layers(self, layer_ids):
        self.capture, self.set_calls = list(layer_ids), self.set_calls + 1

    def run(self, rows):
        self.rows_seen.append(rows)
        out = []
        for r in rows:
            grabbed = {}
            hook = self.model.model.norm.register_forward_pre_hook(lambda m, a: grabbed.setdefault("x", a[0]))
            with torch.no_grad():
                hs = self.model(torch.tensor([r]), output_hidden_states=True).hidden_states
            hook.remove()
            out.append(torch.stack([grabbed["x"][0] if i == L else hs[i][0] for i in self.capture], dim=1))
        return out

    def close(self):
        self.closed = True


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def target(request, tmp_path_factory):
    return fixtures.make_tiny_llama(tmp_path_factory.mktemp("t"), num_layers=L, tied=request.param)


def _batch(vocab):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(10, vocab, (3, 9), generator=g)
    attn = torch.ones_like(ids)
    attn[1, 6:] = 0
    attn[2, 2:] = 0
    loss = torch.zeros_like(ids)
    loss[:, 2:8] = 1
    loss[attn == 0] = 0
    return Batch(ids, attn, loss)


def test_fake_runner_features_and_supervision_equal_hf(target):
    hf = HFEngine(target)
    fake = FakeRunner(target)
    eng = SGLangEngine(target, runner=fake)
    b = _batch(hf.info().vocab_size)
    ids = [3, 0, 1, L]  # unsorted on purpose, embeddings and the pre-norm final state included
    ref, got = hf.features(b, ids, logits=True), eng.features(b, ids, logits=True)
    assert fake.capture == [0, 1, 3, L]  # runners always get sorted ids
    assert [len(r) for r in fake.rows_seen[0]] == [9, 6, 2]  # one unpadded row each
    real = b.attention_mask.bool()
    torch.testing.assert_close(got.aux_hidden[real], ref.aux_hidden[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.logits[real], ref.logits[real], atol=1e-5, rtol=1e-5)
    assert got.aux_hidden[~real].abs().sum() == 0  # nothing ran on pads
    draft_ids = torch.arange(0, hf.info().vocab_size, 3)
    s_ref, s_got = (eagle3_supervision(b, f, draft_ids) for f in (ref, got))
    assert torch.equal(s_got.input_ids, s_ref.input_ids) and torch.equal(s_got.loss_mask, s_ref.loss_mask)
    assert torch.equal(s_got.position_mask, s_ref.position_mask)
    shifted_real = real.clone()
    shifted_real[:, :-1] = real[:, 1:]
    shifted_real[:, -1] = False  # slot t's target comes from position t + 1
    torch.testing.assert_close(s_got.target_probs[shifted_real], s_ref.target_probs[shifted_real], atol=1e-6, rtol=1e-5)
    # Weights the trainer copies come straight from the safetensors and equal the loaded model's.
    assert torch.equal(eng.embeddings(), hf.embeddings())
    assert torch.equal(eng.lm_head_weight(), hf.lm_head_weight())
    assert torch.equal(eng.final_norm_weight(), hf.final_norm_weight())
    assert eng.info() == hf.info()


@pytest.mark.parametrize("kind", ["dflash", "dflash_kd"])
def test_fake_runner_dflash_supervision_equals_hf(target, kind):
    """Runner engines serve the vocab-free DFlash kinds through Engine.supervision like hf (real positions)."""
    hf, fake = HFEngine(target), FakeRunner(target)
    eng = SGLangEngine(target, runner=fake)
    b = _batch(hf.info().vocab_size)
    ids = dflash_ids_to_engine([1, 3])  # outputs of decoder layers 1 and 3 = engine ids [2, L]
    (_, got), = eng.supervision(kind, iter([b]), ids)
    (_, ref), = hf.supervision(kind, iter([b]), ids)
    assert fake.capture == [2, L]  # id L: the draft reads it here (and dflash_kd would ask for it anyway)
    real = b.attention_mask.bool()
    assert torch.equal(got.input_ids, b.input_ids) and torch.equal(got.loss_mask, b.loss_mask)
    torch.testing.assert_close(got.aux_hidden[real], ref.aux_hidden[real], atol=1e-5, rtol=1e-5)
    if kind == "dflash_kd":  # the state at id L, from which the draft rebuilds the teacher's logits
        assert got.last_hidden.dtype == ref.last_hidden.dtype == torch.float32
        torch.testing.assert_close(got.last_hidden[real], ref.last_hidden[real], atol=1e-5, rtol=1e-5)
        assert got.last_hidden[~real].abs().sum() == 0  # nothing ran on pads
    else:
        assert not hasattr(got, "logits")


def test_capture_layers_are_set_once_and_without_logits_id_L_is_not_captured(target):
    fake = FakeRunner(target)
    eng = SGLangEngine(target, runner=fake)
    b = _batch(eng.info().vocab_size)
    f = eng.features(b, [2, 1], logits=False)
    assert f.logits is None and fake.capture == [1, 2] and f.aux_hidden.shape == (3, 9, 2, 64)
    eng.features(b, [2, 1], logits=False)
    assert fake.set_calls == 1  # capture ids unchanged: the runner is not rebuilt
    eng.features(b, [2, 1], logits=True)
    assert fake.set_calls == 2 and fake.capture == [1, 2, L]
    eng.close()
    assert fake.closed


def test_wrong_row_shape_from_runner_is_a_one_line_error(target):
    class Short(FakeRunner):
        def run(self, rows):
            return [h[:-1] for h in super().run(rows)]

    eng = SGLangEngine(target, runner=Short(target))
    with pytest.raises(TargetError, match=r"row 0 came back as \(8, 1, 64\), expected \(9, 1, 64\)"):
        eng.features(_batch(eng.info().vocab_size), [1], logits=False)


def test_sglang_layer_ids_map_to_sglang_convention():
    # SGLang captures the input of layer k+1 for id k: vLLM id i -> i - 1; id L goes through the norm hook.
    assert sglang_capture_ids([0, 1, 3, 4], 4) == [-1, 0, 2]


@pytest.mark.skipif(torch.cuda.is_available() and importlib.util.find_spec("sglang") is not None,
                    reason="SGLang and a GPU are present")
def test_sglang_unavailable_here_fails_with_the_reason():
    with pytest.raises(TargetError, match="target.engine: sglang"):
        check_available()


def test_training_with_an_engine_that_cannot_run_fails_before_data_loads(tmp_path):
    if torch.cuda.is_available() and importlib.util.find_spec("sglang") is not None:
        pytest.skip("SGLang can run here")
    from draftsmith.config import build_config
    from draftsmith.train.loop import train

    cfg = build_config({"target": {"path": str(tmp_path / "no-such-target"), "engine": "sglang"},
                        "data": {"sources": [str(tmp_path / "no-such-data.jsonl")]},
                        "output": {"dir": str(tmp_path / "run"), "tensorboard": False}})
    with pytest.raises(TargetError, match="sglang"):  # the engine, not the missing data or target
        train(cfg, progress=False)


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and importlib.util.find_spec("sglang") is not None),
                    reason="needs sglang and a CUDA GPU")
@pytest.mark.parametrize("tp", [1, 2])
def test_real_sglang_features_equal_hf(target, tp):
    if torch.cuda.device_count() < tp:
        pytest.skip(f"tp_size {tp} needs {tp} GPUs, {torch.cuda.device_count()} visible")
    hf = HFEngine(target)
    eng = SGLangEngine(target, engine_kwargs={"mem_fraction_static": 0.2, "tp_size": tp})
    try:
        b = _batch(hf.info().vocab_size)
        ref, got = hf.features(b, [1, 2, L], logits=True), eng.features(b, [1, 2, L], logits=True)
        real = b.attention_mask.bool()
        torch.testing.assert_close(got.aux_hidden[real], ref.aux_hidden[real], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got.logits[real], ref.logits[real], atol=1e-4, rtol=1e-4)
    finally:
        eng.close()


def test_all_pad_rows_are_not_sent_to_the_runner(target):
    fake = FakeRunner(target)
    eng = SGLangEngine(target, runner=fake)
    b = _batch(eng.info().vocab_size)
    b.attention_mask[1] = 0
    b.loss_mask[1] = 0
    f = eng.features(b, [1], logits=True)
    assert [len(r) for r in fake.rows_seen[0]] == [9, 2]
    assert f.aux_hidden[1].abs().sum() == 0 and f.logits[1].abs().sum() == 0
