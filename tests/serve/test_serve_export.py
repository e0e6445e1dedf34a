"""The cached vllm_export/ copy: contents, reuse, rebuild on a touched weight file or a changed config,
in-place atomic config fixups for vLLM-standard drafts, and standalone `export --to ...`."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file

import serve_ckpts as sc
from draftsmith.serve import export as ex
from draftsmith.serve.export import STAMP, export_draft, export_vllm
from draftsmith.serve.resolve import resolve_draft
from draftsmith.serve.vllm import prepare_vllm


def source_digest(d):
    """The source files only (the export lives inside the draft dir)."""
    return {k: v for k, v in sc.tree_digest(d).items() if not k.startswith(("vllm_export", "sglang_export"))}


def stripped(state):
    return {k[len("model."):] if k.startswith("model.") else k: v for k, v in state.items()}


def test_prefixed_draft_is_exported_with_prefix_stripped_and_source_untouched(tmp_path):
    src = sc.make("eagle3", tmp_path) / "model" / "consolidated"
    before = source_digest(src)
    p = prepare_vllm(resolve_draft(src))
    out = src / "vllm_export"
    assert p.action == "export" and p.path == str(out)
    got = load_file(str(out / "model.safetensors"))
    want = stripped(sc.eagle_state())
    assert sorted(got) == sorted(want) and "fc.weight" in got and "d2t" in got
    assert torch.equal(got["t2d"], sc.eagle_state()["t2d"])  # carried unchanged (vLLM skips it, others read it)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == sc.VD
    assert (out / "tokenizer_config.json").read_text() == (src / "tokenizer_config.json").read_text()
    assert source_digest(src) == before
    assert not [p for p in src.iterdir() if p.name.startswith(".")]  # no temporary dirs left behind


def test_export_is_reused_until_a_weight_file_is_touched_or_the_config_changes(tmp_path):
    src = sc.make("eagle3", tmp_path) / "model" / "consolidated"
    out = src / "vllm_export"
    assert prepare_vllm(resolve_draft(src)).action == "export"
    built = sc.tree_digest(out)
    assert prepare_vllm(resolve_draft(src)).action == "reuse"
    assert sc.tree_digest(out) == built  # not rewritten

    st = (src / "model.safetensors").stat()
    os.utime(src / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))  # touch, same bytes
    p = prepare_vllm(resolve_draft(src))
    assert p.action == "export" and "stale" in p.note
    assert sc.tree_digest(out)[STAMP] != built[STAMP]
    assert prepare_vllm(resolve_draft(src)).action == "reuse"

    cfg = json.loads((src / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-5
    (src / "config.json").write_text(json.dumps(cfg))
    assert prepare_vllm(resolve_draft(src)).action == "export"
    assert json.loads((out / "config.json").read_text())["rms_norm_eps"] == 1e-5


def test_export_options_are_part_of_the_fingerprint(tmp_path):
    src = sc.write(tmp_path / "d", sc.dflash_config(), {"model.fc.weight": torch.ones(2, 2)})  # prefixed DFlash
    assert prepare_vllm(resolve_draft(src)).action == "export"
    assert "causal" not in json.loads((src / "vllm_export" / "config.json").read_text())["dflash_config"]
    assert prepare_vllm(resolve_draft(src), dflash_causal=True).action == "export"
    assert json.loads((src / "vllm_export" / "config.json").read_text())["dflash_config"]["causal"] is True


def test_sharded_export_remaps_the_index_and_rebuilds_when_one_shard_is_touched(tmp_path):
    src = sc.make("sharded", tmp_path)
    out = src / "vllm_export"
    assert prepare_vllm(resolve_draft(src)).action == "export"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    want = stripped(sc.eagle_state())
    assert sorted(index["weight_map"]) == sorted(want)
    assert set(index["weight_map"].values()) == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    for name, shard in index["weight_map"].items():
        assert torch.equal(load_file(str(out / shard))[name], want[name])
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in want.values())
    assert prepare_vllm(resolve_draft(src)).action == "reuse"
    shard = src / "model-00002-of-00002.safetensors"
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 10**9))
    assert prepare_vllm(resolve_draft(src)).action == "export"


def test_pytorch_bin_is_converted_to_safetensors(tmp_path):
    src = sc.make("bin", tmp_path)
    prepare_vllm(resolve_draft(src))
    got = load_file(str(src / "vllm_export" / "model.safetensors"))
    assert torch.equal(got["layers.0.mlp.down_proj.weight"], sc.eagle_state()["model.layers.0.mlp.down_proj.weight"])


def test_vllm_standard_draft_is_used_in_place_without_writing(tmp_path):
    src = sc.make("standard", tmp_path)
    before = sc.tree_digest(tmp_path)
    p = prepare_vllm(resolve_draft(src))
    assert p.action == "as-is" and p.path == str(src.resolve())
    assert sc.tree_digest(tmp_path) == before


def test_vllm_standard_config_fixups_are_written_in_place_atomically(tmp_path, monkeypatch):
    src = sc.write(tmp_path / "d", sc.eagle_config("Eagle3LlamaForCausalLM", parallel_drafting=True, mask_token_id=30,
                                                   num_depths=4), sc.eagle_state(prefix="", peagle=True))
    weights_before = sc.tree_digest(src)["model.safetensors"]
    replaced = []
    real = os.replace
    monkeypatch.setattr(ex.os, "replace", lambda a, b: (replaced.append((str(a), str(b))), real(a, b))[1])
    p = prepare_vllm(resolve_draft(src))
    assert p.action == "update-config" and "architectures" in p.note and "pard_token" in p.note
    cfg = json.loads((src / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["pard_token"] == 30
    assert len(replaced) == 1 and replaced[0][1] == str(src.resolve() / "config.json")
    assert os.path.dirname(replaced[0][0]) == str(src.resolve())  # tmp file in the same directory
    assert sc.tree_digest(src)["model.safetensors"] == weights_before
    assert sorted(p.name for p in src.iterdir()) == ["config.json", "model.safetensors", "tokenizer_config.json"]
    assert prepare_vllm(resolve_draft(src)).action == "as-is"  # idempotent


def test_standalone_exports(tmp_path):
    ckpt = sc.make("eagle3", tmp_path / "src")
    v = export_draft(ckpt, tmp_path / "v", to="vllm")
    assert sorted(load_file(str(v / "model.safetensors"))) == sorted(stripped(sc.eagle_state()))
    s = export_draft(ckpt, tmp_path / "s", to="speculators", target="/models/t", num_speculative_tokens=2)
    cfg = json.loads((s / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "/models/t"
    assert sorted(load_file(str(s / "model.safetensors"))) == sorted(stripped(sc.eagle_state()))
    g = export_draft(ckpt, tmp_path / "g", to="sglang")
    assert (g / "speculative_token_map.pt").is_file()
    assert export_vllm(ckpt / "model" / "consolidated", tmp_path / "legacy") == tmp_path / "legacy"  # demo's call
    with pytest.raises(ex.ServeError, match="--target is required"):
        export_draft(ckpt, tmp_path / "x", to="speculators")
    with pytest.raises(ex.ServeError, match="is the draft itself"):
        export_draft(ckpt, ckpt / "model" / "consolidated", to="vllm")


def test_missing_safetensors_for_a_remap_is_engine_missing(tmp_path, monkeypatch):
    src = sc.make("eagle3", tmp_path) / "model" / "consolidated"
    real = ex.importlib.util.find_spec
    monkeypatch.setattr(ex.importlib.util, "find_spec", lambda n, *a: None if n == "safetensors" else real(n, *a))
    with pytest.raises(ex.EngineMissing, match="needs the 'safetensors' package.*pip install safetensors"):
        prepare_vllm(resolve_draft(src))
    assert not (src / "vllm_export").exists()
