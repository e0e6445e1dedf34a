"""Side by side with SpecForge 0.2.0's EAGLE-3 trainer: the same rows and features, the same wall time, the same vLLM.

    .venv/bin/python bench/peer_specforge.py [--wall-s 1200] [-k 1 3] [--prompts 8] [--max-tokens 96]
        [--prompt-sets mt_bench mixed] [--skip-install] [--reuse] [--out runs/bench/peer_specforge.json]

The third peer bench, with bench/peer_modelopt.py's phases and bench/peer_speculators.py's table (its
helpers are imported from there: the venv builder, our side's split and training, the conversion's reuse
key and row reader, the launcher run, the servers, the report). SpecForge is the SGLang project's
trainer; it has no CPU path, so this file also records what running it on a CPU takes (first measured
2026-12-05 with 2 steps on 4 rows, SpecForge 0.2.0 from PyPI, torch 2.13.0+cpu). Phases, in order
(each timed; the times land in the JSON's ``phases_s``):

1. **SpecForge's venv** (``--venv``, default ``<user cache>/draftsmith/peer/specforge-0.2.0-venv``,
   reused once complete). Its metadata pins ``torch==2.11.0`` and ``sglang==0.5.14``: with torch 2.13.0
   as the constraint pip reports ResolutionImpossible ("specforge 0.2.0 depends on torch==2.11.0"). So:
   torch first, ``specforge==0.2.0 --no-deps``, then its light requirements (``DEPS``: transformers
   5.8.1, datasets, accelerate, ...) plus ``triton`` (``specforge/core/loss.py:10`` imports it at module
   level; the PyPI wheel imports on a CPU). sglang (online capture only), yunchang (sequence parallel
   only), wandb and flash-attn are not needed offline.
2. **The split** and 3. **our draft**: bench/peer_speculators.py's steps 2 and 3 (``our_split_and_train``).
4. **Conversion** into SpecForge's offline ``specforge_hidden_states_v1`` layout (what its offline
   reader loads, ``data/preprocessing.py`` ``process_offline_eagle3_sample``): ``<data>/rows/
   data_<i>.ckpt`` per train row, in our order: ``input_ids`` (T,), ``loss_mask`` (T,),
   ``aux_hidden_state`` (1, T, 3 H) = the cached aux states [2, 15, 27] concatenated in layer order
   (SpecForge / SGLang number them [1, 14, 26]: the output of decoder layer i, the same states), and
   ``hidden_state`` (1, T, H) = the target's final RMSNorm applied to the cached pre-norm last state
   (its teacher is ``TargetHead`` = the target's lm_head alone on this state). Only the train rows: its
   ``eval_interval`` defaults to 0. The target: a folder of symlinks to SmolLM2 plus a
   ``model.safetensors.index.json`` (``modeling/target/target_head.py:70-75`` reads the lm_head through
   an index; a one-file checkpoint fails with "No index.json file found"), and ``model.lm_head_key:
   model.embed_tokens.weight`` (SmolLM2 ties its embeddings).
5. **SpecForge's draft**: ``specforge train`` (``specforge.cli.main``) in a subprocess with that venv's
   python, through a launcher this script writes next to the checkpoints. Its defaults (config/schema.py
   ``TrainingConfig``; ``algorithms/eagle3/providers.py``): one Llama layer shaped like the target's
   (its draft config is generated from the target's), ``ttt_length`` 7, AdamW (fp32 master weights)
   lr 1e-4, grad clip 0.5, cosine with 1.5% linear warmup to 0, batch 1 without packing, its own
   d2t/t2d from the loss-mask tokens of the offline rows, EAGLE-3 loss = soft cross-entropy against
   the target head's distribution over the draft vocab. What this comparison and this CPU need:

   - ``draft_vocab_size`` = ours (8,192; its default 32,000): the launcher writes the draft config its
     own generator makes for the target (``training/model_loading.py`` ``resolve_draft_config``) with
     that one field changed, and passes it as ``model.draft_model_config`` (the export reads it too);
   - ``training.fsdp_sharding: NO_SHARD``: the default SHARD_GRAD_OP fails at
     ``training/backend.py:281`` ("FSDP needs a non-CPU accelerator device"); NO_SHARD takes its DDP
     branch (``backend.py:233-251``) on gloo, which SpecForge picks for device "cpu";
   - ``training.attention_backend: sdpa`` (its default flex_attention compiles a kernel);
   - ``data.dataloader_num_workers: 0`` (its default 4 loader processes on 2 cores), ``max_length`` 2,048;
   - precision (``--peer-precision``, default ``match``): ours, i.e. float32 features, draft and head on
     a CPU without native bf16 (``model.torch_dtype: float32``); ``bf16`` keeps its bfloat16;
   - ``training.num_epochs: 50`` with ``--peer-schedule fit`` (its default 1 epoch would end before W).

   In-process patches in the launcher (installed files are never edited):

   - **the loss**, the first hard GPU dependency in code: EAGLE-3's KL loss is a Triton kernel
     (``algorithms/eagle3/model.py:74`` ``LogSoftmaxLoss.apply`` -> ``core/loss.py:185``: "RuntimeError:
     0 active drivers"); the launcher puts the same masked soft-target cross-entropy in torch in its
     place (-sum target * log_softmax(logits) per position, 0 where masked, mean over B x T). P-EAGLE
     uses the same kernel (``algorithms/peagle/model.py:181``), its DFlash loss does not;
   - **the head's precision** (float32 runs): ``TargetHead.from_pretrained`` casts the lm_head to bf16
     (``target_head.py:52-54``) and DDP has no mixed precision, so float32 features would meet a bf16
     head ("expected m1 and m2 to have the same dtype"); the launcher casts it back to float32;
   - **the wall budget**: its trainer stops only at ``max_steps`` or the last epoch. The clock starts when
     ``TrainerController.fit`` starts (after assembly: model, data, vocab map, optimizer) and counts
     everything up to the optimizer step that crosses W seconds (data loading and its logging
     included); after that step the launcher sets the controller's ``max_steps`` to it, so its own loop
     returns there and its own ``Trainer.fit`` saves that state (``training_state.pt``);
   - **the LR schedule** (``--peer-schedule``): ``fit`` (default) keeps its shape (linear warmup over the
     first ``warmup_ratio`` = 1.5%, cosine to 0) but over W seconds instead of its steps, as the other
     peers' benches do; ``default`` leaves its schedule over 1 epoch (``--peer-epochs``) untouched.

   Then, in the same process, **its export**: ``specforge export --to hf`` (``export/to_hf.py``) of that
   state with the draft config and the target as ``--embedding-source``: ``config.json``
   (``LlamaForCausalLMEagle3``, ``draft_vocab_size``) and ``model.safetensors`` (``midlayer.*``, ``fc``,
   ``norm``, ``lm_head``, ``d2t``, ``t2d``, ``embed_tokens``). ``--to sglang`` (``export/to_sglang.py``) is
   its serving export; it is not used because it saves ``model.state_dict()`` of the draft that
   ``export/checkpoint_io.py:161`` builds in bfloat16 (``materialize_draft``), i.e. every trained weight
   rounded to bf16, while ``to_hf.py:115`` lays the trained float32 state over it.
6. **What vLLM serves**: vLLM 0.32 reads SpecForge's EAGLE-3 naming itself (``midlayer.`` ->
   ``layers.0.``: ``vllm/model_executor/models/llama_eagle3.py:291``; ``d2t`` as offsets, ``t2d`` skipped:
   ``:426-429``), so the weights are not renamed, and for SmolLM2 the export serves as it is (checked
   2026-12-06: the raw export and ``vllm_draft/`` of the same 53-step draft served with the same real
   tau, 1.189 / 1.170 at K=1 on MT-Bench / mixed). ``vllm_draft`` writes ``<run>/vllm_draft/`` with two
   changes that keep it right for other targets, both printed and kept in the JSON:

   - ``embed_tokens.weight`` dropped: ``to_hf.py:101`` loads the target's embedding into that bf16
     draft, so the export carries it rounded to bf16. SmolLM2 stores its weights in bf16, so here the
     copy is bit-equal and vLLM shares the target's anyway; for a target stored in float32 or float16
     vLLM would keep the rounded copy (``vllm/v1/spec_decode/llm_base_proposer.py:1446-1466``), and the
     draft would embed with weights it never trained with (SpecForge trains with the target's own).
     Without the key vLLM always shares the target's (``llama_eagle3.py:461``,
     ``llm_base_proposer.py:1438``);
   - ``eagle_config.eagle_aux_hidden_state_layer_ids = [2, 15, 27]`` (the cache's ids, vLLM's numbering:
     the input of layer i) added: SpecForge's export names no layers and vLLM then falls back to its
     model default ``(2, N // 2, N - 3)`` (``vllm/model_executor/models/interfaces.py:1733``), the same
     layers here only because the bench trains on that default (SpecForge's own default for a
     target is [1, N // 2 - 1, N - 4] in its numbering, the same states:
     ``algorithms/model_providers.py:203-204``); written out, the draft reads what it trained on
     whatever the ids (``vllm/v1/worker/gpu_model_runner.py:5280``). A draft config that carries
     ``eagle_config.eagle_aux_hidden_state_layer_ids`` itself is read by SpecForge in its numbering
     (``model_providers.py:195-200``) and would reach vLLM one layer early; the key is overwritten.

   One semantic check, no change: SpecForge feeds the pre-norm state to the next TTT step and applies
   ``norm`` only for logits (``algorithms/eagle3/model.py:386-400``; ``llama3_eagle.py:1690``: its
   ``norm_output`` defaults to True and means "norm before lm_head"), which is vLLM's default
   ``norm_output`` false (``llama_eagle3.py:252,286``: its flag means "feed the post-norm state back");
   an export with ``norm_output: false`` (logits without the norm) is refused, vLLM cannot serve it.
7. **Serving**: bench/peer_speculators.py's step 6 with ``vllm_draft/`` in the peer's slot
   (``{"method": "eagle3", "model": DIR, "num_speculative_tokens": K}``): no speculation, ngram K=3, ours
   and SpecForge's at each K, one vLLM server each; tokens/s, real tau from /metrics, tokens compared
   with no speculation.

Writes ``--out`` (JSON) and prints the markdown table (per prompt set and configuration tokens/s,
speedup, real tau, acceptance per position, same tokens as no speculation), each side's steps, tokens
seen and seconds, and whether our real tau >= SpecForge's at each K. ``--reuse`` keeps checkpoints (and
the converted data) of an earlier run with the same settings. Everything lands in a folder named after
``--out`` (default ``runs/bench/peer_specforge/``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_errors import run  # noqa: E402
from peer_speculators import (  # noqa: E402  (bench/ on sys.path: the shared peer-bench helpers)
    DATA_MARK,
    DROP,
    MAX_MODEL_LEN,
    PEER_LAYER_IDS,
    cached_rows,
    conversion_key,
    ensure_venv,
    finish_report,
    our_split_and_train,
    prompt_sets,
    reused,
    run_launcher,
    serve_all,
    side_by_side_args,
    start_bench,
    timed,
)

SPECFORGE = "specforge==0.2.0"
# its requirements minus torch (pinned 2.11.0), sglang (online capture), yunchang (sequence parallel), wandb (a
# tracker); plus triton, which specforge/core/loss.py imports at module level
DEPS = ("transformers==5.8.1", "datasets", "tqdm", "accelerate", "huggingface-hub", "numpy", "pydantic", "psutil",
        "pyyaml", "safetensors", "requests", "tensorboard", "typing-extensions", "triton")
MODULES = ("specforge.cli", "specforge.export", "triton")
ARCH = "LlamaForCausalLMEagle3"  # SpecForge's EAGLE-3 draft; vLLM maps it to Eagle3LlamaForCausalLM
TRAIN_LEN = 2048
PEER = "specforge"
SERVED = ("ngram", "draftsmith", PEER)


# ---------------------------------------------------------------------------------------------- conversion
def final_norm(target: Path):
    """(the target's final RMSNorm weight as float32, its eps) from a one-file Llama checkpoint."""
    from safetensors import safe_open

    eps = json.loads((target / "config.json").read_text())["rms_norm_eps"]
    with safe_open(str(target / "model.safetensors"), "pt") as f:
        return f.get_tensor("model.norm.weight").float(), float(eps)


def specforge_sample(row: dict, norm_weight, eps: float) -> dict:
    """One cached row -> SpecForge's offline ``.ckpt`` content: ``input_ids`` / ``loss_mask`` (T,) int64,
    ``aux_hidden_state`` (1, T, n H) = the n aux states concatenated in layer order, ``hidden_state``
    (1, T, H) = RMSNorm(last) * norm_weight (its teacher is the lm_head alone), in the cache's dtype."""
    import torch

    aux, last = row["aux"], row["last"]
    if aux.dim() != 3 or last.dim() != 2 or aux.shape[0] != last.shape[0] or aux.shape[2] != last.shape[1]:
        raise ValueError(f"cached row: aux {tuple(aux.shape)} and last {tuple(last.shape)} do not line up "
                         "as (T, n, H) and (T, H)")
    x = last.float()
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()
    t, n, h = aux.shape
    return {"input_ids": row["input_ids"].to(torch.int64).contiguous(),
            "loss_mask": row["loss_mask"].to(torch.int64).contiguous(),
            "aux_hidden_state": aux.reshape(1, t, n * h).contiguous(),
            "hidden_state": normed.to(last.dtype).unsqueeze(0).contiguous()}


def convert(cache_dir: Path, train: Sequence[Any], out: Path, target: Path, *, reuse: bool = True) -> dict:
    """Write ``train`` (draftsmith Examples of the cache's rows) as SpecForge offline rows under
    ``out``/rows (module docstring, step 4). Reused when ``out`` holds the same rows of the same cache.
    Returns the manifest (rows, tokens, ...)."""
    import torch

    want, cache_manifest = conversion_key(cache_dir, train, train_rows=len(train), format="specforge_hidden_states_v1")
    have = reused(out, want, reuse)
    if have is not None:
        return have
    norm_weight, eps = final_norm(target)
    rows = out / "rows"
    rows.mkdir(parents=True)
    tokens = 0
    for i, ex, row in cached_rows(cache_dir, train, "peer_specforge"):
        torch.save(specforge_sample(row, norm_weight, eps), rows / f"data_{i:06d}.ckpt")
        tokens += len(ex.input_ids)
    manifest = {**want, "tokens": tokens,
                "hidden_states": "aux layers " + str(cache_manifest["aux_layer_ids"]) + " (concatenated) + the "
                                 "target's final norm of the last pre-norm state, " + cache_manifest["dtype"]}
    (out / DATA_MARK).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def indexed_target(target: Path, out: Path) -> Path:
    """A folder of symlinks to ``target`` plus the ``model.safetensors.index.json`` its TargetHead reads."""
    from safetensors import safe_open

    out.mkdir(parents=True, exist_ok=True)
    for f in target.iterdir():
        link = out / f.name
        if not link.exists():
            link.symlink_to(f.resolve())
    index = out / "model.safetensors.index.json"
    if not index.exists():
        weight_map = {}
        for shard in sorted(target.glob("*.safetensors")):
            with safe_open(str(shard), "pt") as f:
                weight_map.update({k: shard.name for k in f.keys()})
        index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}) + "\n")
    return out


