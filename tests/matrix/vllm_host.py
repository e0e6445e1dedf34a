"""Every vLLM leg of the target matrix in ONE process: vLLM is imported once and each engine runs inside
this process (VLLM_ENABLE_V1_MULTIPROCESSING=0: ~2-5 s an engine start instead of ~20 s), so eleven rows
cost two engine starts each (features, then the served draft) and one import.

    python vllm_host.py JOBS_JSON OUT_DIR

JOBS_JSON: a list of {"row", "target", "draft" (vLLM export dir), "k", "prompts" ([[ids]]), "max_tokens",
"feature_ids" (engine layer ids), "rows" ([[ids]], the feature batch), "model_impl" ("auto" | "transformers")}.
Per job it writes OUT_DIR/<row>_vllm.pt (the vllm engine's aux states and logits) and prints one line
`RESULT {"row", "features" ("ok" or the error line), "tokens", "drafts", "draft_tokens", "accepted",
"accepted_per_position"}`, with "error" (and "trace") in place of the served fields where serving failed;
a row's failure does not stop the others.
"""

import gc
import json
import os
import sys
import traceback
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def features(job: dict, out: Path) -> None:
    import torch

    from draftsmith.targets import Batch, open_engine

    kw = {"model_impl": "transformers"} if job["model_impl"] == "transformers" else {}
    eng = open_engine("vllm", job["target"], dtype="float32", engine_kwargs={**kw, "max_model_len": 256})
    try:
        ids = torch.tensor(job["rows"])
        ones = torch.ones_like(ids)
        f = eng.features(Batch(ids, ones, ones), job["feature_ids"], logits=True)
        torch.save({"aux": f.aux_hidden, "logits": f.logits}, out / f"{job['row']}_vllm.pt")
    finally:
        eng.close()


def serve(job: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw = {"model_impl": "transformers"} if job["model_impl"] == "transformers" else {}
    llm = LLM(model=job["target"], dtype="float32", max_model_len=256, enforce_eager=True, seed=0,
              disable_log_stats=False, speculative_config={"method": "eagle3", "model": job["draft"],
                                                           "num_speculative_tokens": int(job["k"])}, **kw)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=int(job["max_tokens"]), ignore_eos=True)
        res = {"row": job["row"], "tokens": [], "drafts": 0, "draft_tokens": 0, "accepted": 0,
               "accepted_per_position": [0] * int(job["k"])}
        for p in job["prompts"]:  # one at a time: batch 1, as draftsmith eval decodes
            out = llm.generate([TokensPrompt(prompt_token_ids=p)], params, use_tqdm=False)
            res["tokens"].append(list(out[0].outputs[0].token_ids))
        for m in llm.get_metrics():  # counters are cumulative over the engine's life: read once at the end
            if m.name == "vllm:spec_decode_num_drafts":
                res["drafts"] += int(m.value)
            elif m.name == "vllm:spec_decode_num_draft_tokens":
                res["draft_tokens"] += int(m.value)
            elif m.name == "vllm:spec_decode_num_accepted_tokens":
                res["accepted"] += int(m.value)
            elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
                res["accepted_per_position"] = [a + int(v) for a, v in zip(res["accepted_per_position"], m.values)]
        return res
    finally:
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # best effort; gc below frees the rest
            pass
        del llm
        gc.collect()


def main() -> None:
    jobs = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    from draftsmith.targets.contract import TargetError

    for job in jobs:
        rec = {"row": job["row"]}
        try:
            features(job, out)
            rec["features"] = "ok"
        except Exception as e:  # a row's tested one-line refusal, or a failure the test names
            rec["features"] = f"{type(e).__name__}: {e}"
            rec["features_trace"] = traceback.format_exc()[-3000:]
        try:
            rec.update(serve(job))
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {e}"
            rec["trace"] = traceback.format_exc()[-3000:]
        print("RESULT " + json.dumps(rec), flush=True)

if __name__ == "__main__":
    main()
