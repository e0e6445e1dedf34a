"""``draftsmith check``: served acceptance next to the exact offline acceptance, and why they differ.

The same prompts are decoded twice, greedily, one at a time:

- served: a real vLLM OpenAI server (started here exactly as ``draftsmith serve vllm`` starts it, or
  a running one at ``--url``) gets each prompt as chat messages (the server renders its template,
  as a user's client would) with ``return_token_ids``; the spec-decode counters of ``/metrics``
  (drafts, accepted at each position; :mod:`draftsmith.eval.online`) are read before and after every
  request, so each prompt has its own counts;
- offline: the engine-free evaluator (:mod:`draftsmith.eval.offline`: hf target in fp32 + the draft's
  own proposer, whose tau equals vLLM's) on the prompts rendered the way the draft was trained
  (its checkpoint's chat template kwargs and template).

Both give per-position acceptance (unconditional, and conditional on the earlier positions) and
tau, overall, per prompt category and per prompt-length bucket. :mod:`draftsmith.eval.gap` decides
whether served falls short of offline beyond the sample's noise; when it does, the causes it can
test are tested (:mod:`draftsmith.eval.causes`) and the command exits 1 naming them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional, Sequence

from draftsmith import atomic
from draftsmith.eval import EvalError
from draftsmith.eval.gap import PromptCounts, compare_sides
from draftsmith.eval.online import HttpClient, counter_diff, vllm_spec_counters
from draftsmith.eval.prompts import EvalPrompt, render_prompt
from draftsmith.eval.report import counter_stats

__all__ = ["OfflineDecoder", "measure_served", "served_facts", "group_rows", "build_check_report",
           "length_bucket", "CHECK_ENV"]

# The server check starts exposes /server_info (its resolved config: draft path, dtype, K), which the
# cause tests read; vLLM serves that route only in dev mode.
CHECK_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_SERVER_DEV_MODE": "1"}
BUCKET_EDGES = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


def length_bucket(n: int) -> str:
    """Prompt-length bucket label: ``<128``, ``128-255``, ..., ``>=32768``."""
    lo = 0
    for edge in BUCKET_EDGES:
        if n < edge:
            return f"<{edge}" if lo == 0 else f"{lo}-{edge - 1}"
        lo = edge
    return f">={BUCKET_EDGES[-1]}"


# ---------------------------------------------------------------------------------- served side
def settled(client: HttpClient, base: str, tries: int = 10, pause_s: float = 0.1) -> dict:
    """The spec-decode counters once two reads agree (a request's last step may land after its reply)."""
    read = lambda: vllm_spec_counters(client.request("GET", base + "/metrics").decode())  # noqa: E731
    prev = read()
    if prev is None:
        raise EvalError(f"{base}/metrics has no vllm:spec_decode_* counters; check needs a vLLM server with "
                        "speculative decoding (--speculative-config), or drop --url to let check start one")
    for _ in range(tries):
        time.sleep(pause_s)
        cur = read()
        if cur == prev:
            break
        prev = cur
    return prev


def served_facts(client: HttpClient, base: str) -> dict:
    """What the server says about itself: model name and max_model_len (/v1/models), and, where the
    server exposes ``/server_info`` (vLLM dev mode, which ``check`` turns on for servers it starts),
    its dtype, K and the draft directory it loaded. Missing facts are None."""
    data = client.get_json(base + "/v1/models").get("data") or []
    if not data:
        raise EvalError(f"{base}/v1/models lists no model; is this an OpenAI-compatible vLLM server?")
    facts = {"model": data[0]["id"], "max_model_len": data[0].get("max_model_len"), "dtype": None, "k": None,
             "draft_dir": None, "method": None, "source": "/v1/models"}
    probe = HttpClient(retries=0, timeout_s=60.0)
    try:
        info = probe.get_json(base + "/server_info?config_format=json")
    except (EvalError, ValueError):
        return facts
    cfg = info.get("vllm_config") if isinstance(info, dict) else None
    if isinstance(cfg, dict):
        spec = cfg.get("speculative_config") or {}
        model = cfg.get("model_config") or {}
        draft = spec.get("model") or (spec.get("draft_model_config") or {}).get("model")
        facts.update(dtype=str(model.get("dtype")).replace("torch.", "") if model.get("dtype") else None,
                     k=spec.get("num_speculative_tokens"), method=spec.get("method"),
                     draft_dir=draft if draft and Path(str(draft)).is_dir() else None,
                     max_model_len=facts["max_model_len"] or model.get("max_model_len"), source="/server_info")
    return facts


def measure_served(client: HttpClient, base: str, model: str, prompts: Sequence[EvalPrompt], *, k: int,
                   max_tokens: int, ignore_eos: bool = False, extra: Optional[dict] = None,
                   log=None) -> list[dict]:
    """Every prompt (first turn, after its context) as a chat request, one at a time, greedy -> one
    record per prompt: ``prompt_token_ids`` (as the server rendered them), ``token_ids`` (its answer),
    and this request's counter differences ``drafts``, ``accepted``, ``per_position`` (K entries)."""
    out = []
    for n, p in enumerate(prompts):
        messages = [*p.context, {"role": "user", "content": p.turns[0]}]
        body: dict = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
                      "return_token_ids": True, **(extra or {})}
        if ignore_eos:
            body["ignore_eos"] = True
        before = settled(client, base)
        resp = client.post_json(base + "/v1/chat/completions", body)
        diff = counter_diff(before, settled(client, base))
        choice = resp["choices"][0]
        per = [int(diff["per_position"].get(i, 0)) for i in range(k)]
        out.append({"id": p.id, "category": p.category, "prompt_token_ids": resp.get("prompt_token_ids"),
                    "token_ids": choice.get("token_ids"), "drafts": int(diff["drafts"]),
                    "accepted": int(diff["accepted"]), "per_position": per})
        if log:
            tau = 1 + diff["accepted"] / diff["drafts"] if diff["drafts"] else float("nan")
            log(f"served [{n + 1}/{len(prompts)}] {p.id}: {len(choice.get('token_ids') or [])} tokens, tau {tau:.2f}")
    return out


