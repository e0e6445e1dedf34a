"""Hand-built tiny draft checkpoints (config.json + tensors) for every layout and draft type.

Sizes: target vocab V=32, draft vocab Vd=16, hidden H=8, target hidden Ht=8, 2 heads x head_dim 4,
1 kv head, intermediate 16, 3 aux layers; a 6-layer target. Tensor values are arange-based so a
renamed copy can be compared value by value.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

V, VD, H, HT, HEADS, KV, HD, INTER = 32, 16, 8, 8, 2, 1, 4, 16
AUX = [1, 3, 4]
DRAFT_IDS = torch.tensor([0, 1, 2, 3, 5, 7, 8, 10, 12, 13, 17, 20, 21, 25, 30, 31])  # (Vd,) sorted target ids
TARGET = {"num_hidden_layers": 6, "hidden_size": HT, "vocab_size": V, "rope_theta": 10000.0,
          "pad_token_id": 0, "eos_token_id": 3, "bos_token_id": 2, "architectures": ["LlamaForCausalLM"],
          "model_type": "llama"}


def _t(*shape: int, start: float = 0.0) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float32) * 0.01 + start).reshape(shape)


def layer_tensors(prefix: str, in_width: int) -> dict:
    p = prefix
    return {
        f"{p}input_layernorm.weight": torch.ones(H), f"{p}hidden_norm.weight": torch.ones(H),
        f"{p}post_attention_layernorm.weight": torch.ones(H),
        f"{p}self_attn.q_proj.weight": _t(HEADS * HD, in_width, start=1), f"{p}self_attn.k_proj.weight": _t(KV * HD, in_width, start=2),
        f"{p}self_attn.v_proj.weight": _t(KV * HD, in_width, start=3), f"{p}self_attn.o_proj.weight": _t(H, HEADS * HD, start=4),
        f"{p}mlp.gate_proj.weight": _t(INTER, H, start=5), f"{p}mlp.up_proj.weight": _t(INTER, H, start=6),
        f"{p}mlp.down_proj.weight": _t(H, INTER, start=7),
    }


def eagle_state(prefix: str = "model.", peagle: bool = False) -> dict:
    s = {f"{prefix}embed_tokens.weight": _t(V, H), f"{prefix}fc.weight": _t(H, 3 * HT, start=0.5),
         f"{prefix}norm.weight": torch.ones(H), "lm_head.weight": _t(VD, H, start=9)}
    s.update(layer_tensors(f"{prefix}layers.0.", 2 * H))
    s["d2t"] = DRAFT_IDS - torch.arange(VD)  # target = draft + d2t[draft]
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[DRAFT_IDS] = True
    s["t2d"] = t2d
    if peagle:
        s["mask_hidden"] = torch.randn(1, 1, 3 * HT, generator=torch.Generator().manual_seed(0))
    return s


def eagle_config(arch: str = "LlamaEagle3DraftModel", **extra) -> dict:
    cfg = {"architectures": [arch], "model_type": "llama", "hidden_size": H, "intermediate_size": INTER,
           "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HD, "num_hidden_layers": 1,
           "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None,
           "max_position_embeddings": 512, "vocab_size": V, "draft_vocab_size": VD, "target_hidden_size": HT,
           "tie_word_embeddings": False, "torch_dtype": "float32",
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(AUX), "use_aux_hidden_state": True}}
    cfg.update(extra)
    return cfg


def automodel_config(target_layers: int = 32, **extra) -> dict:
    """The config.json NeMo AutoModel's EAGLE-3 recipe writes: built from the target's, so it carries
    the TARGET's num_hidden_layers, and no eagle_aux_hidden_state_layer_ids (its defaults are vLLM's)."""
    cfg = eagle_config(num_hidden_layers=target_layers, **extra)
    del cfg["eagle_config"]
    return cfg


def dflash_config(**dflash) -> dict:
    return {"architectures": ["Qwen3DFlashDraftModel"], "model_type": "qwen3", "hidden_size": H,
            "intermediate_size": INTER, "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HD,
            "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": V,
            "block_size": 4, "max_position_embeddings": 512,
            "dflash_config": {"block_size": 4, "mask_token_id": 31, "target_layer_ids": [0, 2, 3], **dflash}}


def dflash_state() -> dict:
    s = {"fc.weight": _t(H, 3 * HT), "hidden_norm.weight": torch.ones(H), "norm.weight": torch.ones(H)}
    s.update(layer_tensors("layers.0.", H))
    return s


def write(d: Path, config: dict, state: dict, *, fmt: str = "safetensors", tokenizer: bool = True) -> Path:
    """Write one draft dir: config.json + weights in ``fmt`` ("safetensors" | "sharded" | "bin")."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config, indent=2))
    if fmt == "safetensors":
        save_file(state, str(d / "model.safetensors"))
    elif fmt == "bin":
        torch.save(state, d / "pytorch_model.bin")
    elif fmt == "sharded":
        names = sorted(state)
        half = len(names) // 2
        shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
        for fname, keys in shards.items():
            save_file({k: state[k] for k in keys}, str(d / fname))
        index = {"metadata": {}, "weight_map": {k: f for f, ks in shards.items() for k in ks}}
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        raise ValueError(fmt)
    if tokenizer:
        (d / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 512}))
    return d