def vllm_draft(export: Path, out: Path, aux_layer_ids: Sequence[int]) -> dict:
    """SpecForge's ``--to hf`` export -> the directory vLLM serves as EAGLE-3 (module docstring, step 6):
    ``embed_tokens.weight`` dropped, ``eagle_config.eagle_aux_hidden_state_layer_ids`` written in vLLM's
    numbering; every other tensor and key as exported. Returns what changed."""
    from safetensors.torch import load_file, save_file

    cfg = json.loads((export / "config.json").read_text())
    if cfg.get("architectures") != [ARCH]:
        raise ValueError(f"{export}: architectures {cfg.get('architectures')}, expected [{ARCH!r}]")
    if cfg.get("norm_output", True) is not True:
        raise ValueError(f"{export}: norm_output {cfg['norm_output']!r}: SpecForge's draft then takes logits without its "
                         "final norm, and vLLM's EAGLE-3 always normalises before lm_head")
    files = sorted(export.glob("*.safetensors"))
    if [f.name for f in files] != ["model.safetensors"]:
        raise ValueError(f"{export}: expected one model.safetensors, found {[f.name for f in files]}")
    weights = load_file(str(files[0]))
    if not any(k.startswith("midlayer.") for k in weights) or "d2t" not in weights:
        raise ValueError(f"{export}: no midlayer.* / d2t tensors: not SpecForge's EAGLE-3 naming")
    dropped = sorted(k for k in weights if "embed_tokens" in k)
    for k in dropped:
        del weights[k]
    cfg.pop("norm_output", None)  # True in SpecForge's sense = vLLM's default false (module docstring)
    cfg["eagle_config"] = {**(cfg.get("eagle_config") or {}), "eagle_aux_hidden_state_layer_ids": list(aux_layer_ids)}
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return {"dropped": dropped, "eagle_aux_hidden_state_layer_ids": list(aux_layer_ids),
            "tensors": len(weights), "dtypes": sorted({str(v.dtype).removeprefix("torch.") for v in weights.values()})}


