"""Side by side with NVIDIA ModelOpt 0.47's EAGLE-3 trainer: the same rows and features, the same wall time, the same vLLM.

    .venv/bin/python bench/peer_modelopt.py [--wall-s 1200] [-k 1 3] [--prompts 8] [--max-tokens 96]
        [--prompt-sets mt_bench mixed] [--skip-install] [--reuse] [--out runs/bench/peer_modelopt.json]

The twin of bench/peer_speculators.py (same phases, same table; its helpers are imported from it: the
venv builder, our side's split and training, the servers, the table). What it does, in order (each
phase timed; the times land in the JSON's ``phases_s``):

1. **ModelOpt's venv** (``--venv``, default ``<user cache>/draftsmith/peer/modelopt-0.47.0-venv``,
   reused once complete): ``pip install torch==2.13.0`` first, then ``pip install -c constraints.txt
   nvidia-modelopt[hf]==0.47.0`` (the ``hf`` extra is what its EAGLE path imports: transformers,
   accelerate, datasets, peft; it also pulls deepspeed, which builds as a pure-Python wheel and only
   prints "Setting accelerator to CPU") with ``torch==2.13.0`` as the constraint, then ``pip uninstall
   torchvision torchaudio torchcodec triton`` (none of them arrive with 0.47, the step is kept for safety).
2. **The split** and 3. **our draft**: exactly bench/peer_speculators.py's steps 2 and 3
   (``our_split_and_train``: the demo data and feature cache, a draftsmith ``Trainer`` over ``--recipe``
   with ``train.max_time_s = W``; its train rows and 24 held-out rows).
4. **Conversion** into ModelOpt's offline layout (what its ``collect_hidden_states/
   compute_hidden_states_hf.py`` dumps and ``modelopt.torch.speculative.eagle.utils.
   OfflineSupervisedDataset`` reads): ``<data>/offline/row_<i>.pt`` per train row, in our order, a dict
   of ``input_ids`` (T,) int64, ``aux_hidden_states`` (T, 3 H) = the three cached aux states concatenated
   in layer order (its dump concatenates HF ``hidden_states[i]`` for i = 2, N/2, N-3, the same states:
   vLLM's aux id i = the input of layer i = HF ``hidden_states[i]``), ``hidden_states`` (T, H) = the
   cached last state BEFORE the final norm with ``hidden_states_prenorm = True`` (ModelOpt then applies
   the target's final norm and lm_head itself, ``modeling_final_norm._maybe_apply_base_final_norm``, as
   our cache engine does), and ``loss_mask`` (T,) (read only with ``answer_only_loss``, see step 5).
   ``<data>/d2t.pt``: its draft vocab by its own rule (``modelopt.torch.speculative.utils.
   calibrate_frequent_vocab``: the ``--draft-vocab-size`` most common tokens of the whole rendered
   train conversations, ``d2t[i] = token - i``); that function asserts when the text holds fewer
   distinct tokens than the draft vocab (the demo's 291 train rows hold 7,814 < 8,192), so the rest is
   filled with unseen token ids in id order (they are never a target's argmax in these rows). Only the
   train rows are written: its offline data module builds no validation set and its recipe has
   ``do_eval: false``. Same bytes as ours (the cache's dtype), no target pass.
5. **ModelOpt's draft**: its own EAGLE-3 path (what ``examples/speculative_decoding/main.py`` does:
   ``load_recipe`` of its built-in ``general/speculative_decoding/eagle3`` recipe, ``load_vlm_or_llm``
   with ``use_offline_training`` (the target with 0 decoder layers: embeddings, final norm, lm_head),
   ``mtsp.convert(model, [("eagle", recipe.eagle)])``, ``HFEagleModel.load_draft_vocab_cache``,
   ``OfflineSupervisedDataset`` + ``EagleOfflineDataCollator``, an HF ``Trainer`` whose ``compute_loss``
   drops ``num_items_in_batch`` as its ``EagleTrainerWithAccLog`` does) in a subprocess with that
   venv's python, through a launcher this script writes next to the checkpoints (the example scripts
   are not in the wheel; the launcher re-states the few lines it needs). Its default recipe (eagle3.yaml +
   eagle/default_config.py): one Llama decoder layer shaped like Llama-3-8B's (intermediate 14,336, 32
   heads x 128, 8 KV heads; only hidden_size, vocab and max positions come from the target), rope theta
   10,000, EAGLE-3 fc over the aux states + separate input/hidden RMSNorms + a final norm, the
   target's embeddings frozen, a fresh draft lm_head, 3 TTT steps, loss = soft cross-entropy against
   the target's softmax over the draft vocab, step i weighted 0.9^i, loss on every token
   (``answer_only_loss: false``), HF defaults otherwise: AdamW (``adamw_torch_fused``) lr 1e-4, betas
   (0.9, 0.999), weight decay 0, grad clip 1.0, linear schedule with 1,000 warmup steps, batch 1,
   every row padded or cut to ``training_seq_len`` 2,048 (the demo's rows average 415 tokens: ~80% of
   each step is padding), bf16, 1 epoch, seed 42, ``torch.compile`` of its eagle forward and loss.
   Plus what this machine and this comparison need (dotlist overrides, no patch):

   - precision (``--peer-precision``, default ``match``): ours, i.e. fp32 on a CPU without native bf16
     (``draftsmith.train.precision``: AVX2 emulates bf16 ~30x slower), so the launcher loads the target
     in float32 (the draft follows the target's dtype) and sets ``training.bf16=false``; bf16 (its
     recipe: the target's bf16 weights and bf16 autocast) where our side trains in bf16 or with
     ``--peer-precision bf16``;
   - ``training.use_cpu=true``, ``training.tf32=false``: transformers refuses bf16 without a GPU unless
     ``use_cpu``, and tf32 raises without an Ampere GPU;
   - ``eagle_architecture_config.draft_vocab_size`` = ours (8,192) with ``data.draft_vocab_cache`` (step 4);
   - ``eagle_architecture_config.eagle_aux_hidden_state_layer_ids = [2, 15, 27]``: the cache's layers,
     written in vLLM's numbering because that is what its export hands vLLM (ModelOpt's own default,
     ``default_eagle_aux_layer_ids``, is [1, 14, 26] in its forward-hook numbering, the output of layer i
     = the same states, but its exporter copies the ids unchanged into config.json, and vLLM reads id i
     as the input of layer i, one layer earlier than trained);
   - ``training.save_strategy=no``: the only checkpoint is the export after the clock stops (its
     mid-run saves would land inside W; at save_steps 8,192 none would happen anyway);
   - ``training.report_to=none``, ``training.disable_tqdm=true``: no tracker, a quiet log;
   - ``--peer-arch target`` (not the default) replaces its Llama-3-8B layer shape by the target's
     (intermediate 1,536, 9 heads x 64, 3 KV heads, rope theta from the target), our draft's shape:
     9.8 M trainable parameters instead of 39.9 M; one uncompiled fp32 step (2,048 padded positions,
     3 TTT steps) took 75 s against 272 s with its default layer on one shared core (2026-12-05, load
     ~5 on 2 cores);
   - ``eagle_use_torch_compile=false`` (``--peer-compile``, default ``off``): its recipe compiles the
     eagle forward (``mode="max-autotune"``) and loss; on this CPU inductor's autotuning alone took
     ~140 s and the first step 570 s of wall (the target-shaped layer, one shared core, 2026-12-05)
     against 75 s uncompiled, i.e. most of a 600-s budget before a second step; ``--peer-compile on``
     keeps its default (the compile then counts inside W).

   In-process behaviour of the launcher (installed files are never edited, nothing of ModelOpt is
   monkeypatched):

   - **the wall budget**: a ``TrainerCallback`` whose clock starts at ``on_train_begin`` (after the
     data loader, optimizer and schedule exist) and counts everything up to the optimizer step that
     crosses W seconds (data loading, torch.compile's first-step compilation and the logging every
     ``logging_steps`` included; no evaluation or save happens inside), then sets
     ``control.should_training_stop``; the first ``on_step_end`` past W ends training there;
   - **the LR schedule** (``--peer-schedule``): ``fit`` (default) keeps its linear warmup-then-decay
     shape but runs it over W seconds (warmup = the first 1% of W, zero at W; ``num_train_epochs=50``,
     our demo's cap), the treatment peer_speculators gives speculators' schedule and our cosine gets
     from ``max_time_s``; ``default`` leaves its 1,000 warmup steps and 1 epoch untouched (one epoch of
     the demo's train rows is under 300 steps, so its LR never leaves warmup and training ends at the
     epoch's end if that comes before W);
   - **the export**: after training, in the same process, ``modelopt.torch.export.
     export_speculative_decoding`` (the draft-only exporter, ``EagleExporter``, that its export script
     reaches for a speculative-decoding model; here without the save/reload round trip; its generic
     ``export_hf_checkpoint`` would write the 0-layer base model instead) writes ``export/`` =
     ``model.safetensors`` (the draft layer, fc, norms, draft lm_head, d2t) and ``config.json``
     (``LlamaForCausalLMEagle3``, ``eagle_config`` with the aux ids, ``draft_vocab_size``) with its
     default ``eagle_export_rope_scaling`` injected (YaRN factor 32 over 2,048 positions: its recipe
     trains with plain rope and exports YaRN "for long context"; vLLM applies it to the draft, with
     transformers warning that factor 32 disagrees with max_position_embeddings / 2,048 = 4 and keeping
     32; ``--peer-export-rope default`` exports the rope it trained with instead).

6. **Serving**: bench/peer_speculators.py's step 6 with ModelOpt's ``export/`` directory in the
   speculators slot (``{"method": "eagle3", "model": DIR, "num_speculative_tokens": K}``; vLLM 0.32
   reads ModelOpt's export format itself): no speculation, ngram K=3, ours and ModelOpt's at each K,
   one vLLM server each, tokens/s, real tau from /metrics and the tokens compared with no speculation.

Writes ``--out`` (JSON) and prints the markdown table: per prompt set and configuration tokens/s,
speedup, real tau, acceptance per position, same tokens as no speculation; then each side's steps,
tokens seen (ModelOpt's real tokens, its padded batches are ``steps x 2048``) and seconds, and whether
our real tau >= ModelOpt's at each K. ``--reuse`` keeps checkpoints (and the converted data) from an
earlier run with the same settings. Everything lands in a folder named after ``--out`` (default
``runs/bench/peer_modelopt/``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_errors import run  # noqa: E402
from peer_speculators import (  # noqa: E402  (bench/ on sys.path: the twin bench's helpers)
    DATA_MARK,
    cached_rows,
    conversion_key,
    reused,
    MAX_MODEL_LEN,
    PEER_LAYER_IDS,
    ensure_venv,
    finish_report,
    our_split_and_train,
    prompt_sets,
    run_launcher,
    serve_all,
    side_by_side_args,
    start_bench,
)

MODELOPT = "nvidia-modelopt[hf]==0.47.0"
MODELOPT_MODULES = ("modelopt.torch.speculative", "modelopt.torch.export", "accelerate")
RECIPE = "general/speculative_decoding/eagle3"  # its built-in EAGLE-3 recipe (modelopt_recipes/, in the wheel)
TRAIN_LEN = 2048  # its recipe's training_seq_len (= our max_length)
PEER = "modelopt"
SERVED = ("ngram", "draftsmith", PEER)


# ---------------------------------------------------------------------------------------------- conversion
def modelopt_sample(row: dict) -> dict:
    """One cached row -> the dict ModelOpt's OfflineSupervisedDataset loads from a ``.pt`` file:
    ``input_ids`` (T,) int64, ``aux_hidden_states`` (T, n H) (the n aux states concatenated in layer
    order, as its dump does), ``hidden_states`` (T, H) the last state before the final norm, flagged
    ``hidden_states_prenorm`` so it applies the target's final norm before lm_head, ``loss_mask`` (T,)."""
    import torch

    aux, last = row["aux"], row["last"]
    if aux.dim() != 3 or last.dim() != 2 or aux.shape[0] != last.shape[0] or aux.shape[2] != last.shape[1]:
        raise ValueError(f"cached row: aux {tuple(aux.shape)} and last {tuple(last.shape)} do not line up "
                         "as (T, n, H) and (T, H)")
    t, n, h = aux.shape
    return {"input_ids": row["input_ids"].to(torch.int64).contiguous(),
            "aux_hidden_states": aux.reshape(t, n * h).contiguous(),
            "hidden_states": last.contiguous(),
            "hidden_states_prenorm": True,
            "loss_mask": row["loss_mask"].to(torch.int64).contiguous()}


