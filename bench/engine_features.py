"""Features throughput of the hf and vllm engines on SmolLM2, same batches, one run.

    python bench/engine_features.py [--batches 8] [--batch-size 4] [--max-length 512] [--dtype float32]

Runs the EAGLE-3 feature request the trainer makes (default aux ids + logits) over the longest
ShareGPT conversations, first with the hf engine, then with the vllm engine (extract_hidden_states +
logits rebuilt from id L), and prints real tokens/s for each, vLLM's start-up time separately, and
the largest logits difference between the two (a parity check on a real target).
Needs the __main__ guard: the vllm engine spawns workers. What the engines print (vLLM's start-up,
warnings) goes to ``--log`` (default runs/bench/engine_features.log), not to the terminal.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--log", default="runs/bench/engine_features.log", help="where the engines' own output goes")
    args = ap.parse_args()
    from draftsmith import console

    print(f"engine logs (vLLM, transformers, warnings): {args.log}", flush=True)
    with console.engine_logs(args.log):
        report = measure(args)
    print(json.dumps(report))


def measure(args: argparse.Namespace) -> dict:

    from transformers import AutoTokenizer

    from draftsmith.data.dataset import build_examples, collate
    from draftsmith.data.sources import load_conversations
    from draftsmith.models import resolve_target
    from draftsmith.targets import open_engine
    from draftsmith.targets.contract import default_aux_layer_ids

    target = resolve_target("smollm2")
    tok = AutoTokenizer.from_pretrained(target)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    convs, _ = load_conversations(["builtin:sharegpt"], max_rows=400, seed=0)
    examples, _ = build_examples(convs, tok, args.max_length)
    rows = sorted(examples, key=lambda e: -len(e.input_ids))[: args.batches * args.batch_size]
    batches = [collate(rows[i : i + args.batch_size], pad) for i in range(0, len(rows), args.batch_size)]
    n_tok = sum(int(b.attention_mask.sum()) for b in batches)

    report: dict = {"target": "SmolLM2-135M-Instruct", "dtype": args.dtype, "batches": len(batches),
                    "batch_size": args.batch_size, "real_tokens": n_tok, "threads": torch.get_num_threads()}
    first_logits: dict = {}
    for name, kwargs in (("hf", {}),
                         ("vllm", {"engine_kwargs": {"max_model_len": args.max_length + 8,
                                                     "max_num_batched_tokens": args.max_length * args.batch_size}})):
        t = time.perf_counter()
        eng = open_engine(name, target, dtype=args.dtype, **kwargs)
        ids = default_aux_layer_ids(eng.info().num_layers)
        eng.features(batches[0], ids, logits=True)  # warm-up; builds vLLM's LLM for these capture ids
        report[f"{name}_startup_s"] = round(time.perf_counter() - t, 1)
        t = time.perf_counter()
        for i, b in enumerate(batches):
            f = eng.features(b, ids, logits=True)
            if i == 0:
                first_logits[name] = f.logits[b.attention_mask.bool()]
        s = time.perf_counter() - t
        report[f"{name}_tokens_per_s"] = round(n_tok / s, 1)
        eng.close()
    report["max_abs_logits_diff"] = float((first_logits["hf"] - first_logits["vllm"]).abs().max())
    report["vllm_over_hf"] = round(report["vllm_tokens_per_s"] / report["hf_tokens_per_s"], 2)
    return report


if __name__ == "__main__":
    main()
