"""A TRAINED P-EAGLE checkpoint (not a hand-made one) against the on-disk contract and the vLLM path.

the export layout of docs/reference/layouts.md, key for key: the consolidated config.json and
model.safetensors; then `draftsmith export --to vllm` and the `serve vllm` launch path (its cached
vllm_export/) with vLLM's names (`model.` stripped, `mask_hidden`/`lm_head`/`d2t`/`t2d` top level,
`pard_token`), and `serve vllm --print-only`'s speculative config (`parallel_drafting`, K = num_depths).
"""

import json
import shlex

import pytest
import torch
from safetensors.torch import load_file

from draftsmith.config import build_config
from draftsmith.serve.cli import main
from draftsmith.serve.export import export_draft
from draftsmith.train.loop import train
from fixtures import make_tiny_llama, make_tokenizer, write_jsonl

LAYERS, DEPTHS, MASK, VD = 3, 4, 5, 64  # mask 5 = <|start_header_id|>, never in chatml text
LAYER_KEYS = ["input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
              "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
              "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]


def layer_names(prefix: str) -> list[str]:
    """Layer 0 is the fused 2H layer (it alone has hidden_norm); layers 1..L-1 are plain Llama layers."""
    names = [f"{prefix}layers.0.hidden_norm.weight"]
    for i in range(LAYERS):
        names += [f"{prefix}layers.{i}.{k}" for k in LAYER_KEYS]
    return names


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("peagle")
    tok = make_tokenizer("chatml")
    target = make_tiny_llama(root / "target", tok, num_layers=6, hidden=64)
    rows = [{"messages": [{"role": "user", "content": "What is the capital of France?"},
                          {"role": "assistant", "content": "The capital of France is Paris."}]}] * 8
    cfg = build_config({
        "target": {"path": str(target), "aux_layer_ids": [1, 3, 4]},
        "data": {"sources": [str(write_jsonl(root / "chats.jsonl", rows))], "max_length": 48, "eval_size": 2,
                 "draft_vocab_size": VD},
        "draft": {"type": "peagle", "mask_token_id": MASK, "num_depths": DEPTHS, "num_draft_layers": LAYERS},
        "train": {"max_steps": 2, "batch_size": 2},
        "output": {"dir": str(root / "out"), "tensorboard": False},
    })
    return target, train(cfg, progress=False).checkpoint, len(tok)


@pytest.mark.slow
def test_trained_checkpoint_matches_the_on_disk_contract_key_for_key(trained):
    target, ckpt, V = trained
    cons = ckpt / "model" / "consolidated"
    weights = load_file(str(cons / "model.safetensors"))
    assert sorted(weights) == sorted(["model.embed_tokens.weight", "model.fc.weight", "model.norm.weight",
                                      "lm_head.weight", "d2t", "t2d", "mask_hidden", *layer_names("model.")])
    assert weights["mask_hidden"].shape == (1, 1, 3 * 64)  # the pre-fc width: 3 aux states of the target
    assert weights["model.layers.0.self_attn.q_proj.weight"].shape == (64, 128)  # fused 2H input
    assert weights["model.layers.1.self_attn.q_proj.weight"].shape == (64, 64)  # plain layer on H
    assert weights["lm_head.weight"].shape == (VD, 64) and weights["t2d"].shape == (V,)
    cfg = json.loads((cons / "config.json").read_text())
    assert sorted(cfg) == sorted([
        "architectures", "model_type", "hidden_size", "intermediate_size", "num_attention_heads",
        "num_key_value_heads", "head_dim", "num_hidden_layers", "hidden_act", "rms_norm_eps", "rope_theta",
        "rope_scaling", "max_position_embeddings", "vocab_size", "draft_vocab_size", "target_hidden_size",
        "tie_word_embeddings", "eagle_config", "fc_norm", "norm_output", "torch_dtype", "draftsmith",
        "parallel_drafting", "mask_token_id", "num_depths", "down_sample_ratio", "down_sample_ratio_min"])
    want = {"architectures": ["LlamaEagle3DraftModel"], "num_hidden_layers": LAYERS, "parallel_drafting": True,
            "mask_token_id": MASK, "num_depths": DEPTHS, "down_sample_ratio": 0.7, "down_sample_ratio_min": 0.2,
            "draft_vocab_size": VD, "target_hidden_size": 64, "vocab_size": V, "tie_word_embeddings": False,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": True},
            "draftsmith": {"draft_type": "peagle"}}
    assert {k: cfg[k] for k in want} == want
    assert json.loads((ckpt / "meta.json").read_text())["draft_type"] == "peagle"


def check_vllm_copy(d, source) -> dict:
    """vLLM's names and config for a copy of ``source`` (the consolidated dir); returns its config."""
    src = load_file(str(source / "model.safetensors"))
    got = load_file(str(d / "model.safetensors"))
    assert sorted(got) == sorted(["embed_tokens.weight", "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
                                  "mask_hidden", *layer_names("")])
    for name, t in got.items():  # a rename only: every tensor is bit-identical to its source
        assert torch.equal(t, src[name if name in ("lm_head.weight", "d2t", "t2d", "mask_hidden") else "model." + name])
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert (cfg["pard_token"], cfg["mask_token_id"], cfg["num_depths"], cfg["num_hidden_layers"]) == (MASK, MASK, DEPTHS, LAYERS)
    assert cfg["parallel_drafting"] is True
    return cfg


@pytest.mark.slow
def test_export_to_vllm_and_serve_vllm_use_vllms_names(trained, tmp_path, capsys, monkeypatch):
    from draftsmith.serve import vllm as vllm_mod

    target, ckpt, _ = trained
    cons = ckpt / "model" / "consolidated"
    check_vllm_copy(export_draft(ckpt, tmp_path / "exported", to="vllm"), cons)

    # --print-only: the speculative config, K = num_depths by default, nothing written
    assert main(["serve", "vllm", "--target", str(target), "--draft", str(ckpt), "--print-only"]) == 0
    argv = shlex.split(capsys.readouterr().out.strip())
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": str(cons / "vllm_export"), "num_speculative_tokens": DEPTHS,
                    "parallel_drafting": True}
    assert not (cons / "vllm_export").exists()
    # an explicit K wins over num_depths
    assert main(["serve", "vllm", "--target", str(target), "--draft", str(ckpt), "--print-only",
                 "--num-speculative-tokens", "2"]) == 0
    argv = shlex.split(capsys.readouterr().out.strip())
    assert json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"] == 2

    # the launch path (server replaced by a recorder): the cached vllm_export/ it builds is what vLLM loads
    launched = []
    monkeypatch.setattr(vllm_mod, "launch", lambda argv, env=None: launched.append(list(argv)) or 0)
    monkeypatch.setattr(vllm_mod, "require_module", lambda name, hint: None)
    assert main(["serve", "vllm", "--target", str(target), "--draft", str(ckpt)]) == 0
    assert len(launched) == 1 and launched[0][launched[0].index("--model") + 1] == str(target)
    spec = json.loads(launched[0][launched[0].index("--speculative-config") + 1])
    assert spec["parallel_drafting"] is True and spec["num_speculative_tokens"] == DEPTHS
    check_vllm_copy(cons / "vllm_export", cons)