def draft_vocab(rows: Iterable[Sequence[int]], size: int, vocab_size: int) -> tuple[list[int], int]:
    """ModelOpt's draft vocab rule (``calibrate_frequent_vocab``: ``Counter(ids).most_common(size)``
    over the whole rendered conversations) on ``rows``; where fewer than ``size`` distinct tokens occur,
    the unseen ids fill the rest in id order. (draft index -> token id, number of seen tokens chosen)."""
    counts = Counter(int(t) for ids in rows for t in ids)
    chosen = [t for t, _ in counts.most_common(size)]
    seen = len(chosen)
    if seen < size:
        have = set(chosen)
        chosen += [t for t in range(vocab_size) if t not in have][: size - seen]
    if len(chosen) != size:
        raise ValueError(f"draft vocab {size} > target vocab {vocab_size}")
    return chosen, seen


def d2t_of(chosen: Sequence[int]):
    """EAGLE-3's d2t offsets as ModelOpt stores them: ``d2t[i] = chosen[i] - i`` (int64)."""
    import torch

    return torch.tensor([t - i for i, t in enumerate(chosen)], dtype=torch.int64)


def convert(cache_dir: Path, train: Sequence[Any], out: Path, draft_vocab_size: int, vocab_size: int, *,
            reuse: bool = True) -> dict:
    """Write ``train`` (draftsmith Examples of the cache's rows) in ModelOpt's offline layout under
    ``out`` (module docstring, step 4). Reused when ``out`` holds the same rows of the same cache.
    Returns the manifest (rows, tokens, draft vocab coverage, ...)."""
    import torch

    want, cache_manifest = conversion_key(cache_dir, train, train_rows=len(train), draft_vocab_size=draft_vocab_size)
    have = reused(out, want, reuse)
    if have is not None:
        return have
    offline = out / "offline"
    offline.mkdir(parents=True)
    tokens = 0
    for i, ex, row in cached_rows(cache_dir, train, "peer_modelopt"):
        torch.save(modelopt_sample(row), offline / f"row_{i:06d}.pt")
        tokens += len(ex.input_ids)
    chosen, seen = draft_vocab((ex.input_ids for ex in train), draft_vocab_size, vocab_size)
    torch.save(d2t_of(chosen), out / "d2t.pt")  # beside offline/, not in it: its loader globs **/*.pt
    manifest = {**want, "tokens": tokens, "draft_vocab_seen_tokens": seen,
                "hidden_states": "aux layers " + str(cache_manifest["aux_layer_ids"]) + " (concatenated) + last "
                                 "pre-norm state (hidden_states_prenorm), " + cache_manifest["dtype"]}
    (out / DATA_MARK).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


