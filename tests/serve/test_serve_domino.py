"""A TRAINED Domino checkpoint through `draftsmith serve` / `export`: refused with a pointer to what works.

No engine has a model for Domino's GRU correction head (vLLM 0.32's ``dflash`` method runs the plain
DFlash block only), so serving one would silently drop the head. The refusal must be exit 2 with ONE
line that names both ways forward: ``draftsmith eval --draft <the path given>`` (the exact offline
evaluator does run Domino, checked here so the pointer is honest) and ``dflash`` / ``jetspec`` for
vLLM. It must come before the vLLM install hint (a Domino draft needs no vLLM) and write nothing into
the checkpoint (no ``vllm_export/``, config.json untouched). No server is started: vLLM is not needed.
"""

import hashlib

import pytest

from draftsmith.cli import main
from draftsmith.config import build_config
from draftsmith.serve import vllm as vllm_mod
from draftsmith.train.loop import train
from fixtures import make_tiny_llama, make_tokenizer, write_chats, write_jsonl

MASK = 5  # <|start_header_id|>: never occurs in chatml text


@pytest.fixture(scope="module")
def domino(tmp_path_factory):
    """(target, run dir, checkpoint) of a Domino draft trained for two steps on a tiny Llama target."""
    root = tmp_path_factory.mktemp("domino")
    target = make_tiny_llama(root / "target", make_tokenizer("chatml"), num_layers=6, hidden=64)
    cfg = build_config({
        "target": {"path": str(target), "aux_layer_ids": [2, 4]},
        "data": {"sources": [str(write_chats(root / "chats.jsonl", 8))], "max_length": 48, "eval_size": 0},
        "draft": {"type": "domino", "mask_token_id": MASK, "block_size": 4, "num_draft_layers": 2,
                  "num_anchors": 8, "emb_dim": 16, "gru_hidden_dim": 16},
        "train": {"max_steps": 2, "batch_size": 2},
        "output": {"dir": str(root / "run"), "tensorboard": False},
    })
    return target, root / "run", train(cfg, progress=False).checkpoint


def tree_digest(root) -> str:
    """sha256 over every file's relative path and bytes under ``root``."""
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(root)).encode() + f.read_bytes())
    return h.hexdigest()


def refused(capsys, *argv) -> str:
    """Run `draftsmith ARGV`; assert exit 2, nothing on stdout, one error line; return that line."""
    code = main(list(argv))
    out = capsys.readouterr()
    assert code == 2 and out.out == "", (code, out)
    line = out.err.strip()
    assert line.startswith("draftsmith: error: ") and "\n" not in line, out.err
    return line


@pytest.mark.slow
def test_serve_vllm_refuses_a_trained_domino_with_a_pointer_to_eval_and_dflash(domino, capsys, monkeypatch):
    target, run_dir, ckpt = domino
    monkeypatch.setattr(vllm_mod, "launch", lambda *a, **k: pytest.fail("a Domino draft reached the vLLM launcher"))
    before = tree_digest(run_dir)
    for draft in (run_dir, ckpt, ckpt / "model" / "consolidated"):  # every path serve resolves
        line = refused(capsys, "serve", "vllm", "--target", str(target), "--draft", str(draft))
        assert "Domino" in line and f"`draftsmith eval --draft {draft} --prompts mt_bench`" in line, line
        assert "dflash or jetspec" in line and "draftsmith serve vllm" in line, line
    assert tree_digest(run_dir) == before  # nothing exported, no config fixed up


@pytest.mark.slow
def test_the_domino_refusal_comes_before_the_vllm_install_hint(domino, capsys, monkeypatch):
    target, run_dir, _ = domino
    real = vllm_mod.importlib.util.find_spec
    monkeypatch.setattr(vllm_mod.importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real(n, *a))
    line = refused(capsys, "serve", "vllm", "--target", str(target), "--draft", str(run_dir))
    assert "Domino" in line and "pip install" not in line, line


@pytest.mark.slow
def test_sglang_and_export_refuse_it_the_same_way(domino, capsys, tmp_path):
    target, run_dir, _ = domino
    for argv in (["serve", "sglang", "--target", str(target), "--draft", str(run_dir), "--print-only"],
                 ["export", "--to", "vllm", str(run_dir), str(tmp_path / "v")],
                 ["export", "--to", "sglang", str(run_dir), str(tmp_path / "s")]):
        line = refused(capsys, *argv)
        assert "Domino" in line and "draftsmith eval --draft" in line and "dflash or jetspec" in line, (argv, line)
    assert not (tmp_path / "v").exists() and not (tmp_path / "s").exists()


@pytest.mark.slow
def test_the_pointer_is_honest_draftsmith_eval_runs_the_domino_draft(domino, tmp_path):
    from draftsmith.eval.offline import run_eval

    target, run_dir, _ = domino
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "q0", "category": "chat", "turns": ["Tell me about the cat."]}])
    report = run_eval(target=str(target), draft=str(run_dir), prompts=str(prompts), max_new_tokens=4, plain=False,
                      ignore_eos=True, progress=False)
    assert report["overall"]["drafts"] >= 1 and len(report["records"][0]["token_ids"]) == 4
