"""Real serving speed on vLLM: no speculation vs vLLM ``ngram`` (and ``suffix`` where arctic-inference is
installed: eval/baselines.py) vs draftsmith drafts, one server each.

:func:`measure` starts one vLLM OpenAI server per configuration (same target, same prompt token ids,
sent one at a time = batch 1, greedy), warms it up with one short request, then times every prompt
and reads the spec-decode counters from ``/metrics`` before and after (the same parsing as
``bench-server``, :mod:`draftsmith.eval.online`). Per configuration it reports output tokens/s,
tau = 1 + accepted / drafts and the acceptance rate per draft position (accepted at position i /
drafts), vLLM's own definitions, and the tokens per target forward (:func:`tokens_per_step`), the one
that compares a method that drafts on every step with one that drafts only where a lookup matches.
:func:`best_by_kind` keeps each kind's best K and :func:`one_line` turns that into the sentence a user
reads. bench/serve_speedup.py is the command-line front end.

Starting servers is slow (tens of seconds each on CPU), so nothing here runs at import time and
the server is always stopped (:class:`draftsmith.serve.process.ServerProcess`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from draftsmith.eval import EvalError
from draftsmith.eval.baselines import KINDS, spec as baseline_spec
from draftsmith.eval.online import HttpClient, counter_diff, vllm_spec_counters
from draftsmith.eval.prompts import PROMPT_SETS, EvalPrompt, render_prompt

__all__ = ["configurations", "measure", "tokens_per_step", "run_config", "serve_prompt_sets", "settled_counters",
           "best_by_kind", "one_line", "render_prompts", "describe_prompt_set", "outputs_identical"]

SET_TITLES = {"mt_bench": "MT-Bench", "gsm8k": "GSM8K", "humaneval": "HumanEval",
              "mixed": "mixed (chat, math, code, long)"}
_ZERO = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "per_position": {}}


def render_prompts(tokenizer: Any, prompts: Sequence[EvalPrompt | str],
                   chat_template_kwargs: Optional[dict] = None) -> list[list[int]]:
    """Prompts -> token ids with the target tokenizer's chat template (first turn, after any context).

    A plain string is one user turn. Rendering here and sending ids to ``/v1/completions`` means
    every configuration sees exactly the same tokens. ``chat_template_kwargs`` (a dict) is passed
    through to ``apply_chat_template``.
    """
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
        raise EvalError(f"chat_template_kwargs: expected a JSON object, got {type(chat_template_kwargs).__name__}; "
                        "pass e.g. '{\"enable_thinking\": false}'")
    out = []
    for p in prompts:
        messages = ([{"role": "user", "content": p}] if isinstance(p, str)
                    else [*p.context, {"role": "user", "content": p.turns[0]}])
        out.append(render_prompt(tokenizer, messages, chat_template_kwargs))
    return out


def describe_prompt_set(prompt_set: str | os.PathLike, n: int) -> str:
    """``"6 held-out MT-Bench prompts"`` for a shipped set, ``"6 prompts from FILE"`` otherwise."""
    key = os.fspath(prompt_set)
    if key in PROMPT_SETS:
        return f"{n} held-out {SET_TITLES.get(key, key)} prompts"
    return f"{n} prompts from {key}"


def configurations(draft_labels: Sequence[str], ks: Sequence[int], *, ngram: bool = True,
                   ngram_ks: Optional[Sequence[int]] = None,
                   draft_ks: Optional[dict[str, Sequence[int]]] = None, suffix: bool = False) -> list[dict]:
    """What :func:`measure` runs, in order: no speculation, then per K ngram, suffix and each draft.
    ``ngram_ks`` (default ``ks``) are the K ngram runs at, when it should differ from the drafts'; suffix
    decoding (``suffix``: where :func:`~draftsmith.eval.baselines.suffix_support` says it runs) runs at ngram's.
    ``draft_ks`` gives a draft its own K list (a block draft's useful K, e.g. 3, 7, 15, is not a chain's).

    Each entry: ``{"name", "kind": "none"|"ngram"|"suffix"|"draft", "label", "k"}``; ``label`` is "none",
    "ngram", "suffix" or the draft's label (what :func:`best_by_kind` groups by).
    """
    bad = [k for k in ks if not isinstance(k, int) or isinstance(k, bool) or k < 1]
    if bad or not ks:
        raise EvalError(f"ks: {list(ks)!r} must be one or more integers >= 1 (draft tokens per step); pass e.g. [1, 3]")
    taken = [lb for lb in draft_labels if lb in ("none", *KINDS)]
    if taken:
        raise EvalError(f"drafts: label {taken[0]!r} is reserved for a baseline; name the draft otherwise "
                        "(e.g. eagle3=PATH)")
    own = {lb: list((draft_ks or {}).get(lb) or ks) for lb in draft_labels}
    bad = [(lb, k) for lb, kl in own.items() for k in kl if not isinstance(k, int) or isinstance(k, bool) or k < 1]
    if bad:
        raise EvalError(f"draft {bad[0][0]!r}: K {bad[0][1]!r} must be an integer >= 1")
    out = [{"name": "none", "kind": "none", "label": "none", "k": 0}]
    ngram_ks = list(ks) if ngram_ks is None else list(ngram_ks)
    every = set(ngram_ks if ngram else []).union(*own.values()) if own else set(ngram_ks if ngram else ks)
    for k in sorted(every):
        if ngram and k in ngram_ks:
            out.append({"name": f"ngram K={k}", "kind": "ngram", "label": "ngram", "k": k})
            if suffix:
                out.append({"name": f"suffix K={k}", "kind": "suffix", "label": "suffix", "k": k})
        out += [{"name": f"{lb} K={k}", "kind": "draft", "label": lb, "k": k} for lb in draft_labels if k in own[lb]]
    return out


def settled_counters(client: HttpClient, base: str, tries: int = 10, pause_s: float = 0.2) -> dict:
    """The spec-decode counters once two reads agree (the last step's stats may land just after its
    response); zeros for a server without speculation, which exposes none."""
    prev = vllm_spec_counters(client.request("GET", base + "/metrics").decode()) or _ZERO
    for _ in range(tries):
        time.sleep(pause_s)
        cur = vllm_spec_counters(client.request("GET", base + "/metrics").decode()) or _ZERO
        if cur == prev:
            break
        prev = cur
    return prev


def tokens_per_step(tokens: float, accepted: float) -> float:
    """Generated tokens per target forward: ``tokens / (tokens - accepted)``.

    Each forward emits one token of its own plus the drafted tokens it accepts, so the forwards number
    ``tokens - accepted``. vLLM's tau (``1 + accepted / drafts``) counts only the steps that had a draft:
    a chain draft drafts on every step, so the two agree for it, but ngram and suffix decoding propose
    only where their lookup matches (ngram K=3 on 213 of 608 steps of 9 `mixed` prompts, 2026-12-07), so
    their tau overstates what a step yields. This is the figure that compares across methods; tokens/s
    adds each step's cost.
    """
    steps = tokens - accepted
    return tokens / steps if steps > 0 else 1.0


def serve_prompt_sets(name: str, argv: Sequence[str], port: int, sets: dict[str, Sequence[Sequence[int]]],
                      max_tokens: int, log: Path, *, preload: str = "", env: Optional[dict] = None,
                      ready_s: float = 600.0) -> dict[str, dict]:
    """Start one server, warm up, then time each prompt set in turn (every prompt alone, greedy) with
    its own counter diff; stop the server. One start serves several sets: on CPU a start costs tens
    of seconds.

    Returns ``{set name: {"name", "tokens", "wall_s", "tokens_per_s", "ready_s", "drafts",
    "draft_tokens", "accepted", "tau", "tokens_per_step", "per_position", "outputs"}}`` (tau is 1.0 when
    nothing was drafted).
    """
    from draftsmith.serve.process import ServerProcess, sigterm_exits

    server_env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
                  **(env or {})}
    if preload:  # vLLM CPU warns that speculative decoding is much slower without Intel OpenMP preloaded
        server_env["LD_PRELOAD"] = ":".join(p for p in (preload, os.environ.get("LD_PRELOAD", "")) if p)
    client = HttpClient(retries=2, timeout_s=600.0)
    out: dict[str, dict] = {}
    t0 = time.monotonic()
    # a SIGTERM (timeout, a scheduler, kill) stops the server on its way out instead of leaving it running
    with sigterm_exits(), ServerProcess(argv, port, log, env=server_env, ready_s=ready_s, stop_s=60) as srv:
        ready, base = time.monotonic() - t0, srv.base  # a fresh port if the first was taken meanwhile
        model = client.get_json(base + "/v1/models")["data"][0]["id"]

        def complete(ids: Sequence[int]) -> list[int]:
            body = {"model": model, "prompt": list(ids), "max_tokens": max_tokens, "temperature": 0.0,
                    "return_token_ids": True}
            return client.post_json(base + "/v1/completions", body)["choices"][0]["token_ids"]

        complete(next(iter(sets.values()))[0][:16])  # warm-up (first-request compilation and allocation), not timed
        for set_name, prompts in sets.items():
            before = settled_counters(client, base)
            t = time.monotonic()
            outs = [complete(p) for p in prompts]
            wall = time.monotonic() - t
            diff = counter_diff(before, settled_counters(client, base))
            drafts = diff["drafts"]
            tokens = sum(len(o) for o in outs)
            per_pos = [diff["per_position"][i] for i in sorted(diff["per_position"])]
            out[set_name] = {
                "name": name, "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall if wall > 0 else 0.0,
                "ready_s": ready, "drafts": drafts, "draft_tokens": diff["draft_tokens"], "accepted": diff["accepted"],
                "tau": 1.0 + diff["accepted"] / drafts if drafts else 1.0,
                "tokens_per_step": tokens_per_step(tokens, diff["accepted"]),
                "per_position": [a / drafts for a in per_pos] if drafts else [], "outputs": outs}
    return out


def run_config(name: str, argv: Sequence[str], port: int, prompts: Sequence[Sequence[int]], max_tokens: int,
               log: Path, *, preload: str = "", env: Optional[dict] = None, ready_s: float = 600.0) -> dict:
    """:func:`serve_prompt_sets` with one set: one server, ``prompts`` timed, its result dict."""
    return serve_prompt_sets(name, argv, port, {"prompts": prompts}, max_tokens, log, preload=preload, env=env,
                             ready_s=ready_s)["prompts"]


def measure(target: str, drafts: dict, ks: Sequence[int], prompts: Sequence[Sequence[int]], max_tokens: int = 128,
            *, dtype: str = "float32", ngram: bool = True, log_dir: str | os.PathLike = ".", preload: str = "",
            progress: Optional[Callable[[dict], None]] = None, max_model_len: int = 2048,
            extra: Sequence[str] = ("--enforce-eager", "--seed", "0"), env: Optional[dict] = None,
            ready_s: float = 600.0, ngram_ks: Optional[Sequence[int]] = None,
            draft_ks: Optional[dict[str, Sequence[int]]] = None, suffix: bool = False) -> list[dict]:
    """Serve ``target`` once per configuration (:func:`configurations`) and time the same prompts on each.

    ``drafts`` maps a label to a resolved draft (:func:`draftsmith.serve.resolve.resolve_draft`),
    launched exactly as ``draftsmith serve vllm`` would (:func:`draftsmith.serve.vllm.plan_vllm`);
    ``prompts`` are token ids (:func:`render_prompts`). Each server's log is
    ``log_dir/serve_<name>.log``; ``progress(result)`` is called after each configuration. Returns
    :func:`run_config`'s dicts with ``kind``, ``label`` and ``k`` added, baseline ("none") first.
    """
    from draftsmith.serve.process import free_port
    from draftsmith.serve.vllm import plan_vllm, vllm_argv

    if not prompts:
        raise EvalError("prompts: empty; pass at least one prompt (token ids, see render_prompts)")
    too_long = [(i, len(p)) for i, p in enumerate(prompts) if len(p) + max_tokens > max_model_len]
    if too_long:  # vLLM would reject the request after a long start-up; fail before any server
        i, n = too_long[0]
        raise EvalError(f"prompts[{i}]: {n} tokens + max_tokens {max_tokens} > max_model_len {max_model_len}; "
                        "use shorter prompts, a smaller max_tokens or a larger max_model_len")
    configs = configurations(list(drafts), list(ks), ngram=ngram, ngram_ks=ngram_ks, draft_ks=draft_ks, suffix=suffix)
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    common = dict(dtype=dtype, max_model_len=max_model_len, extra=list(extra))
    results = []
    for c in configs:
        port = free_port()
        if c["kind"] == "draft":
            argv = plan_vllm(target, drafts[c["label"]], k=c["k"], port=port, **common).argv
        else:
            # each prompt is decoded once (after a warm-up on a prefix of the first): suffix decoding keeps
            # its global tree of past responses, as served
            spec = None if c["kind"] == "none" else baseline_spec(c["kind"], c["k"])
            argv = vllm_argv(target, spec, port=port, **common)
        log = log_dir / f"serve_{c['name'].replace(' ', '_')}.log"
        r = run_config(c["name"], argv, port, prompts, max_tokens, log, preload=preload, env=env, ready_s=ready_s)
        r.update(kind=c["kind"], label=c["label"], k=c["k"])
        results.append(r)
        if progress is not None:
            progress(r)
    return results


def outputs_identical(results: Sequence[dict]) -> bool:
    """Whether every configuration generated the same tokens (greedy fp32 speculation is lossless)."""
    return all(r["outputs"] == results[0]["outputs"] for r in results)


def best_by_kind(results: Sequence[dict]) -> dict[str, dict]:
    """The fastest result (tokens/s) per label: "none", "ngram", "suffix" and each draft label, in first-seen order.

    Ties keep the smaller K (the first measured), so the choice is stable.
    """
    best: dict[str, dict] = {}
    for r in results:
        label = r.get("label", r.get("kind", r["name"]))
        if label not in best or r["tokens_per_s"] > best[label]["tokens_per_s"]:
            best[label] = r
    return best


def one_line(results: Sequence[dict], baseline: Optional[dict] = None, *, prompts: str = "the prompts") -> str:
    """One sentence with each kind's best K against ``baseline`` (default: the "none" result), e.g.

    ``real speed on 6 held-out MT-Bench prompts (vLLM, batch 1): no speculation 22.1 tok/s |
    ngram K=3 26.4 tok/s (1.19x, tau 2.31, 1.42 tokens/step) | eagle3 K=1 24.0 tok/s (1.09x, tau 1.29,
    1.29 tokens/step)`` (tau over the drafted steps, as vLLM counts it; tokens/step over all of them:
    :func:`tokens_per_step`).
    ``prompts`` describes what was sent (:func:`describe_prompt_set`).
    """
    best = best_by_kind(results)
    if baseline is None:
        baseline = best.get("none")
    if baseline is None or not baseline.get("tokens_per_s"):
        raise EvalError("one_line: no baseline without speculation among the results; measure the 'none' "
                        "configuration or pass baseline=")
    parts = [f"no speculation {baseline['tokens_per_s']:.1f} tok/s"]
    for label, r in best.items():
        if r is baseline or label == "none":
            continue
        per_step = r.get("tokens_per_step")
        parts.append(f"{label} K={r['k']} {r['tokens_per_s']:.1f} tok/s "
                     f"({r['tokens_per_s'] / baseline['tokens_per_s']:.2f}x, tau {r['tau']:.2f}"
                     + (f", {per_step:.2f} tokens/step)" if per_step is not None else ")"))
    return f"real speed on {prompts} (vLLM, batch 1): " + " | ".join(parts)
