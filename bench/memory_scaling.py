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


def one(T: int, V: int, mode: str, intermediate: int, draft_vocab: int, ttt: int) -> dict:
    """One measurement in this process (called in a child); returns the figures as a dict."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftsmith.config import build_config
    from draftsmith.data.vocab_cache import VocabMap
    from draftsmith.drafts import get_family
    from draftsmith.drafts.vocab import build_vocab_maps
    from draftsmith.targets import Batch, supervision_for
    from draftsmith.targets.contract import eagle3_supervision
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

    def step(n: int) -> float:
        g = torch.Generator().manual_seed(n)
        ids = torch.randint(0, V, (1, n), generator=g)
        loss = torch.ones_like(ids)
        loss[:, : n // 10] = 0
        batch = Batch(ids, torch.ones_like(ids), loss)
        t0 = time.perf_counter()
        if mode == "before":  # the engine's whole (1, T, V) logits, then the supervision math over them
            sup = eagle3_supervision(batch, engine.features(batch, aux_ids, logits=True), draft_ids)
        else:
            sup = supervision_for(engine, "eagle3", batch, aux_ids, draft_ids)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = draft.supervised(sup)
        out.loss.backward()
        del sup, out  # as in train/loop.py, where the supervision is Trainer.forward's local: gone before the update
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    def peak_of(n: int) -> tuple[int, int, float]:
        rss0 = _status("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident set
        seconds = step(n)
        return _status("VmHWM") - rss0, rss0, seconds

    step(128)  # optimizer state and the allocator's first arenas
    floor, _, _ = peak_of(128)  # what a step takes whatever T: grads, autocast weight copies, AdamW temporaries
    peak, rss0, seconds = peak_of(T)
    return {"T": T, "V": V, "mode": mode, "peak_gib": peak / 2**30, "floor_gib": floor / 2**30,
            "resident_gib": rss0 / 2**30, "seconds": seconds, "tokens_per_s": T / seconds}


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
    ap.add_argument("--child", nargs=3, type=str, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        T, V, mode = int(args.child[0]), int(args.child[1]), args.child[2]
        print(json.dumps(one(T, V, mode, args.intermediate, args.draft_vocab, args.ttt_steps)))
        return

    grid = [(T, args.length_vocab) for T in args.lengths]
    grid += [(args.vocab_length, V) for V in args.vocabs if (args.vocab_length, V) not in grid]
    rows = []
    print(f"{'T':>6} {'V':>7} {'mode':>6} {'peak GiB':>9} {'floor GiB':>9} {'tokens/s':>9} {'resident GiB':>13}",
          flush=True)
    for T, V in grid:
        for mode in args.modes:
            if mode == "before" and T > args.before_max_length:
                rows.append({"T": T, "V": V, "mode": mode, "skipped": f"T > --before-max-length {args.before_max_length}"})
                print(f"{T:>6} {V:>7} {mode:>6} {'skipped':>9}", flush=True)
                continue
            cmd = [sys.executable, __file__, "--child", str(T), str(V), mode, "--intermediate", str(args.intermediate),
                   "--draft-vocab", str(args.draft_vocab), "--ttt-steps", str(args.ttt_steps)]
            res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
            if res.returncode != 0:
                tail = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
                rows.append({"T": T, "V": V, "mode": mode, "error": tail, "rc": res.returncode})
                print(f"{T:>6} {V:>7} {mode:>6} failed (rc {res.returncode}): {tail[:120]}", flush=True)
                continue
            r = json.loads(res.stdout.strip().splitlines()[-1])
            rows.append(r)
            print(f"{T:>6} {V:>7} {mode:>6} {r['peak_gib']:>9.2f} {r['floor_gib']:>9.2f} {r['tokens_per_s']:>9.0f} "
                  f"{r['resident_gib']:>13.2f}", flush=True)
    by = {(r["T"], r["V"], r["mode"]): r for r in rows if "peak_gib" in r}
    print("\nagainst `before`, same (T, V): peak memory and tokens/s ratios")
    for T, V in grid:
        b = by.get((T, V, "before"))
        for mode in ("chunked", "ckpt"):
            a = by.get((T, V, mode))
            if a and b:
                print(f"  T {T:>5} V {V:>6} {mode:>7}: {a['peak_gib']:.2f} / {b['peak_gib']:.2f} GiB = "
                      f"{a['peak_gib'] / b['peak_gib']:.2f}x, tokens/s {a['tokens_per_s'] / b['tokens_per_s']:.2f}x")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(args.out).with_suffix(".tmp")
    tmp.write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "child"}, "rows": rows}, indent=1))
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
