"""Drafts trained on an unsorted aux-id list (before draftsmith sorted them) are served correctly.

vLLM 0.32 sorts ``eagle_aux_hidden_state_layer_ids`` (and DFlash's ``target_layer_ids`` + 1) and both
engines concatenate aux states in ascending layer order, so every served copy (export --to
vllm|sglang|speculators, serve's cached copies) lists the ids ascending and carries fc's input blocks
(and input_norm, P-EAGLE's mask_hidden, the per-block fc_norm.{i}) reordered to match, printed as a
fixup; the source stays as it was. Checked numerically: the served draft applied to the ascending
states equals the trained draft applied to the states in the listed order.
"""

import json

import pytest
import torch
from safetensors.torch import load_file

import serve_ckpts as sc
from draftsmith.drafts.eagle3.export import load_exported
from draftsmith.drafts.peagle.export import load_exported as load_peagle
from draftsmith.serve.cli import main
from draftsmith.serve.doctor import diagnose
from draftsmith.serve.export import export_draft
from draftsmith.serve.resolve import reorder_aux_blocks, resolve_draft, servable_config
from draftsmith.serve.vllm import prepare_vllm

LISTED, ASCENDING = [4, 1, 3], [1, 3, 4]  # engine ids; trained block i reads LISTED[i]
KEY = "eagle_config.eagle_aux_hidden_state_layer_ids"


def states(ids, T=5, seed=0):
    """(1, T, n, Ht) aux states in the order of ``ids``: one fixed random state per layer id."""
    g = torch.Generator().manual_seed(seed)
    by_id = {i: torch.randn(1, T, sc.HT, generator=g) for i in range(7)}
    return torch.stack([by_id[i] for i in ids], dim=2)


def unsorted_eagle(root, *, peagle=False, fmt="safetensors", prefix="model."):
    extra = {"parallel_drafting": True, "mask_token_id": 30, "num_depths": 4} if peagle else {}
    cfg = sc.eagle_config(fc_norm=True, **extra)
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = list(LISTED)
    state = sc.eagle_state(prefix=prefix, peagle=peagle)
    g = torch.Generator().manual_seed(1)
    state[f"{prefix}fc.weight"] = torch.randn(sc.H, 3 * sc.HT, generator=g)
    for i in range(3):  # distinct per-block norms, so a wrong block order shows
        state[f"{prefix}fc_norm.{i}.weight"] = 0.5 + torch.rand(sc.HT, generator=g)
    if prefix:
        ckpt = sc.draftsmith_checkpoint(root, cfg, state, fmt=fmt)
        (ckpt / "meta.json").write_text(json.dumps({"aux_layer_ids": LISTED}))  # as the trainer wrote it then
        return ckpt / "model" / "consolidated", cfg, state
    return sc.write(root / "standard", cfg, state, fmt=fmt), cfg, state


def source_digest(d):
    return {k: v for k, v in sc.tree_digest(d).items() if not k.startswith(("vllm_export", "sglang_export"))}


def read_weights(d):
    if (d / "model.safetensors").is_file():
        return load_file(str(d / "model.safetensors"))
    index = json.loads((d / "model.safetensors.index.json").read_text())
    out = {}
    for shard in sorted(set(index["weight_map"].values())):
        out.update(load_file(str(d / shard)))
    return out


@pytest.mark.parametrize("fmt,prefix", [("safetensors", "model."), ("sharded", "model."), ("safetensors", "")])
def test_served_eagle3_equals_the_trained_draft_on_ascending_states(tmp_path, fmt, prefix):
    src, cfg, state = unsorted_eagle(tmp_path, fmt=fmt, prefix=prefix)
    before = source_digest(src)
    p = prepare_vllm(resolve_draft(src))  # an unprefixed draft too: a copy, never the source rewritten
    assert p.action == "export" and len(p.fixups) == 1, p
    assert p.fixups[0].startswith(f"{KEY} [4, 1, 3] -> [1, 3, 4] in the served copy, with fc's input blocks "
                                  "reordered to match (vLLM and SGLang read aux states in ascending layer order")
    out = src / "vllm_export"
    served_cfg = json.loads((out / "config.json").read_text())
    assert served_cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ASCENDING
    assert source_digest(src) == before  # the source untouched
    trained = load_exported(cfg, dict(state))
    served = load_exported(served_cfg, read_weights(out))
    torch.testing.assert_close(served.combine(states(ASCENDING)), trained.combine(states(LISTED)))
    wrong = trained.combine(states(ASCENDING))  # what serving the weights as they are would compute
    assert not torch.allclose(wrong, trained.combine(states(LISTED)), atol=1e-3)
    got, want = served.state_dict(), trained.state_dict()
    same = [k for k in want if "fc" not in k]
    assert same and all(torch.equal(got[k], want[k]) for k in same)  # nothing else moves