# ---------------------------------------------------------------------------------------------- the launcher
LAUNCHER = r'''"""SpecForge 0.2.0's `specforge train` + `specforge export --to hf` on the CPU under a wall budget; written
by draftsmith's bench/peer_specforge.py.

    python launcher.py SUMMARY.json WALL_S fit|default DRAFT_VOCAB float32|bfloat16 RUN.yaml EXPORT_DIR TARGET

Patches, in this process only (no installed file is edited): EAGLE-3's Triton loss kernel -> the same loss in
torch; in a float32 run the frozen target head stays float32 (TargetHead.from_pretrained casts it to bf16);
the controller stops after the optimizer step at which WALL_S seconds have passed since fit() began; with
"fit" its warmup + cosine LR runs over WALL_S instead of its steps.
"""
import json
import math
import sys
import time

import torch


class TorchLogSoftmaxLoss:
    """core/loss.py LogSoftmaxLoss without Triton: per (b, t) -sum_v target * log_softmax(logits) where
    position_mask, else 0; the mean over the B x T rows (its kernel's forward; autograd gives the backward)."""

    @staticmethod
    def apply(logits, target, position_mask):
        row = -(target.float() * torch.log_softmax(logits.float(), dim=-1)).sum(-1)
        keep = position_mask.reshape(row.shape).bool()
        return torch.where(keep, row, torch.zeros_like(row)).mean()


def main():
    summary_path, wall_s, schedule = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    draft_vocab, dtype, run_yaml, export_dir, target = int(sys.argv[4]), sys.argv[5], sys.argv[6], sys.argv[7], sys.argv[8]
    t0 = time.perf_counter()

    import specforge.algorithms.eagle3.model as eagle3_model
    import specforge.modeling.target.target_head as target_head
    import specforge.optimizer as sf_optimizer
    import specforge.training.controller as controller_mod
    from specforge.application import resolve_run
    from specforge.cli import main as specforge_main
    from specforge.config.schema import load_config
    from specforge.training.model_loading import resolve_draft_config

    eagle3_model.LogSoftmaxLoss = TorchLogSoftmaxLoss
    if dtype == "float32":
        head_from_pretrained = target_head.TargetHead.from_pretrained.__func__
        target_head.TargetHead.from_pretrained = classmethod(lambda cls, *a, **k: head_from_pretrained(cls, *a, **k).float())

    # the draft config its own generator makes for this target, with our draft vocab size
    resolved = resolve_run(load_config(run_yaml, []))
    draft = resolve_draft_config(resolved.config, provider=resolved.algorithm.providers.model.draft_config)
    draft.draft_vocab_size = draft_vocab
    draft_path = str(run_yaml).rsplit("/", 1)[0] + "/draft_config.json"
    draft.to_json_file(draft_path)
    training = resolved.config.training
    assert schedule == "default" or training.lr_scheduler == "cosine", training.lr_scheduler

    stats = {"wall_s": wall_s, "schedule": schedule, "steps": 0, "tokens": 0, "loss_tokens": 0, "train_s": 0.0,
             "stopped_by": "epochs", "draft_config": draft_path,
             "recipe": {k: v for k, v in training.model_dump().items() if not isinstance(v, (dict, list))}}
    clock = {"since": None, "controller": None}

    def elapsed():
        return 0.0 if clock["since"] is None else time.perf_counter() - clock["since"]

    def fitted():  # its CosineAnnealingWarmupLR's shape over WALL_S seconds
        warm, el = training.warmup_ratio * wall_s, elapsed()
        if el < warm:
            return el / warm
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (el - warm) / max(wall_s - warm, 1e-9))))

    Controller, Core = controller_mod.TrainerController, controller_mod.TrainerCore
    controller_fit, core_step = Controller.fit, Core.train_step

    def fit(self, data):
        clock["controller"], clock["since"] = self, time.perf_counter()
        stats["setup_s"] = round(clock["since"] - t0, 1)  # imports, its assembly: model, data, vocab map, optimizer
        return controller_fit(self, data)

    def train_step(self, batch, ctx=None):
        result = core_step(self, batch, ctx)
        stats["tokens"] += int(batch.tensors["attention_mask"].sum())
        stats["loss_tokens"] += int(batch.tensors["loss_mask"].sum())
        if result.optimizer_stepped:
            stats["steps"] += 1
            stats["train_s"] = round(elapsed(), 1)
            stats["last_metrics"] = {k: round(float(v), 4) for k, v in (result.metrics or {}).items()
                                     if isinstance(v, (int, float)) or getattr(v, "numel", lambda: 0)() == 1}
            if elapsed() >= wall_s and stats["stopped_by"] != "wall_s":
                stats["stopped_by"] = "wall_s"
                c = clock["controller"]
                c.max_steps = c.global_step + 1  # it counts this step after train_step returns, then stops
        return result

    Controller.fit, Core.train_step = fit, train_step
    if schedule == "fit":
        Optimizer = sf_optimizer.BF16Optimizer
        optimizer_init, optimizer_step = Optimizer.__init__, Optimizer.step

        def set_lr(opt):
            for group, base in zip(opt.optimizer.param_groups, opt.scheduler.base_lrs):
                group["lr"] = base * fitted()

        def init(self, *a, **k):
            optimizer_init(self, *a, **k)
            set_lr(self)

        def step(self):
            norm = optimizer_step(self)  # its scheduler steps inside; the LR for the next step is set here
            set_lr(self)
            return norm

        Optimizer.__init__, Optimizer.step = init, step
    rc = specforge_main(["train", "-c", run_yaml, f"model.draft_model_config={draft_path}"])
    if rc:
        raise SystemExit(f"specforge train exited with {rc}")
    print(f"peer: {stats['steps']} steps in {stats['train_s']:.0f} s (stopped by {stats['stopped_by']}), "
          f"{stats['tokens']} tokens, last {json.dumps(stats.get('last_metrics'))}", flush=True)
    t = time.perf_counter()
    rc = specforge_main(["export", "--to", "hf", "--checkpoint", resolved.config.output_dir, "--draft-config",
                         draft_path, "--output-dir", export_dir, "--embedding-source", target])
    if rc:
        raise SystemExit(f"specforge export exited with {rc}")
    stats.update(export_s=round(time.perf_counter() - t, 1), export=export_dir,
                 process_s=round(time.perf_counter() - t0, 1))
    with open(summary_path, "w") as f:
        json.dump(stats, f, indent=2, default=str)


if __name__ == "__main__":
    main()
'''


