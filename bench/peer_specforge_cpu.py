"""Can SpecForge 0.2.0 train an EAGLE-3 draft on a CPU? A tiny offline run from our demo feature cache.

    .venv/bin/python bench/peer_specforge_cpu.py [--rows 4] [--max-length 128] [--steps 2] [--skip-install]
        [--venv <user cache>/draftsmith/peer/specforge-0.2.0-venv] [--work runs/bench/peer_specforge_cpu]

Answer (2026-12-05, SpecForge 0.2.0 from PyPI, torch 2.13.0+cpu): yes, with one in-process patch and three
config/data settings; nothing installed is edited. In the order a plain run meets them:

1. **Install.** specforge 0.2.0's metadata pins ``torch==2.11.0`` and ``sglang==0.5.14``: with torch 2.13.0 as
   the constraint pip reports ResolutionImpossible ("specforge 0.2.0 depends on torch==2.11.0"). So: torch
   first, then ``specforge==0.2.0 --no-deps``, then its light requirements (transformers==5.8.1, datasets,
   accelerate, ...) and ``triton`` (``specforge/core/loss.py:10`` imports it at module level; the PyPI
   wheel imports on a CPU). sglang (online capture only), yunchang (sequence parallel only), wandb and
   flash-attn are not needed offline.
2. **Target head** (``modeling/target/target_head.py:70-75``): the frozen lm_head is read through a
   ``*.index.json``; a one-file checkpoint (SmolLM2) fails with "FileNotFoundError: No index.json file found
   in ...". The script writes a target folder of symlinks plus a ``model.safetensors.index.json``, and
   ``model.lm_head_key: model.embed_tokens.weight`` (SmolLM2 ties its embeddings).
3. **FSDP** (``training/backend.py:281``): the default ``training.fsdp_sharding: SHARD_GRAD_OP`` wraps the
   draft in FSDP: "RuntimeError: FSDP needs a non-CPU accelerator device, but no accelerator device is
   detected." ``NO_SHARD`` takes its DDP branch (``backend.py:233-251``), which runs on gloo (SpecForge picks
   gloo for device "cpu": ``distributed.py:20-24``, ``utils.py:138-154``).
4. **The loss: the first hard GPU dependency in code.** EAGLE-3's KL loss is a Triton kernel:
   ``algorithms/eagle3/model.py:74`` ``LogSoftmaxLoss.apply`` -> ``core/loss.py:185``
   ``log_softmax_forward_kernel[grid](...)`` -> "RuntimeError: 0 active drivers ([]). There should only be
   one." (triton/runtime/driver.py). The launcher swaps ``LogSoftmaxLoss`` in
   ``specforge.algorithms.eagle3.model`` for the same masked soft-target cross-entropy in torch
   (-sum target * log_softmax(logits) per position, 0 where masked, mean over B x T). P-EAGLE uses the same
   kernel (``algorithms/peagle/model.py:181``); SpecForge's DFlash loss does not use it.
5. **Precision.** ``TargetHead.from_pretrained`` casts the lm_head to bf16 (``target_head.py:52-54``) and DDP has
   no mixed precision, so fp32 features meet a bf16 head ("expected m1 and m2 to have the same dtype").
   Either everything bf16 (``model.torch_dtype: bfloat16``, bf16 features: emulated on a CPU without native
   bf16, very slow) or, as here, ``--fp32``: the launcher casts the head back to float32 and the features
   and draft are float32.

Then ``specforge train`` runs its own loop: ``step 1``, ``step 2`` with loss/acceptance metrics, and writes
``<work>/out/specforge-run-step<N>/training_state.pt``. Not checked here: ``specforge export --to hf``
of that state and serving it on vLLM.

Data conversion (our cache -> SpecForge's offline ``specforge_hidden_states_v1`` ``.ckpt``, one per row):
``input_ids`` (T,), ``loss_mask`` (T,), ``aux_hidden_state`` (1, T, 3H) = the cached aux layers [2, 15, 27]
(SpecForge / SGLang ids [1, 14, 26]: output of decoder layer i) concatenated, ``hidden_state`` (1, T, H) =
the target's final RMSNorm of the cached pre-norm last state (SpecForge's teacher is ``TargetHead.fc`` of
it, the lm_head alone). Every run here is pinned to one core (``taskset -c 1``, one torch thread).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

SPECFORGE = "specforge==0.2.0"
TORCH = "torch==2.13.0"
# specforge's requirements minus torch (pinned 2.11.0), sglang (online capture), yunchang (sequence parallel),
# wandb (a tracker); plus triton, imported at module level by specforge/core/loss.py
DEPS = ("transformers==5.8.1", "datasets", "tqdm", "accelerate", "huggingface-hub", "numpy", "pydantic", "psutil",
        "pyyaml", "safetensors", "requests", "tensorboard", "typing-extensions", "triton")
MARK = ".draftsmith-peer-complete"

LAUNCHER = r'''"""SpecForge 0.2.0's `specforge train` on a CPU; written by draftsmith's bench/peer_specforge_cpu.py.
Patches, in this process only: EAGLE-3's Triton loss kernel -> torch; with --fp32 the frozen target head
stays float32 (TargetHead.from_pretrained casts it to bf16)."""
import sys

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
    args = sys.argv[1:]
    import specforge.algorithms.eagle3.model as eagle3_model
    import specforge.modeling.target.target_head as target_head

    eagle3_model.LogSoftmaxLoss = TorchLogSoftmaxLoss
    if "--fp32" in args:
        args.remove("--fp32")
        original = target_head.TargetHead.from_pretrained.__func__

        def from_pretrained_fp32(cls, *a, **k):
            return original(cls, *a, **k).float()

        target_head.TargetHead.from_pretrained = classmethod(from_pretrained_fp32)
    from specforge.cli import main as specforge_main

    return specforge_main(args)


if __name__ == "__main__":
    sys.exit(main())
'''


def ensure_venv(venv: Path, skip_install: bool) -> Path:
    py = venv / "bin" / "python"
    if (venv / MARK).is_file() or skip_install:
        return py
    if not py.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    constraints = venv / "constraints.txt"
    constraints.write_text(TORCH + "\n")
    pip = [str(py), "-m", "pip", "install", "-q"]
    subprocess.run(pip + [TORCH], check=True)
    subprocess.run(pip + ["-c", str(constraints), "--no-deps", SPECFORGE], check=True)
    subprocess.run(pip + ["-c", str(constraints), *DEPS], check=True)
    subprocess.run([str(py), "-c", "import specforge.cli, triton, torch; assert torch.__version__.startswith('2.13.0')"],
                   check=True)
    (venv / MARK).write_text(json.dumps({"specforge": SPECFORGE, "torch": TORCH}) + "\n")
    return py


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
        shards = sorted(target.glob("*.safetensors"))
        weight_map = {}
        for shard in shards:
            with safe_open(str(shard), "pt") as f:
                weight_map.update({k: shard.name for k in f.keys()})
        index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}) + "\n")
    return out


def convert_rows(cache_dir: Path, target: Path, out: Path, rows: int, max_length: int) -> list[int]:
    """The first ``rows`` rows of our cache as SpecForge offline ``.ckpt`` files (module docstring)."""
    import torch
    from safetensors import safe_open

    from draftsmith.cache.store import CacheReader

    cfg = json.loads((target / "config.json").read_text())
    with safe_open(str(target / "model.safetensors"), "pt") as f:
        norm = f.get_tensor("model.norm.weight").float()
    out.mkdir(parents=True, exist_ok=True)
    reader = CacheReader(cache_dir)
    lengths = []
    try:
        for i, key in enumerate(list(reader.index)[:rows]):
            row = reader.row(key)
            last = row["last"].float()[:max_length]
            normed = last * torch.rsqrt(last.pow(2).mean(-1, keepdim=True) + cfg["rms_norm_eps"]) * norm
            aux = row["aux"].float()[:max_length]
            torch.save({"input_ids": row["input_ids"][:max_length].long().clone(),
                        "loss_mask": row["loss_mask"][:max_length].long().clone(),
                        "aux_hidden_state": aux.reshape(aux.shape[0], -1).unsqueeze(0).clone(),
                        "hidden_state": normed.unsqueeze(0).clone()}, out / f"data_{i:05d}.ckpt")
            lengths.append(int(aux.shape[0]))
    finally:
        reader.close()
    return lengths


def main() -> int:
    import platformdirs
    import yaml

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--venv", default=str(Path(platformdirs.user_cache_dir("draftsmith")) / "peer" / "specforge-0.2.0-venv"))
    ap.add_argument("--skip-install", action="store_true")
    ap.add_argument("--work", default=str(ROOT / "runs" / "bench" / "peer_specforge_cpu"))
    args = ap.parse_args()

    from draftsmith.cache.store import read_manifest
    from draftsmith.models import resolve_target
    from draftsmith.train.demo import prepare_data

    py = ensure_venv(Path(args.venv), args.skip_install)
    _, cache_dir, _ = prepare_data(progress=False)
    target = Path(resolve_target("smollm2"))
    work = Path(args.work).resolve()
    aux = [i - 1 for i in read_manifest(Path(cache_dir))["aux_layer_ids"]]  # engine id -> output of layer i
    lengths = convert_rows(Path(cache_dir), target, work / "data", args.rows, args.max_length)
    config = {
        "model": {"target_model_path": str(indexed_target(target, work / "target")),
                  "lm_head_key": "model.embed_tokens.weight", "torch_dtype": "float32",
                  "aux_hidden_state_layer_ids": aux},
        "data": {"hidden_states_path": str(work / "data"), "max_length": args.max_length,
                 "dataloader_num_workers": 0},
        "training": {"strategy": "eagle3", "fsdp_sharding": "NO_SHARD", "attention_backend": "sdpa",
                     "num_epochs": 1, "max_steps": args.steps, "batch_size": 1, "learning_rate": 1e-4,
                     "log_interval": 1},
        "output_dir": str(work / "out"),
    }
    (work / "run.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (work / "launcher.py").write_text(LAUNCHER)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)
    print(f"specforge: {len(lengths)} rows ({sum(lengths)} tokens), {args.steps} steps; log {work / 'train.log'}",
          flush=True)
    with open(work / "train.log", "w") as fh:
        proc = subprocess.run([str(py), str(work / "launcher.py"), "train", "-c", str(work / "run.yaml"), "--fp32"],
                              stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=str(work))
    steps = [line for line in (work / "train.log").read_text(errors="replace").splitlines() if line.startswith("step ")]
    for line in steps:
        print(line[:200])
    states = sorted((work / "out").glob("*/training_state.pt"))
    print(f"exit {proc.returncode}; {len(steps)} logged steps; states: {[str(s) for s in states]}")
    return 0 if proc.returncode == 0 and steps and states else 1


if __name__ == "__main__":
    sys.exit(main())
