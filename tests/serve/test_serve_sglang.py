"""SGLang: renamed copy, shifted aux ids, the speculative token map, argv, rejections."""

import json

import pytest
import torch
from safetensors.torch import load_file

import serve_ckpts as sc
from draftsmith.serve.resolve import ServeError, resolve_draft
from draftsmith.serve.sglang import TOKEN_MAP, prepare_sglang, sglang_argv, sglang_config, sglang_key


def test_key_map():
    assert sglang_key("model.layers.0.self_attn.q_proj.weight") == "midlayer.self_attn.q_proj.weight"
    assert sglang_key("model.fc.weight") == "fc.weight"
    assert sglang_key("layers.0.hidden_norm.weight") == "midlayer.hidden_norm.weight"
    assert sglang_key("lm_head.weight") == "lm_head.weight" and sglang_key("d2t") == "d2t"
    assert sglang_key("t2d") is None


def test_config_rename_and_aux_ids_shift_to_sglang_convention():
    out = sglang_config(sc.eagle_config())
    assert out["architectures"] == ["LlamaForCausalLMEagle3"]
    # SGLang captures before layer (id + 1): vLLM ids [1, 3, 4] are SGLang ids [0, 2, 3]
    assert out["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 3]
    assert out["draftsmith"]["vllm_aux_layer_ids"] == [1, 3, 4]


@pytest.mark.parametrize("cfg,msg", [
    (sc.eagle_config(parallel_drafting=True, mask_token_id=30, num_depths=4), "P-EAGLE .* serve vllm"),
    (sc.dflash_config(causal=True), "jetspec drafts .* serve vllm"),
    (sc.eagle_config(fc_norm=True), "EAGLE-3.1"),
    (sc.eagle_config(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 3, 4]}), "exactly 3 aux"),
])
def test_rejections_point_to_vllm(cfg, msg):
    with pytest.raises(ServeError, match=msg):
        sglang_config(cfg)


def test_prepare_writes_copy_and_token_map_of_target_ids_in_draft_order(tmp_path):
    src = sc.make("eagle3", tmp_path)
    prepared, token_map = prepare_sglang(resolve_draft(src))
    out = src / "model" / "consolidated" / "sglang_export"
    assert prepared.path == str(out) and token_map == out / TOKEN_MAP
    ids = torch.load(token_map, weights_only=True)  # how SGLang's load_token_map reads it
    assert ids.dtype == torch.int64 and torch.equal(ids, sc.DRAFT_IDS)
    w = load_file(str(out / "model.safetensors"))
    assert "midlayer.self_attn.q_proj.weight" in w and "t2d" not in w and not any(k.startswith("layers.") for k in w)
    assert torch.equal(w["d2t"] + torch.arange(sc.VD), sc.DRAFT_IDS)  # SGLang's hot_token_id from d2t agrees
    assert json.loads((out / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 3]
    assert prepare_sglang(resolve_draft(src))[0].action == "reuse"


def test_token_map_falls_back_to_vocab_safetensors(tmp_path):
    state = sc.eagle_state()
    del state["d2t"], state["t2d"]
    ckpt = sc.draftsmith_checkpoint(tmp_path, sc.eagle_config(), state)
    _, token_map = prepare_sglang(resolve_draft(ckpt))
    assert torch.equal(torch.load(token_map, weights_only=True), sc.DRAFT_IDS)


def test_unpruned_draft_has_no_token_map(tmp_path):
    state = {k: v for k, v in sc.eagle_state().items() if k not in ("d2t", "t2d")}
    state["lm_head.weight"] = torch.zeros(sc.V, sc.H)
    src = sc.write(tmp_path / "d", sc.eagle_config(draft_vocab_size=sc.V), state)
    prepared, token_map = prepare_sglang(resolve_draft(src))
    assert token_map is None and not (src / "sglang_export" / TOKEN_MAP).exists()
    assert "--speculative-token-map" not in sglang_argv("/t", prepared.path, token_map=token_map)


def test_argv_is_exact():
    argv = sglang_argv("/t", "/d", num_steps=4, topk=1, token_map="/d/map.pt", port=30001, dtype="bfloat16",
                       context_length=2048, extra=["--mem-fraction-static", "0.7"], python="py")
    assert argv == ["py", "-m", "sglang.launch_server", "--model-path", "/t", "--speculative-algorithm", "EAGLE3",
                    "--speculative-draft-model-path", "/d", "--speculative-num-steps", "4",
                    "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "5",
                    "--speculative-token-map", "/d/map.pt", "--host", "127.0.0.1", "--port", "30001",
                    "--dtype", "bfloat16", "--context-length", "2048", "--mem-fraction-static", "0.7"]
    assert sglang_argv("/t", "/d", num_steps=3, topk=4, python="py")[13:15] == ["--speculative-num-draft-tokens", "13"]