def run_config(target: Path, data_dir: Path, run_dir: Path, args: argparse.Namespace) -> dict:
    """SpecForge's run config: its defaults plus the data, the CPU and the comparison settings (step 5)."""
    return {
        "model": {"target_model_path": str(target), "lm_head_key": "model.embed_tokens.weight",
                  "torch_dtype": "bfloat16" if args.peer_bf16 else "float32",
                  "aux_hidden_state_layer_ids": [i - 1 for i in PEER_LAYER_IDS]},  # its numbering: output of layer i
        "data": {"hidden_states_path": str(data_dir / "rows"), "max_length": TRAIN_LEN, "dataloader_num_workers": 0,
                 "cache_dir": str(run_dir / "cache")},
        "training": {"strategy": "eagle3", "fsdp_sharding": "NO_SHARD", "attention_backend": "sdpa",
                     "num_epochs": 50 if args.peer_schedule == "fit" else args.peer_epochs, "log_interval": 10,
                     **({"ttt_length": args.peer_ttt_length} if args.peer_ttt_length else {}),
                     **({"learning_rate": args.peer_lr} if args.peer_lr else {})},
        "output_dir": str(run_dir / "out"),
    }


def train_peer(py: Path, target: Path, data: dict, data_dir: Path, run_dir: Path, args: argparse.Namespace) -> dict:
    """Run SpecForge's trainer and export (the launcher) for args.wall_s seconds of training, then convert the
    export for vLLM; its summary dict (``checkpoint``: the directory vLLM serves)."""
    import yaml

    summary = run_dir / "train_summary.json"
    config = run_config(indexed_target(target, run_dir.parent / "specforge_target"), data_dir, run_dir, args)
    settings = {"wall_s": args.wall_s, "schedule": args.peer_schedule, "draft_vocab_size": args.draft_vocab_size,
                "config": config, "data": data["rows_sha256"]}
    if args.reuse and summary.is_file():
        have = json.loads(summary.read_text())
        if have.get("settings") == settings and (Path(have.get("checkpoint", "")) / "config.json").is_file():
            print(f"specforge: reusing {have['checkpoint']} (--reuse)", flush=True)
            return have
    config_text = yaml.safe_dump(config, sort_keys=False)
    rest = [args.peer_schedule, str(args.draft_vocab_size), config["model"]["torch_dtype"], str(run_dir / "run.yaml"),
            str(run_dir / "export"), str(target)]
    out = run_launcher("SpecForge", py, LAUNCHER, run_dir, summary, args.wall_s, rest, settings,
                       env={"WANDB_DISABLED": "true"}, files={"run.yaml": config_text})
    out["vllm_conversion"] = vllm_draft(Path(out["export"]), run_dir / "vllm_draft", PEER_LAYER_IDS)
    out["checkpoint"] = str(run_dir / "vllm_draft")
    summary.write_text(json.dumps(out, indent=2, default=str) + "\n")
    conv = out["vllm_conversion"]
    print(f"specforge: export {out['export']} -> {out['checkpoint']} for vLLM: dropped {conv['dropped']}, "
          f"eagle_aux_hidden_state_layer_ids {conv['eagle_aux_hidden_state_layer_ids']}", flush=True)
    return out