# ---------------------------------------------------------------------------------- offline side
class OfflineDecoder:
    """The hf target and the draft loaded once; :meth:`decode` runs exact speculative decoding on
    token ids, optionally with the target reading other layer ids or the draft's d2t lost (the
    variations :mod:`draftsmith.eval.causes` reruns)."""

    def __init__(self, target: str, draft_dir: Path, *, dtype: str = "float32", device: str = "cpu"):
        from draftsmith.drafts import get_family
        from draftsmith.eval.offline import family_of_dir, load_draft
        from draftsmith.targets.contract import engine_default_aux_layer_ids
        from draftsmith.targets.hf import HFEngine

        self.engine = HFEngine(target, dtype=dtype, device=device)
        info = self.engine.info()
        self.num_layers = info.num_layers
        self.family = get_family(family_of_dir(draft_dir))
        self.notes: list[str] = []
        try:
            _, self.draft, self.aux_ids, self.draft_dir = load_draft(
                draft_dir, self.engine.embeddings(),
                self.engine.lm_head_weight() if self.family.borrows_lm_head else None,
                default_layer_ids=engine_default_aux_layer_ids(info.num_layers), notes=self.notes)
        except Exception:
            self.engine.close()
            raise
        c = self.draft.cfg
        if c.vocab_size != info.vocab_size or c.target_hidden_size != info.hidden_size:
            self.engine.close()
            raise EvalError(f"--draft {draft_dir}: built for vocab {c.vocab_size} / hidden {c.target_hidden_size} "
                            f"but target {target} has vocab {info.vocab_size} / hidden {info.hidden_size}; "
                            "pass the target the draft was trained for")
        self.draft = self.draft.to(self.engine.device)
        self.proposer = self.family.Proposer(self.draft)
        self.tokenizer = self.engine.tokenizer

    def render(self, prompts: Sequence[EvalPrompt], template_kwargs: Optional[dict],
               chat_template: Optional[str] = None) -> list[list[int]]:
        """Prompt token ids as the draft was trained: ``chat_template`` (a Jinja string; None = the
        tokenizer's) with ``template_kwargs``."""
        tok = self.tokenizer
        saved = tok.chat_template
        if chat_template is not None:
            tok.chat_template = chat_template
        try:
            return [render_prompt(tok, [*p.context, {"role": "user", "content": p.turns[0]}], template_kwargs)
                    for p in prompts]
        finally:
            tok.chat_template = saved

    def eos_ids(self) -> list[int]:
        from draftsmith.eval.offline import eos_ids_of

        return eos_ids_of(self.tokenizer, self.engine.model)

    def decode(self, prompt_ids: Sequence[Sequence[int]], *, k: int, max_new_tokens: int, eos_ids: Sequence[int],
               aux_ids: Optional[Sequence[int]] = None, lose_d2t: bool = False) -> list[dict]:
        """Greedy speculative decoding of each prompt -> [{"token_ids", "drafts", "accepted", "per_position"}]."""
        import torch

        from draftsmith.eval.offline import HFTarget
        from draftsmith.eval.report import acceptance_stats
        from draftsmith.eval.speculative import generate_speculative

        target = HFTarget(self.engine.model, list(aux_ids) if aux_ids is not None else self.aux_ids)
        d2t = getattr(self.draft, "d2t", None)
        saved = d2t.clone() if (lose_d2t and d2t is not None) else None
        mapped = getattr(self.proposer, "target_ids", None) if saved is not None else None
        if saved is not None:
            with torch.no_grad():
                d2t.zero_()  # draft ids read as target ids: what an engine does with a lost d2t
            if mapped is not None:  # a proposer that cached the map (EAGLE-3's draft id -> target id)
                self.proposer.target_ids = torch.arange(mapped.numel(), device=mapped.device)
        try:
            out = []
            for ids in prompt_ids:
                r = generate_speculative(target, self.proposer, list(ids), k=k, max_new_tokens=max_new_tokens,
                                         temperature=0.0, eos_ids=eos_ids)
                s = acceptance_stats(r.accepted, k)
                out.append({"token_ids": list(r.tokens), "drafts": s["drafts"], "accepted": s["accepted"],
                            "per_position": s["accepted_per_position"]})
            return out
        finally:
            if saved is not None:
                with torch.no_grad():
                    d2t.copy_(saved)
                if mapped is not None:
                    self.proposer.target_ids = mapped

    def close(self) -> None:
        self.engine.close()


