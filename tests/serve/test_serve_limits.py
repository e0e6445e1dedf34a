"""Issue 24's serve/doctor rules: K past what a draft drafts is refused (P-EAGLE num_depths, DFlash
block_size - 1) and past its trained depth warned about (EAGLE-3 ttt_steps); a serving context longer
than the training max_length is warned about; DFlash 2 configs are recognised by their keys and refused by
name; DFlash is served on SGLang where the installed SGLang has DFLASH, refused with the reason otherwise."""

import json
import shlex

import pytest

import serve_ckpts as sc
from draftsmith.drafts import get_family
from draftsmith.serve.cli import main
from draftsmith.serve.sglang_algorithm import sglang_supports


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def with_run_config(ckpt, max_length):
    """The checkpoint's config.yaml snapshot, as the trainer writes it (data.max_length)."""
    (ckpt / "config.yaml").write_text(f"data:\n  max_length: {max_length}\ndraft:\n  type: eagle3\n")
    return ckpt


@pytest.mark.parametrize("kind,k,bound", [("peagle", 5, 4), ("dflash", 4, 3)])
def test_k_past_what_the_draft_drafts_is_one_line_exit_2(tmp_path, capsys, kind, k, bound):
    draft = sc.make(kind, tmp_path)
    code, out, err = run(capsys, "serve", "vllm", "--target", "/t", "--draft", str(draft),
                         "--num-speculative-tokens", str(k), "--print-only")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and f"at most {bound} tokens" in lines[0] and out == ""
    code, out, _ = run(capsys, "serve", "vllm", "--target", "/t", "--draft", str(draft),
                       "--num-speculative-tokens", str(bound), "--print-only")
    assert code == 0 and f'"num_speculative_tokens": {bound}' in out


def test_k_past_the_ttt_depth_is_served_with_a_warning(tmp_path, capsys):
    draft = sc.make("eagle3", tmp_path)
    cfg_path = draft / "model" / "consolidated" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["draftsmith"] = {"draft_type": "eagle3", "ttt_steps": 3}
    cfg_path.write_text(json.dumps(cfg))
    code, out, err = run(capsys, "serve", "vllm", "--target", "/t", "--draft", str(draft),
                         "--num-speculative-tokens", "5", "--print-only")
    assert code == 0 and "K=5 is above the 3 tokens" in err
    code, _, err = run(capsys, "serve", "vllm", "--target", "/t", "--draft", str(draft),
                       "--num-speculative-tokens", "3", "--print-only")
    assert code == 0 and "is above the" not in err


def test_serving_context_longer_than_training_is_warned(tmp_path, capsys):
    draft = with_run_config(sc.make("eagle3", tmp_path), 256)
    target = sc.make_target(tmp_path / "target", max_position_embeddings=2048)
    base = ["serve", "vllm", "--target", str(target), "--draft", str(draft), "--num-speculative-tokens", "3",
            "--print-only"]
    code, _, err = run(capsys, *base, "--max-model-len", "1024")
    assert code == 0 and "serving context 1024 tokens (--max-model-len 1024) exceeds the 256" in err
    code, _, err = run(capsys, *base)  # no --max-model-len: vLLM takes the target's 2048
    assert code == 0 and "the engine uses the target's 2048" in err
    code, _, err = run(capsys, *base, "--max-model-len", "256")
    assert code == 0 and "serving context" not in err
    # sglang: the same rule on --context-length
    code, _, err = run(capsys, "serve", "sglang", "--target", str(target), "--draft", str(draft), "--print-only",
                       "--context-length", "512")
    assert code == 0 and "(--context-length 512) exceeds the 256" in err


def test_doctor_checks_k_and_context(tmp_path, capsys):
    draft = with_run_config(sc.make("peagle", tmp_path), 256)
    code, out, err = run(capsys, "doctor", str(draft), "-k", "6", "--max-model-len", "1024")
    assert code == 1 and "-k 6: this P-EAGLE draft drafts at most 4 tokens" in out
    assert "trained on rows of at most 256 tokens" in err and "exceeds the 256" in err
    code, out, err = run(capsys, "doctor", str(draft), "-k", "4")
    assert code == 0 and "PROBLEM" not in out