# ---------------------------------------------------------------------------------------------- the launcher
LAUNCHER = r'''"""ModelOpt 0.47's EAGLE-3 trainer on the CPU under a wall budget; written by draftsmith's bench/peer_modelopt.py.

    python launcher.py SUMMARY.json WALL_S fit|default EXPORT_DIR auto|float32 -- <recipe dotlist overrides>

What examples/speculative_decoding/main.py does for an offline EAGLE-3 recipe (its built-in
general/speculative_decoding/eagle3 recipe + the overrides), then export_speculative_decoding into EXPORT_DIR.
A TrainerCallback stops training after the optimizer step at which WALL_S seconds have passed since
on_train_begin; with "fit" its linear LR schedule runs over WALL_S (1% warmup, 0 at WALL_S).
No installed file is edited and nothing of ModelOpt is patched.
"""
import dataclasses
import json
import sys
import time
from pathlib import Path


def main():
    summary_path, wall_s, schedule, export_dir, dtype = (sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4],
                                                         sys.argv[5])
    overrides = sys.argv[sys.argv.index("--") + 1:]

    import torch
    import transformers
    from transformers import Trainer, TrainerCallback

    import modelopt.torch.opt as mto
    import modelopt.torch.speculative as mtsp
    from modelopt.recipe import load_recipe
    from modelopt.recipe.config import ModelOptEagleRecipe
    from modelopt.torch.export import export_speculative_decoding
    from modelopt.torch.speculative.eagle.utils import EagleOfflineDataCollator, OfflineSupervisedDataset
    from modelopt.torch.speculative.plugins.hf_training_args import TrainingArguments as SpecTrainingArgs
    from modelopt.torch.speculative.utils import load_vlm_or_llm

    t0 = time.perf_counter()
    torch.manual_seed(0)  # as main.py
    mto.enable_huggingface_checkpointing()
    recipe = load_recipe("''' + RECIPE + r'''", overrides=overrides)
    assert isinstance(recipe, ModelOptEagleRecipe) and recipe.data.mode == "offline", recipe.data.mode
    # main.py's HfTrainingArguments: transformers.TrainingArguments + its speculative-decoding fields
    HfTrainingArguments = dataclasses.make_dataclass(
        "HfTrainingArguments",
        [(name, fi.annotation, dataclasses.field(default=fi.default)) for name, fi in SpecTrainingArgs.model_fields.items()],
        bases=(transformers.TrainingArguments,))
    training_args = HfTrainingArguments(**recipe.training.model_dump())

    model = load_vlm_or_llm(recipe.model.model_name_or_path, use_fake_base=recipe.model.use_fake_base_for_offline,
                            use_offline_training=True, dtype=dtype, device_map="cpu",
                            trust_remote_code=recipe.model.trust_remote_code)
    tokenizer = transformers.AutoTokenizer.from_pretrained(recipe.model.model_name_or_path,
                                                           model_max_length=training_args.training_seq_len)
    mtsp.convert(model, [("eagle", recipe.eagle.model_dump())])
    mtsp.plugins.HFEagleModel.load_draft_vocab_cache(model, recipe.data.draft_vocab_cache)
    files = sorted(str(p) for p in Path(recipe.data.offline_data_path).rglob("*.pt"))
    dataset = OfflineSupervisedDataset(files, answer_only_loss=training_args.answer_only_loss, tokenizer=tokenizer)
    collator = EagleOfflineDataCollator(train_len=training_args.training_seq_len)

    stats = {"wall_s": wall_s, "schedule": schedule, "steps": 0, "tokens": 0, "loss_tokens": 0,
             "padded_tokens": 0, "stopped_by": "epochs", "log": []}

    class Clock:
        since = None

        def elapsed(self):
            return 0.0 if self.since is None else time.perf_counter() - self.since

    clock = Clock()

    def fitted(step):
        warm = 0.01 * wall_s
        el = clock.elapsed()
        return el / warm if el < warm else max(0.0, (wall_s - el) / (wall_s - warm))

    class WallBudget(TrainerCallback):
        def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):
            if schedule == "fit":
                lr_scheduler.lr_lambdas = [fitted] * len(lr_scheduler.optimizer.param_groups)
            clock.since = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            stats["steps"] = state.global_step
            if clock.elapsed() >= wall_s:
                stats["stopped_by"] = "wall_s"
                control.should_training_stop = True
            return control

        def on_log(self, args, state, control, logs=None, **kwargs):
            stats["log"].append({"step": state.global_step, "s": round(clock.elapsed(), 1), **(logs or {})})

    class EagleTrainer(Trainer):
        """main.py's EagleTrainerWithAccLog, less its LoRA param groups: compute_loss without
        num_items_in_batch (its loss is already a mean), the TTT accuracies kept; plus token counts."""

        def compute_loss(self, model, inputs, *args, **kwargs):
            kwargs.pop("num_items_in_batch", None)
            stats["tokens"] += int(inputs["attention_mask"].sum())
            stats["padded_tokens"] += int(inputs["attention_mask"].numel())
            stats["loss_tokens"] += int((inputs["loss_mask"] * inputs["attention_mask"]).sum())
            loss, outputs = super().compute_loss(model, inputs, *args, return_outputs=True, **kwargs)
            if getattr(outputs, "train_acc", None):
                stats["last_train_acc"] = [round(float(a), 4) for a in outputs.train_acc[0]]
            stats["last_loss"] = round(float(loss.detach()), 4)
            return loss

    trainer = EagleTrainer(model=model, processing_class=tokenizer, args=training_args, callbacks=[WallBudget()],
                           train_dataset=dataset, data_collator=collator)
    trainer.can_return_loss = True
    assert trainer.label_smoother is None
    eagle = model.eagle_config
    stats["recipe"] = {
        "training": {k: v for k, v in recipe.training.model_dump().items() if k != "output_dir"},
        "eagle": {k: v for k, v in recipe.eagle.model_dump().items() if k != "eagle_architecture_config"},
        "draft_layer": {k: getattr(eagle, k, None) for k in (
            "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "head_dim", "draft_vocab_size", "eagle_aux_hidden_state_layer_ids", "use_last_layernorm", "rope_theta",
            "rope_scaling", "_attn_implementation")},
        "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "optimizer": training_args.optim, "lr_scheduler_type": str(training_args.lr_scheduler_type),
        "max_grad_norm": training_args.max_grad_norm, "rows": len(files)}
    print("peer: " + json.dumps(stats["recipe"], default=str), flush=True)
    stats["setup_s"] = round(time.perf_counter() - t0, 1)
    trainer.train()
    stats["train_s"] = round(clock.elapsed(), 1)
    print(f"peer: {stats['steps']} steps in {stats['train_s']:.0f} s (stopped by {stats['stopped_by']}), "
          f"loss {stats.get('last_loss')}, train acc {stats.get('last_train_acc')}", flush=True)
    t = time.perf_counter()
    model.eval()
    with torch.inference_mode():
        export_speculative_decoding(model, export_dir=export_dir)
    stats["export_s"] = round(time.perf_counter() - t, 1)
    stats["checkpoint"] = export_dir
    stats["process_s"] = round(time.perf_counter() - t0, 1)
    with open(summary_path, "w") as f:
        json.dump(stats, f, indent=2, default=str)


if __name__ == "__main__":
    main()
'''