def draftsmith_checkpoint(root: Path, config: dict, state: dict, **kw) -> Path:
    """The checkpoint layout of docs/reference/layouts.md: <root>/epoch_0_step_5/model/consolidated/ + vocab + meta.json."""
    ckpt = root / "epoch_0_step_5"
    write(ckpt / "model" / "consolidated", config, state, **kw)
    save_file({"draft_ids": DRAFT_IDS.clone(), "d2t": DRAFT_IDS - torch.arange(VD), "t2d": state.get("t2d", torch.zeros(V, dtype=torch.bool))},
              str(ckpt / "vocab.safetensors"))
    meta = {"aux_layer_ids": AUX, "target_info": {"num_layers": 6, "hidden_size": HT, "vocab_size": V,
                                                  "rope_theta": 10000.0, "rope_scaling": None}}
    (ckpt / "meta.json").write_text(json.dumps(meta))
    return ckpt


def make(kind: str, root: Path) -> Path:
    """Build fixture ``kind`` under ``root``; return the path a user would pass."""
    if kind == "eagle3":
        return draftsmith_checkpoint(root, eagle_config(), eagle_state())
    if kind == "peagle":
        cfg = eagle_config(parallel_drafting=True, mask_token_id=30, num_depths=4)
        return draftsmith_checkpoint(root, cfg, eagle_state(peagle=True))
    if kind == "dflash":
        return write(root / "dflash", dflash_config(), dflash_state())
    if kind == "jetspec":
        return write(root / "jetspec", dflash_config(causal=True), dflash_state())
    if kind == "domino":
        return write(root / "domino", dflash_config(projector_type="domino"), dflash_state())
    if kind == "automodel":  # AutoModel's layout: model.-prefixed weights, layer 0 only, no meta.json
        return write(root / "automodel", automodel_config(), eagle_state())
    if kind == "standard":
        return write(root / "standard", eagle_config("LlamaForCausalLMEagle3"), eagle_state(prefix=""))
    if kind == "sharded":
        return write(root / "sharded", eagle_config(), eagle_state(), fmt="sharded")
    if kind == "bin":
        return write(root / "bin", eagle_config(), eagle_state(), fmt="bin")
    raise ValueError(kind)


def make_target(d: Path, **overrides) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({**TARGET, **overrides}))
    return d


def tree_digest(root: Path) -> dict:
    """Every file under ``root`` -> (size, mtime_ns, sha256): a byte-for-byte picture of the tree."""
    import hashlib

    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() or p.is_symlink():
            st = p.lstat()
            data = p.read_bytes() if p.is_file() else b""
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns, hashlib.sha256(data).hexdigest())
        elif p.is_dir():
            out[str(p.relative_to(root)) + "/"] = None
    return out