# ---------------------------------------------------------------------------------- report
def counts(records: Sequence[dict]) -> list[PromptCounts]:
    return [PromptCounts(int(r["drafts"]), [int(c) for c in r["per_position"]]) for r in records]


def side_row(records: Sequence[dict], k: int) -> dict:
    """counter_stats over records (drafts, accepted, tau, acceptance and conditional acceptance per position)."""
    return counter_stats(sum(r["drafts"] for r in records), sum(r["accepted"] for r in records),
                         [sum(r["per_position"][i] for r in records) for i in range(k)])


def group_rows(prompts: Sequence[EvalPrompt], served: Sequence[dict], offline: Sequence[dict], k: int,
               key, *, alpha: float, margin: float, resamples: int) -> dict:
    """{group: {"prompts", "served", "offline", "comparison"}} with prompts grouped by ``key(i)``."""
    groups: dict[str, list[int]] = {}
    for i in range(len(prompts)):
        groups.setdefault(key(i), []).append(i)
    out = {}
    for name, idx in sorted(groups.items()):
        s, o = [served[i] for i in idx], [offline[i] for i in idx]
        out[name] = {"prompts": len(idx), "served": side_row(s, k), "offline": side_row(o, k),
                     "comparison": compare_sides(counts(s), counts(o), k, alpha=alpha, margin=margin,
                                                 resamples=resamples)}
    return out