def dflash2(tmp_path, **extra):
    cfg = sc.dflash_config(conv_kernel_size=2, conv_group_size=8, selector_rank=16, selector_top_k=8)
    cfg["architectures"] = ["Qwen3DFlash2DraftModel"]
    cfg.update(extra)
    return sc.write(tmp_path / "dflash2", cfg, sc.dflash_state())


def test_dflash2_is_recognised_by_its_keys_and_refused_by_name(tmp_path, capsys):
    draft = dflash2(tmp_path)
    fam = get_family("dflash")
    assert fam.refusal(json.loads((draft / "config.json").read_text()))  # by its keys...
    plain_arch = sc.dflash_config(selector_rank=16)  # ...even under the plain DFlash architecture
    assert "dflash_config.selector_rank" in fam.refusal(plain_arch) and fam.refusal(sc.dflash_config()) is None
    for argv in (["serve", "vllm", "--target", "/t", "--draft", str(draft), "--print-only"],
                 ["serve", "sglang", "--target", "/t", "--draft", str(draft), "--print-only"],
                 ["export", "--to", "vllm", str(draft), str(tmp_path / "out")]):
        code, out, err = run(capsys, *argv)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and "DFlash 2 draft" in lines[0], (argv, err)
        assert "Qwen3DFlash2DraftModel" in lines[0] and str(draft) in lines[0]
    assert not (tmp_path / "out").exists()
    code, out, _ = run(capsys, "doctor", str(draft))
    assert code == 1 and "DFlash 2 draft" in out


def test_dflash2_is_refused_by_the_offline_evaluator(tmp_path):
    from draftsmith.eval import EvalError
    from draftsmith.eval.offline import load_draft

    with pytest.raises(EvalError, match="DFlash 2 draft"):
        load_draft(dflash2(tmp_path))


def fake_sglang(tmp_path, monkeypatch, algorithms):
    """An installed-looking sglang package whose spec_info.py lists ``algorithms`` (nothing imports it)."""
    pkg = tmp_path / "site" / "sglang"
    (pkg / "srt" / "speculative").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "srt" / "speculative" / "spec_info.py").write_text(
        "class SpeculativeAlgorithm:\n" + "".join(f"    {a} = '{a}'\n" for a in algorithms))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))


def test_dflash_on_sglang_where_it_has_dflash(tmp_path, capsys, monkeypatch):
    fake_sglang(tmp_path, monkeypatch, ["EAGLE", "EAGLE3", "DFLASH"])
    assert sglang_supports("DFLASH") is True
    draft = sc.make("dflash", tmp_path)
    code, out, err = run(capsys, "serve", "sglang", "--target", "/t", "--draft", str(draft), "--print-only")
    argv = shlex.split(out.strip())
    assert code == 0, err
    assert argv[argv.index("--speculative-algorithm") + 1] == "DFLASH"
    assert argv[argv.index("--speculative-dflash-block-size") + 1] == "4"  # block_size 4 = K 3 + the anchor
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "4"
    code, _, err = run(capsys, "serve", "sglang", "--target", "/t", "--draft", str(draft), "--print-only",
                       "--num-steps", "4")
    assert code == 2 and "at most 3 tokens" in err


def test_dflash_on_an_sglang_without_dflash_is_refused_with_the_release(tmp_path, capsys, monkeypatch):
    fake_sglang(tmp_path, monkeypatch, ["EAGLE", "EAGLE3"])
    assert sglang_supports("DFLASH") is False
    code, out, err = run(capsys, "serve", "sglang", "--target", "/t", "--draft", str(sc.make("dflash", tmp_path)),
                         "--print-only")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "no DFLASH" in lines[0] and "v0.5.10" in lines[0] and out == ""
