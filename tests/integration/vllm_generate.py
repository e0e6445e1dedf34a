"""Greedy generation with real vLLM, with and without an EAGLE-3 draft; prints one JSON line.

Run as a script (vLLM spawns workers, so it needs the __main__ guard and its own process):
    python vllm_generate.py TARGET DRAFT_DIR K PROMPT_IDS_JSON MAX_TOKENS
"""

import json
import os
import sys


def generate(llm, prompts, max_tokens):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def spec_counters(llm):
    """Drafts / draft tokens / accepted tokens from vLLM's in-process metrics."""
    totals = {}
    try:
        for m in llm.get_metrics():
            if m.name.startswith("vllm:spec_decode_num_"):
                totals[m.name] = totals.get(m.name, 0) + getattr(m, "value", 0)
    except Exception as e:  # metrics API differences must not hide the generation result
        totals["error"] = repr(e)
    return totals


def main():
    target, draft, k, prompts_json, max_tokens = sys.argv[1:6]
    prompts = json.loads(prompts_json)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    common = dict(model=target, dtype="float32", max_model_len=256, enforce_eager=True, seed=0,
                  disable_log_stats=False)
    llm = LLM(**common)
    plain = generate(llm, prompts, int(max_tokens))
    del llm
    import gc

    gc.collect()
    spec = {"method": "eagle3", "model": draft, "num_speculative_tokens": int(k)}
    llm = LLM(speculative_config=spec, **common)
    with_spec = generate(llm, prompts, int(max_tokens))
    print("RESULT " + json.dumps({"plain": plain, "spec": with_spec, "counters": spec_counters(llm)}), flush=True)


if __name__ == "__main__":
    main()