# ---------------------------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    side_by_side_args(ap, SERVED, "specforge-0.2.0-venv", k_default=[1, 3], k_help="K for both drafts (default 1 3)")
    ap.add_argument("--peer-schedule", choices=["fit", "default"], default="fit",
                    help="SpecForge's LR schedule: fit (its warmup + cosine over --wall-s) or default (over its steps "
                         "of --peer-epochs epochs)")
    ap.add_argument("--peer-epochs", type=int, default=1, help="--peer-schedule default: its num_epochs (default 1)")
    ap.add_argument("--peer-precision", choices=["match", "bf16"], default="match",
                    help="SpecForge's precision: match (ours: float32 where our side trains in float32) or bf16 (its "
                         "default torch_dtype, emulated ~30x slower on a CPU without native bf16)")
    ap.add_argument("--peer-ttt-length", type=int, default=None, help="its training.ttt_length (default: its own, 7)")
    ap.add_argument("--peer-lr", type=float, default=None, help="its training.learning_rate (default: its own, 1e-4)")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench" / "peer_specforge.json"))
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from draftsmith.models import resolve_target
    from draftsmith.train.demo import prepare_data

    out_path, work = start_bench(ap, args)  # runs/bench/peer_specforge/: checkpoints, data, logs
    phases: dict[str, float] = {}
    with timed(phases, "total"):
        with timed(phases, "install"):
            py, _ = ensure_venv(Path(args.venv), args.skip_install, package=SPECFORGE, modules=MODULES,
                                who="peer_specforge", deps=DEPS, drop=tuple(d for d in DROP if d != "triton"))
        with timed(phases, "demo_data"):
            regen_dir, cache_dir, _ = prepare_data(progress=False)
            target = Path(resolve_target("smollm2"))
        with timed(phases, "train_draftsmith"):
            train_rows, held_rows, ours = our_split_and_train(work / "draftsmith", regen_dir, cache_dir, args)
        print(f"draftsmith: {ours['steps']} steps, {ours['tokens']} tokens in {ours['train_s']:.0f} s "
              f"({len(train_rows)} train / {len(held_rows)} held-out rows)", flush=True)
        args.peer_bf16 = args.peer_precision == "bf16" or bool(ours["settings"]["config"]["train"].get("bf16"))
        with timed(phases, "convert"):
            data = convert(Path(cache_dir), train_rows, work / "specforge_data", target, reuse=args.reuse)
        print(f"converted {data['train_rows']} train rows ({data['tokens']} tokens) into {work / 'specforge_data'} "
              f"in {phases['convert']:.0f} s", flush=True)
        with timed(phases, "train_specforge"):
            peer = train_peer(py, target, data, work / "specforge_data", work / "specforge", args)
        print(f"specforge: {peer['steps']} steps, {peer['tokens']} tokens in {peer['train_s']:.0f} s (stopped by "
              f"{peer['stopped_by']}; export {peer.get('export_s', 0):.0f} s; process {peer.get('process_s', 0):.0f} s)",
              flush=True)
        sets = prompt_sets(str(target), args, work)
        print(f"serving: target {target}, {args.prompts} prompts per set, {args.max_tokens} tokens, batch 1, "
              f"{args.dtype}, max_model_len {MAX_MODEL_LEN}", flush=True)
        with timed(phases, "serve"):
            results = serve_all(str(target), Path(ours["checkpoint"]), Path(peer["checkpoint"]), sets, args.k,
                                args.max_tokens, work, args.dtype, args.serve, peer_label=PEER)
    ttt = peer.get("recipe", {}).get("ttt_length")
    lr = peer.get("recipe", {}).get("learning_rate")
    peer_side = f"SpecForge 0.2.0 (its defaults, ttt_length {ttt}, lr {lr}, {args.peer_schedule} LR)"
    finish_report(results, args, phases, out_path, report={"target": str(target), "data": data},
                  sides=((f"draftsmith ({args.recipe} recipe)", "draftsmith", ours), (peer_side, PEER, peer)),
                  peer_name="SpecForge's")
    print(f"\nJSON: {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