def test_served_peagle_mask_hidden_follows_the_blocks(tmp_path):
    src, cfg, state = unsorted_eagle(tmp_path, peagle=True)
    out = export_draft(src, tmp_path / "out", to="vllm")
    served_cfg = json.loads((out / "config.json").read_text())
    assert served_cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ASCENDING
    trained, served = load_peagle(cfg, dict(state)), load_peagle(served_cfg, read_weights(out))
    torch.testing.assert_close(served.combine(served.mask_hidden), trained.combine(trained.mask_hidden))
    torch.testing.assert_close(served.combine(states(ASCENDING)), trained.combine(states(LISTED)))


def test_served_dflash_fc_reads_the_ascending_states(tmp_path):
    cfg = sc.dflash_config(target_layer_ids=[3, 0, 2])  # engine ids [4, 1, 3]
    state = sc.dflash_state()
    state["fc.weight"] = torch.randn(sc.H, 3 * sc.HT, generator=torch.Generator().manual_seed(2))
    src = sc.write(tmp_path / "dflash", cfg, state)
    p = prepare_vllm(resolve_draft(src))  # unprefixed: used to be served as it is
    assert p.action == "export" and p.fixups[0].startswith("dflash_config.target_layer_ids [3, 0, 2] -> [0, 2, 3]")
    out = src / "vllm_export"
    assert json.loads((out / "config.json").read_text())["dflash_config"]["target_layer_ids"] == [0, 2, 3]
    fc = load_file(str(out / "model.safetensors"))["fc.weight"]
    torch.testing.assert_close(states(ASCENDING).flatten(-2) @ fc.T, states(LISTED).flatten(-2) @ state["fc.weight"].T)


def test_input_norm_blocks_move_with_fc():
    """norm_before_fc's input_norm is one RMSNorm over the n*Ht concatenation: its weight's blocks move
    with fc's (the mean square is order-free), so the served (norm, fc) pair gives the trained result."""
    g = torch.Generator().manual_seed(3)
    w, fc = 0.5 + torch.rand(3 * sc.HT, generator=g), torch.randn(sc.H, 3 * sc.HT, generator=g)

    def run(x, w, fc):
        x = x.flatten(-2)
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w) @ fc.T

    order = [LISTED.index(i) for i in ASCENDING]
    new = reorder_aux_blocks({"model.input_norm.weight": w, "model.fc.weight": fc}, order)
    torch.testing.assert_close(run(states(ASCENDING), new["model.input_norm.weight"], new["model.fc.weight"]),
                               run(states(LISTED), w, fc))


def test_export_cli_sglang_copy_and_doctor_agree(tmp_path, capsys):
    src, cfg, state = unsorted_eagle(tmp_path)
    cfg_plain = {**cfg, "fc_norm": False}  # SGLang has no fc_norm: the same draft without it
    (src / "config.json").write_text(json.dumps(cfg_plain))
    assert main(["export", str(src), str(tmp_path / "v"), "--to", "vllm"]) == 0
    err = capsys.readouterr().err
    assert f"draftsmith: fixup: {KEY} [4, 1, 3] -> [1, 3, 4] in the served copy" in err and err.count("fixup:") == 1
    assert main(["export", str(src), str(tmp_path / "s"), "--to", "sglang"]) == 0
    capsys.readouterr()
    sg = json.loads((tmp_path / "s" / "config.json").read_text())
    assert sg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 3]  # SGLang ids: engine id - 1
    assert sg["draftsmith"]["vllm_aux_layer_ids"] == ASCENDING
    for d in ("v", "s"):
        fc = read_weights(tmp_path / d)["fc.weight"]
        torch.testing.assert_close(states(ASCENDING).flatten(-2) @ fc.T,
                                   states(LISTED).flatten(-2) @ state["model.fc.weight"].T)
    problems, notes = diagnose(resolve_draft(src))
    assert not problems and any(n.startswith(f"fixup: {KEY} [4, 1, 3] -> [1, 3, 4]") for n in notes), (problems, notes)