def peer_overrides(target: str, data_dir: Path, out_dir: Path, args: argparse.Namespace) -> list[str]:
    """The recipe's dotlist overrides: the data, the CPU and the comparison settings (module docstring, step 5)."""
    arch: dict[str, Any] = {"draft_vocab_size": args.draft_vocab_size,
                            "eagle_aux_hidden_state_layer_ids": list(PEER_LAYER_IDS)}
    if args.peer_arch == "target":
        cfg = json.loads((Path(target) / "config.json").read_text())
        rope = cfg.get("rope_theta") or (cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}).get("rope_theta")
        arch.update(intermediate_size=cfg["intermediate_size"], num_attention_heads=cfg["num_attention_heads"],
                    num_key_value_heads=cfg["num_key_value_heads"],
                    head_dim=cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
        if rope:
            arch.update(rope_theta=rope, rope_scaling={"rope_type": "default", "rope_theta": rope})
    flags = [f"model.model_name_or_path={target}",
             f"data.offline_data_path={data_dir / 'offline'}", f"data.draft_vocab_cache={data_dir / 'd2t.pt'}",
             f"training.output_dir={out_dir / 'hf_trainer'}", "training.use_cpu=true", "training.tf32=false",
             "training.save_strategy='no'", "training.report_to=none", "training.disable_tqdm=true",
             f"training.training_seq_len={TRAIN_LEN}",
             "eagle.eagle_architecture_config=" + json.dumps(arch, separators=(",", ":"))]
    if not args.peer_bf16:
        flags.append("training.bf16=false")
    if args.peer_schedule == "fit":
        flags.append("training.num_train_epochs=50")
    if args.peer_compile == "off":
        flags.append("eagle.eagle_use_torch_compile=false")
    if args.peer_export_rope == "default":
        flags.append("eagle.eagle_export_rope_scaling={}")
    if args.peer_answer_only_loss:
        flags.append("training.answer_only_loss=true")
    return flags


def train_peer(py: Path, target: str, data: dict, data_dir: Path, run_dir: Path, args: argparse.Namespace) -> dict:
    """Run ModelOpt's trainer (the launcher) for args.wall_s seconds of training; its summary dict."""
    summary, export = run_dir / "train_summary.json", run_dir / "export"
    flags = peer_overrides(target, data_dir, run_dir, args)
    settings = {"wall_s": args.wall_s, "schedule": args.peer_schedule, "bf16": args.peer_bf16, "overrides": flags,
                "data": data["rows_sha256"]}
    if args.reuse and summary.is_file():
        have = json.loads(summary.read_text())
        if have.get("settings") == settings and (Path(have.get("checkpoint", "")) / "config.json").is_file():
            print(f"modelopt: reusing {have['checkpoint']} (--reuse)", flush=True)
            return have
    rest = [args.peer_schedule, str(export), "auto" if args.peer_bf16 else "float32", "--", *flags]
    return run_launcher("ModelOpt", py, LAUNCHER, run_dir, summary, args.wall_s, rest, settings,
                        env={"WANDB_DISABLED": "true"})


# ---------------------------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    side_by_side_args(ap, SERVED, "modelopt-0.47.0-venv", k_default=[1, 3], k_help="K for both drafts (default 1 3)")
    ap.add_argument("--peer-schedule", choices=["fit", "default"], default="fit",
                    help="ModelOpt's LR schedule: fit (linear over --wall-s) or default (its 1000 warmup steps, 1 epoch)")
    ap.add_argument("--peer-precision", choices=["match", "bf16"], default="match",
                    help="ModelOpt's precision: match (ours: bf16 only where our side trains in bf16, i.e. a GPU or a "
                         "CPU with native bf16; fp32 weights and no autocast otherwise) or bf16 (its recipe: the "
                         "target's bf16 weights and bf16 autocast, emulated ~30x slower on an AVX2 CPU)")
    ap.add_argument("--peer-arch", choices=["default", "target"], default="default",
                    help="ModelOpt's draft layer: default (its Llama-3-8B-shaped layer) or target (the target's shape)")
    ap.add_argument("--peer-compile", choices=["on", "off"], default="off",
                    help="its eagle_use_torch_compile: off (default here: its max-autotune compile takes most of a "
                         "600-s CPU budget) or on (its recipe's default; the compile counts inside --wall-s)")
    ap.add_argument("--peer-export-rope", choices=["yarn", "default"], default="yarn",
                    help="rope in its exported config: yarn (its default eagle_export_rope_scaling) or default "
                         "(the rope it trained with)")
    ap.add_argument("--peer-answer-only-loss", action="store_true",
                    help="its answer_only_loss (default off, as its recipe: loss on every token)")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench" / "peer_modelopt.json"))
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from draftsmith.models import resolve_target
    from draftsmith.train.demo import prepare_data
    out_path, work = start_bench(ap, args)  # runs/bench/peer_modelopt/: checkpoints, data, logs
    phases: dict[str, float] = {}
    t_all = time.perf_counter()

    t = time.perf_counter()
    py, _ = ensure_venv(Path(args.venv), args.skip_install, package=MODELOPT, modules=MODELOPT_MODULES,
                        who="peer_modelopt")
    phases["install"] = round(time.perf_counter() - t, 1)

    t = time.perf_counter()
    regen_dir, cache_dir, _ = prepare_data(progress=False)
    target = str(resolve_target("smollm2"))
    phases["demo_data"] = round(time.perf_counter() - t, 1)

    t = time.perf_counter()
    train_rows, held_rows, ours = our_split_and_train(work / "draftsmith", regen_dir, cache_dir, args)
    phases["train_draftsmith"] = round(time.perf_counter() - t, 1)
    print(f"draftsmith: {ours['steps']} steps, {ours['tokens']} tokens in {ours['train_s']:.0f} s "
          f"({len(train_rows)} train / {len(held_rows)} held-out rows)", flush=True)

    args.peer_bf16 = args.peer_precision == "bf16" or bool(ours["settings"]["config"]["train"].get("bf16"))
    t = time.perf_counter()
    vocab_size = json.loads((Path(target) / "config.json").read_text())["vocab_size"]
    data = convert(Path(cache_dir), train_rows, work / "modelopt_data", args.draft_vocab_size, vocab_size,
                   reuse=args.reuse)
    phases["convert"] = round(time.perf_counter() - t, 1)
    print(f"converted {data['train_rows']} train rows ({data['tokens']} tokens; draft vocab {args.draft_vocab_size}: "
          f"{data['draft_vocab_seen_tokens']} seen tokens) into {work / 'modelopt_data'} in {phases['convert']:.0f} s",
          flush=True)

    t = time.perf_counter()
    peer = train_peer(py, target, data, work / "modelopt_data", work / "modelopt", args)
    phases["train_modelopt"] = round(time.perf_counter() - t, 1)
    print(f"modelopt: {peer['steps']} steps, {peer['tokens']} tokens ({peer['padded_tokens']} padded) in "
          f"{peer['train_s']:.0f} s (stopped by {peer['stopped_by']}; process {peer.get('process_s', 0):.0f} s)",
          flush=True)

    sets = prompt_sets(target, args, work)
    t = time.perf_counter()
    print(f"serving: target {target}, {args.prompts} prompts per set, {args.max_tokens} tokens, batch 1, "
          f"{args.dtype}, max_model_len {MAX_MODEL_LEN}", flush=True)
    results = serve_all(target, Path(ours["checkpoint"]), Path(peer["checkpoint"]), sets, args.k, args.max_tokens,
                        work, args.dtype, args.serve, peer_label=PEER)
    phases["serve"] = round(time.perf_counter() - t, 1)
    phases["total"] = round(time.perf_counter() - t_all, 1)

    peer_side = (f"ModelOpt 0.47 (default recipe, {args.peer_arch} layer, {args.peer_schedule} LR; "
                 f"{peer['padded_tokens']} padded tokens)")
    finish_report(results, args, phases, out_path, report={"target": target, "data": data},
                  sides=((f"draftsmith ({args.recipe} recipe)", "draftsmith", ours), (peer_side, PEER, peer)),
                  peer_name="ModelOpt's")
    print(f"\nJSON: {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