def build_check_report(prompts: Sequence[EvalPrompt], served: Sequence[dict], offline: Sequence[dict], *, k: int,
                       offline_prompt_ids: Sequence[Sequence[int]], config: dict, alpha: float = 0.05,
                       margin: float = 0.01, resamples: int = 2000) -> dict:
    """Served and offline records (one per prompt, same order) -> the check report (without causes)."""
    if len(served) != len(prompts) or len(offline) != len(prompts):
        raise EvalError(f"check: {len(prompts)} prompts but {len(served)} served / {len(offline)} offline records")
    comparison = compare_sides(counts(served), counts(offline), k, alpha=alpha, margin=margin, resamples=resamples)
    kw = dict(alpha=alpha, margin=margin, resamples=max(200, resamples // 4))
    lengths = [len(ids) for ids in offline_prompt_ids]
    records = [{"id": p.id, "category": p.category, "prompt_tokens": lengths[i],
                "served": {key: served[i][key] for key in ("drafts", "accepted", "per_position")},
                "offline": {key: offline[i][key] for key in ("drafts", "accepted", "per_position")},
                "same_prompt_ids": (list(served[i]["prompt_token_ids"]) == list(offline_prompt_ids[i])
                                    if served[i].get("prompt_token_ids") is not None else None),
                "same_tokens": (list(served[i]["token_ids"]) == list(offline[i]["token_ids"])
                                if served[i].get("token_ids") is not None else None)}
               for i, p in enumerate(prompts)]
    return {
        "mode": "check", "config": dict(config),
        "served": side_row(served, k), "offline": side_row(offline, k), "comparison": comparison,
        "categories": group_rows(prompts, served, offline, k, lambda i: prompts[i].category, **kw),
        "context_buckets": group_rows(prompts, served, offline, k, lambda i: length_bucket(lengths[i]), **kw),
        "records": records, "causes": [], "warnings": [],
        "verdict": "shortfall" if comparison["shortfall"] else "ok",
    }


def _f(v: Any, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def format_check(report: dict) -> str:
    """The side-by-side table a user reads: per position, then per category and per length bucket."""
    cmp = report["comparison"]
    s, o = report["served"], report["offline"]
    lines = [f"{'pos':>4}  {'served':>7}  {'offline':>7}  {'gap':>7}  {'bound (lower, upper)':>22}  "
             f"{'cond served':>11}  {'cond offline':>12}"]
    for r, cs, co in zip(cmp["positions"], s["conditional_acceptance_per_position"],
                         o["conditional_acceptance_per_position"]):
        lines.append(f"{r['position']:>4}  {_f(r['served']):>7}  {_f(r['offline']):>7}  {_f(r['gap'], '+.3f'):>7}  "
                     f"{'(' + _f(r['lower'], '+.3f') + ', ' + _f(r['upper'], '+.3f') + ')':>22}  "
                     f"{_f(cs):>11}  {_f(co):>12}" + ("  SHORT" if r["shortfall"] else ""))
    t = cmp["tau"]
    lines.append(f"tau served {_f(t['served'])} ({s['drafts']} drafts)  offline {_f(t['offline'])} ({o['drafts']} "
                 f"drafts)  gap {_f(t['gap'], '+.3f')} [{_f(t['lower'], '+.3f')}, {_f(t['upper'], '+.3f')}]")
    for title, key in (("category", "categories"), ("prompt tokens", "context_buckets")):
        groups = report[key]
        if len(groups) < 2:
            continue
        lines.append(f"{title:<16} {'prompts':>7}  {'tau served':>10}  {'tau offline':>11}  acceptance per position "
                     "served | offline")
        per = lambda row: "/".join(_f(a, ".2f") for a in row["acceptance_per_position"])  # noqa: E731
        for name, g in groups.items():
            lines.append(f"{name:<16} {g['prompts']:>7}  {_f(g['served']['tau']):>10}  {_f(g['offline']['tau']):>11}  "
                         f"{per(g['served'])} | {per(g['offline'])}" + ("  SHORT" if g["comparison"]["shortfall"] else ""))
    same = [r["same_tokens"] for r in report["records"] if r["same_tokens"] is not None]
    if same:
        lines.append(f"served answers identical to offline: {sum(same)}/{len(same)} prompts")
    lines.append(f"statistics: {cmp['method']}")
    for w in report.get("warnings", []):
        lines.append(f"warning: {w}")
    for c in report.get("causes", []):
        lines.append(f"cause {c['status']:<10} {c['cause']}: {c['evidence']}" + (f" -> {c['fix']}" if c.get("fix") else ""))
    return "\n".join(lines)


def plot_check(report: dict, path: Path) -> Optional[Path]:
    """PNG: served and offline per-position acceptance (solid, with the gap's bound as a band around the
    offline curve) and their conditional acceptance (dashed). None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    cmp, s, o = report["comparison"], report["served"], report["offline"]
    xs = [r["position"] for r in cmp["positions"]]
    val = lambda vs: [v if v is not None else float("nan") for v in vs]  # noqa: E731
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    ax.plot(xs, val(o["acceptance_per_position"]), "o-", color="#4C72B0",
            label=f"offline (tau {_f(o['tau'], '.2f')})")
    ax.plot(xs, val(s["acceptance_per_position"]), "s-", color="#C44E52",
            label=f"served (tau {_f(s['tau'], '.2f')})")
    lo = [(r["offline"] or 0) + r["lower"] for r in cmp["positions"]]
    hi = [(r["offline"] or 0) + r["upper"] for r in cmp["positions"]]
    ax.fill_between(xs, lo, hi, color="#C44E52", alpha=0.15, label="served bound (offline + gap interval)")
    ax.plot(xs, val(o["conditional_acceptance_per_position"]), "o--", color="#4C72B0", alpha=0.6,
            label="offline conditional")
    ax.plot(xs, val(s["conditional_acceptance_per_position"]), "s--", color="#C44E52", alpha=0.6,
            label="served conditional")
    ax.set_xticks(xs)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("draft position i")
    ax.set_ylabel("acceptance")
    ax.set_title(f"draftsmith check: {report['verdict']} (K={len(xs)})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic.replacing(path) as tmp:
            fig.savefig(tmp, format="png")  # format named: the temporary's suffix is .tmp
    finally:
        plt.close(fig)
    return path


def write_check(report: dict, out_dir: Path, plot: bool = True) -> dict[str, Path]:
    """``check.json`` (atomic) and ``check.png`` beside it; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "check.json"}
    atomic.write_json(paths["json"], report)
    if plot:
        png = plot_check(report, out_dir / "check.png")
        if png is not None:
            paths["plot"] = png
        else:
            report["warnings"].append("matplotlib is not installed: no check.png (pip install matplotlib)")
    return paths