def test_ascending_and_repeated_ids_are_not_fixed_up(tmp_path):
    draft = resolve_draft(sc.make("eagle3", tmp_path))  # [1, 3, 4]: as trained today
    assert servable_config(draft)[1] == []
    cfg = sc.eagle_config()
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [3, 1, 3]  # doctor names repeats; no order fixes them
    rep = resolve_draft(sc.write(tmp_path / "rep", cfg, sc.eagle_state(prefix="")))
    assert servable_config(rep)[1] == []
    problems, _ = diagnose(rep, target=str(sc.make_target(tmp_path / "t")))
    assert any("repeats a layer" in p for p in problems), problems


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny EAGLE-3 trained on ascending ids [1, 3, 4], and the same draft as the trainer used to write
    it for target.aux_layer_ids [4, 1, 3] (fixtures.unsort_aux_ids)."""
    import shutil

    from draftsmith.config import build_config
    from draftsmith.train.loop import train
    from fixtures import make_tiny_llama, make_tokenizer, unsort_aux_ids, write_chats, write_jsonl

    root = tmp_path_factory.mktemp("aux_trained")
    target = make_tiny_llama(root / "target", make_tokenizer("chatml"), num_layers=6, hidden=64)
    cfg = build_config({
        "target": {"path": str(target), "aux_layer_ids": ASCENDING},
        "data": {"sources": [str(write_chats(root / "chats.jsonl", 10))], "max_length": 48, "eval_size": 2,
                 "draft_vocab_size": 64},
        "draft": {"ttt_steps": 2, "fc_norm": True},
        "train": {"max_steps": 3, "batch_size": 2, "lr": 3e-3},
        "output": {"dir": str(root / "run"), "tensorboard": False},
    })
    ckpt = train(cfg, progress=False).checkpoint
    old = unsort_aux_ids(shutil.copytree(ckpt, root / "old" / ckpt.name), LISTED)
    prompts = write_jsonl(root / "prompts.jsonl", [{"id": f"p{i}", "category": "chat", "turns": [q]} for i, q in
                                                   enumerate(["Tell me about the cat and the sea.", "Tell me about the fox."])])
    return target, ckpt, old, prompts


@pytest.mark.slow
def test_an_unsorted_trained_checkpoint_serves_the_ascending_draft_and_evals_alike(trained, tmp_path):
    from draftsmith.eval.offline import run_eval

    target, ckpt, old, prompts = trained
    out = export_draft(old, tmp_path / "served", to="vllm")
    assert json.loads((out / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ASCENDING
    want = load_file(str(ckpt / "model" / "consolidated" / "model.safetensors"))
    got = load_file(str(out / "model.safetensors"))
    assert sorted(got) == sorted(k.removeprefix("model.") for k in want)
    for k, v in want.items():  # the served copy IS the draft trained on ascending ids, bit for bit
        assert torch.equal(got[k.removeprefix("model.")], v), k
    # eval reads the ids config.json lists, in that order: the unsorted source, its served copy and the
    # ascending original decode alike
    runs = [run_eval(target=str(target), draft=str(d), prompts=str(prompts), k=2, max_new_tokens=12, plain=False,
                     ignore_eos=True, progress=False) for d in (ckpt, old, out)]
    assert [r["config"]["aux_layer_ids"] for r in runs] == [ASCENDING, LISTED, ASCENDING]
    first = [(r["token_ids"], r["accepted"]) for r in runs[0]["records"]]
    assert all([(r["token_ids"], r["accepted"]) for r in run["records"]] == first for run in runs[1:])
