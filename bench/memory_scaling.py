"""Peak memory and tokens/s of one EAGLE-3 training step against max_length and the target's vocabulary.

    python bench/memory_scaling.py [--lengths 1024 2048 4096 8192] [--vocabs 49152 128256 152064]
                                   [--modes before after] [--out runs/bench/memory_scaling.json]

A synthetic target with real head shapes and a thin body: hidden 4096, 32 heads x 128 (8 KV heads),
the given vocabulary, untied lm_head, 2 decoder layers with a narrow MLP (--intermediate), bf16, random
weights (memory and speed do not depend on what the weights say). The draft is the recipe's EAGLE-3
(3 TTT steps, 32,000-token draft vocab, frozen lm_head rows, bf16 autocast, AdamW) reading engine ids
[0, 1, 2]. One step = the hf engine's features, supervision, the draft's TTT forward and backward and
the optimizer step on one row of T tokens (loss on the last 90%).

Each (T, V, mode) runs in its own process: a warm-up step at 128 tokens allocates the optimizer state,
then the resident set is read, the kernel's high-water mark reset (/proc/self/clear_refs 5), one
T-token step run, and `peak` = high-water mark - resident set before the step: the memory the step
itself takes on top of weights and optimizer state. The supervision is dropped after backward, before
the optimizer step, as train/loop.py drops it (Trainer.forward's local). `floor` is the same figure for a 128-token step: what
a step takes whatever T (parameter grads, autocast's bf16 weight copies, AdamW's temporaries), so
peak - floor is what grows with T. Modes, side by side:
  before  the code as it was: the engine returns (T, V) logits, one attention block of (h, T, T)
          scores a step, one (N, Vd) logits block a step
  chunked the layer-L state and the target head in chunks of positions (targets.supervision_for),
          attention and the draft-vocab CE in checkpointed blocks of 64 MiB (the defaults now)
  ckpt    chunked plus train.activation_checkpointing (each TTT step recomputed in backward)

`--phases` adds, per row, each phase's own high-water mark over the step's starting resident set
(features + supervision, the draft's forward, backward, the optimizer step): which phase holds the peak.
`--profile` runs the T-token step under torch's memory profiler instead and prints the live-tensor
timeline's peak by category (parameters, activations, temporaries, gradients, ...) and the largest
tensors alive at that peak with the op that made them. Live tensors against the kernel's high-water
mark tell a tensor that is really held from memory the allocator (glibc malloc on CPU) keeps.
`--malloc default fixed` runs each row with glibc malloc as it is and with the fixed mmap threshold
a CPU training run sets (draftsmith/train/malloc.py, which says why), side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def _status(key: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


# torch.profiler._memory_profiler's categories, in the column order of MemoryProfileTimeline's sizes (column 0 unused)
CATEGORIES = ("parameter", "optimizer_state", "input", "temporary", "activation", "gradient", "autograd_detail", "unknown")


def live_peak(prof, top: int = 8) -> dict:
    """The live-tensor peak of a profiled step (bytes by category at the peak, over what was live when the
    profile started) and the ``top`` largest tensors alive at it, each with the innermost op running when it
    was created (kineto's op intervals, per thread)."""
    import torch
    from torch.profiler._memory_profiler import Action, MemoryProfileTimeline, TensorKey

    tl = MemoryProfileTimeline(prof._memory_profile())
    times, sizes = tl._coalesce_timeline("cpu")
    totals = [sum(row) for row in sizes]
    i = max(range(len(totals)), key=totals.__getitem__)
    base = sizes[0]
    at_peak = {c: (sizes[i][j + 1] - base[j + 1]) / 2**30 for j, c in enumerate(CATEGORIES)}
    # replay the timeline up to the peak: the tensors alive there
    t_peak, live = times[i] * 1000, {}
    for t, action, (key, version), nbytes in tl.timeline:
        if not isinstance(key, TensorKey) or key.device != torch.device("cpu") or (t != -1 and t > t_peak + 999):
            continue
        if action in (Action.PREEXISTING, Action.CREATE):
            live[key] = (t, nbytes, tl.categories.get(key, version))
        elif action == Action.DESTROY:
            live.pop(key, None)
        elif action == Action.INCREMENT_VERSION:
            old = live.get(key)
            if old:
                live[key] = (old[0], old[1], tl.categories.get(key, version + 1))
    ops = sorted(((e.start_ns(), e.start_ns() + e.duration_ns(), e.name(), e.shapes())
                  for e in prof.profiler.kineto_results.events() if e.name() != "[memory]"), key=lambda o: o[0])

    def made_by(t: int) -> str:
        inside = [o for o in ops if o[0] <= t <= o[1]]
        if not inside:
            return "(before the profile)" if t == -1 else "(no op)"
        o = min(inside, key=lambda o: o[1] - o[0])
        marks = [x[2] for x in inside if not x[2].startswith("aten::") and x[2] != o[2]]
        return f"{o[2]} {o[3][:2]}" + (f" in {marks[0]}" if marks else "")

    biggest = sorted(live.values(), key=lambda v: -v[1])[:top]
    return {"live_peak_gib": (totals[i] - sum(base)) / 2**30, "by_category_gib": at_peak,
            "largest": [{"gib": n / 2**30, "category": c.name.lower() if c else "unknown", "made_by": made_by(t)}
                        for t, n, c in biggest]}


def one(T: int, V: int, mode: str, intermediate: int, draft_vocab: int, ttt: int, phases: bool = False,
        profile: bool = False) -> dict:
    """One measurement in this process (called in a child); returns the figures as a dict."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftsmith.config import build_config
    from draftsmith.data.vocab_cache import VocabMap
    from draftsmith.drafts import get_family
    from draftsmith.drafts.vocab import build_vocab_maps
    from draftsmith.targets import Batch, supervision_for
    from draftsmith.drafts.eagle_supervision import eagle3_supervision
    from draftsmith.targets.hf import HFEngine
    from draftsmith.train.loop import build_draft
    from draftsmith.train.optim import build_optimizer

    torch.manual_seed(0)
    tcfg = LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                       intermediate_size=intermediate, num_hidden_layers=2, vocab_size=V, tie_word_embeddings=False,
                       max_position_embeddings=max(T, 8192), rms_norm_eps=1e-5)
    with torch.device("cpu"):
        model = LlamaForCausalLM(tcfg).to(torch.bfloat16)
    engine = HFEngine.from_model(model, dtype="bfloat16")
    info, aux_ids = engine.info(), [0, 1, 2]
    cfg = build_config({
        "target": {"path": "synthetic", "dtype": "bfloat16", "aux_layer_ids": aux_ids},
        "data": {"sources": ["unused.jsonl"], "max_length": T, "draft_vocab_size": draft_vocab},
        "draft": {"type": "eagle3", "ttt_steps": ttt, "freeze_lm_head": True},
        "train": {"bf16": True, "optimizer": "adamw", "device": "cpu"},
    })
    draft_vocab = min(draft_vocab, V)
    draft_ids = torch.arange(draft_vocab)
    d2t, t2d = build_vocab_maps(draft_ids, V)
    vocab = VocabMap(draft_ids, d2t, t2d, 1.0, "synthetic")
    family = get_family("eagle3")
    draft = build_draft(cfg, info, vocab, aux_ids)
    family.attach_target(draft, cfg.draft, embeddings=engine.embeddings(),
                         head=lambda: (engine.lm_head_weight(), engine.final_norm_weight()), vocab=vocab)
    if mode == "before":
        draft.max_score_elements = draft.max_logit_elements = 1 << 62
    draft.activation_checkpointing = mode == "ckpt"
    opt = build_optimizer(draft.named_parameters(), cfg.train)

    marks: dict[str, int] = {}  # phase -> its high-water mark over the step's starting resident set (bytes)

    def phase(name: str, rss0: int):
        """Close the running phase as ``name``: its own VmHWM minus ``rss0``, then reset the mark."""
        marks[name] = _status("VmHWM") - rss0
        Path("/proc/self/clear_refs").write_text("5")

    def step(n: int, rss0: int = 0) -> float:
        g = torch.Generator().manual_seed(n)
        ids = torch.randint(0, V, (1, n), generator=g)
        loss = torch.ones_like(ids)
        loss[:, : n // 10] = 0
        batch = Batch(ids, torch.ones_like(ids), loss)
        t0 = time.perf_counter()
        with torch.profiler.record_function("features+supervision"):
            if mode == "before":  # the engine's whole (1, T, V) logits, then the supervision math over them
                sup = eagle3_supervision(batch, engine.features(batch, aux_ids, logits=True), draft_ids)
            else:
                sup = supervision_for(engine, "eagle3", batch, aux_ids, draft_ids)
        if rss0:
            phase("features+supervision", rss0)
        with torch.profiler.record_function("draft forward"), torch.autocast("cpu", dtype=torch.bfloat16):
            out = draft.supervised(sup)
        if rss0:
            phase("draft forward", rss0)
        with torch.profiler.record_function("backward"):
            out.loss.backward()
        if rss0:
            phase("backward", rss0)
        del sup, out  # as in train/loop.py, where the supervision is Trainer.forward's local: gone before the update
        with torch.profiler.record_function("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        if rss0:
            phase("optimizer", rss0)
        return time.perf_counter() - t0

    def peak_of(n: int, by_phase: bool = False) -> tuple[int, int, float]:
        rss0 = _status("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident set
        marks.clear()
        seconds = step(n, rss0 if by_phase else 0)
        peak = max(marks.values()) if by_phase else _status("VmHWM") - rss0
        return peak, rss0, seconds

    step(128)  # optimizer state and the allocator's first arenas
    floor, _, _ = peak_of(128)  # what a step takes whatever T: grads, autocast weight copies, AdamW temporaries
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        rss0 = _status("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")
        with torch_profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                           with_stack=True) as prof:
            seconds = step(T)
        res = {"T": T, "V": V, "mode": mode, "peak_gib": (_status("VmHWM") - rss0) / 2**30, "floor_gib": floor / 2**30,
               "resident_gib": rss0 / 2**30, "seconds": seconds, "tokens_per_s": T / seconds, "profiled": True}
        return {**res, **live_peak(prof)}
    peak, rss0, seconds = peak_of(T, by_phase=phases)
    res = {"T": T, "V": V, "mode": mode, "peak_gib": peak / 2**30, "floor_gib": floor / 2**30,
           "resident_gib": rss0 / 2**30, "seconds": seconds, "tokens_per_s": T / seconds}
    if phases:
        res["phases_gib"] = {k: v / 2**30 for k, v in marks.items()}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    ap.add_argument("--vocabs", type=int, nargs="+", default=[49152, 128256, 152064])
    ap.add_argument("--length-vocab", type=int, default=128256, help="the vocabulary of the length sweep")
    ap.add_argument("--vocab-length", type=int, default=2048, help="the max_length of the vocabulary sweep")
    ap.add_argument("--modes", nargs="+", default=["before", "chunked", "ckpt"], choices=["before", "chunked", "ckpt"])
    ap.add_argument("--before-max-length", type=int, default=4096,
                    help="longest T run in mode `before` (8k x 128k there is 4 GiB of logits and 8 GiB of scores)")
    ap.add_argument("--intermediate", type=int, default=1024, help="the thin body's (and draft's) MLP width")
    ap.add_argument("--draft-vocab", type=int, default=32000)
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--out", default="runs/bench/memory_scaling.json")
    ap.add_argument("--phases", action="store_true", help="each phase's own peak (see the module docstring)")
    ap.add_argument("--profile", action="store_true",
                    help="the T-token step under torch's memory profiler: live-tensor peak by category, largest tensors")
    ap.add_argument("--malloc", nargs="+", default=["default"], choices=["default", "fixed"],
                    help="glibc malloc as it is, and/or with the fixed 1 MiB mmap threshold CPU training runs set "
                         "(draftsmith.train.malloc.fix_malloc): side by side")
    ap.add_argument("--child", nargs=3, type=str, help=argparse.SUPPRESS)
    ap.add_argument("--child-malloc", default="default", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        T, V, mode = int(args.child[0]), int(args.child[1]), args.child[2]
        from draftsmith.train.malloc import fix_malloc  # what a CPU training run does (train/loop.py)

        if args.child_malloc == "fixed" and not fix_malloc():
            raise SystemExit("--malloc fixed: this libc has no mallopt (not glibc)")
        print(json.dumps(one(T, V, mode, args.intermediate, args.draft_vocab, args.ttt_steps, args.phases, args.profile)))
        return

    grid = [(T, args.length_vocab) for T in args.lengths]
    grid += [(args.vocab_length, V) for V in args.vocabs if (args.vocab_length, V) not in grid]
    rows = []
    print(f"{'T':>6} {'V':>7} {'mode':>6} {'malloc':>7} {'peak GiB':>9} {'floor GiB':>9} {'tokens/s':>9} "
          f"{'resident GiB':>13}", flush=True)
    for T, V in grid:
        for mode, alloc in [(m, a) for m in args.modes for a in args.malloc]:
            head = f"{T:>6} {V:>7} {mode:>6} {alloc:>7}"
            if mode == "before" and T > args.before_max_length:
                rows.append({"T": T, "V": V, "mode": mode, "malloc": alloc,
                             "skipped": f"T > --before-max-length {args.before_max_length}"})
                print(f"{head} {'skipped':>9}", flush=True)
                continue
            cmd = [sys.executable, __file__, "--child", str(T), str(V), mode, "--intermediate", str(args.intermediate),
                   "--draft-vocab", str(args.draft_vocab), "--ttt-steps", str(args.ttt_steps), "--child-malloc", alloc,
                   *(["--phases"] if args.phases else []), *(["--profile"] if args.profile else [])]
            res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
            if res.returncode != 0:
                tail = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
                rows.append({"T": T, "V": V, "mode": mode, "malloc": alloc, "error": tail, "rc": res.returncode})
                print(f"{head} failed (rc {res.returncode}): {tail[:120]}", flush=True)
                continue
            r = {**json.loads(res.stdout.strip().splitlines()[-1]), "malloc": alloc}
            rows.append(r)
            print(f"{head} {r['peak_gib']:>9.2f} {r['floor_gib']:>9.2f} {r['tokens_per_s']:>9.0f} "
                  f"{r['resident_gib']:>13.2f}", flush=True)
            if "phases_gib" in r:
                print("         phases (own peak, GiB): " + ", ".join(f"{k} {v:.2f}" for k, v in r["phases_gib"].items()),
                      flush=True)
            if r.get("profiled"):
                print(f"         live tensors at their peak: {r['live_peak_gib']:.2f} GiB ("
                      + ", ".join(f"{k} {v:.2f}" for k, v in r["by_category_gib"].items() if abs(v) >= 0.005) + ")",
                      flush=True)
                for big in r["largest"]:
                    print(f"           {big['gib']:.3f} GiB {big['category']:<15} {big['made_by'][:110]}", flush=True)
    by = {(r["T"], r["V"], r["mode"], r["malloc"]): r for r in rows if "peak_gib" in r}
    print("\nagainst `before`, same (T, V, malloc): peak memory and tokens/s ratios")
    for T, V in grid:
        for alloc in args.malloc:
            b = by.get((T, V, "before", alloc))
            for mode in ("chunked", "ckpt"):
                a = by.get((T, V, mode, alloc))
                if a and b:
                    print(f"  T {T:>5} V {V:>6} {mode:>7} {alloc:>7}: {a['peak_gib']:.2f} / {b['peak_gib']:.2f} GiB = "
                          f"{a['peak_gib'] / b['peak_gib']:.2f}x, tokens/s {a['tokens_per_s'] / b['tokens_per_s']:.2f}x")
    if len(args.malloc) > 1:
        print("\nmalloc fixed against default, same (T, V, mode): peak memory and tokens/s ratios")
        for (T, V, mode, alloc), a in by.items():
            b = by.get((T, V, mode, "default"))
            if alloc == "fixed" and b:
                print(f"  T {T:>5} V {V:>6} {mode:>7}: {a['peak_gib']:.2f} / {b['peak_gib']:.2f} GiB = "
                      f"{a['peak_gib'] / b['peak_gib']:.2f}x, tokens/s {a['tokens_per_s'] / b['tokens_per_s']:.2f}x")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    from draftsmith import atomic

    atomic.write_text(Path(args.out), json.dumps({"args": {k: v for k, v in vars(args).items() if k != "child"},
                                                  "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
