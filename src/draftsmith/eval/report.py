"""Evaluation reports: acceptance statistics, per-category breakdown, terminal table, JSON, PNG plot.

Offline (``draftsmith eval``) and online (``bench-server``) reports share one shape::

    {"mode": "offline" | "online", "config": {...},
     "overall": ROW, "categories": {name: ROW}, "records": [...], ["lossless": {...}]}
    ROW = {"prompts", "drafts", "accepted", "tau", "accepted_per_position", "acceptance_per_position",
           "tokens", "spec_tokens_per_s", "plain_tokens_per_s", "speedup"}

tau = 1 + accepted / drafts (bonus token included, vLLM's mean acceptance length); acceptance at
position i (1-based) = drafts whose first i tokens were all accepted / drafts (vLLM's "per-position
acceptance rate"); conditional acceptance at i = accepted_i / accepted_{i-1} (accepted_0 = drafts), the
chance token i is accepted once tokens 1..i-1 were: the figure to compare with a training run's
``conditional_acceptance``, not its unconditional ``step_accuracy``. An offline report of a pruned draft
also holds ``draft_vocab_coverage``: the share of the target's answer tokens inside the draft vocab.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

__all__ = ["acceptance_stats", "counter_stats", "build_report", "format_table", "plot_acceptance", "write_report"]


def counter_stats(drafts: int, accepted: int, accepted_per_position: Sequence[int]) -> dict:
    """Acceptance figures from counters: tau = 1 + accepted/drafts, rate_i = accepted_i / drafts,
    conditional_i = accepted_i / accepted_{i-1} (accepted_0 = drafts; None where nothing reached i-1)."""
    per = [int(c) for c in accepted_per_position]
    before = [int(drafts)] + per[:-1]  # chains that reached position i
    return {
        "drafts": int(drafts),
        "accepted": int(accepted),
        "tau": 1.0 + accepted / drafts if drafts else None,
        "accepted_per_position": per,
        "acceptance_per_position": [c / drafts if drafts else None for c in per],
        "conditional_acceptance_per_position": [c / b if b else None for c, b in zip(per, before)],
    }


def acceptance_stats(accepted: Sequence[int], k: int) -> dict:
    """Per-round accepted counts (each 0..k) -> :func:`counter_stats` figures."""
    per = [sum(1 for a in accepted if a > i) for i in range(k)]  # rounds whose first i+1 drafts passed
    return counter_stats(len(accepted), sum(accepted), per)


def _rate(tokens: int, seconds: float) -> Optional[float]:
    return tokens / seconds if seconds and seconds > 0 else None


def _offline_row(records: list[dict], k: int) -> dict:
    accepted = [a for r in records for a in r["accepted"]]
    tokens = sum(len(r["token_ids"]) for r in records)
    spec = _rate(tokens, sum(r["spec_s"] for r in records))
    timed = [r for r in records if r.get("plain_s")]
    plain = _rate(sum(r["plain_tokens"] for r in timed), sum(r["plain_s"] for r in timed)) if timed else None
    return {"prompts": len({(r["id"], r["category"]) for r in records}), **acceptance_stats(accepted, k),
            "tokens": tokens, "spec_tokens_per_s": spec, "plain_tokens_per_s": plain,
            "speedup": spec / plain if spec and plain else None}


def build_report(records: list[dict], *, k: int, mode: str = "offline", config: Optional[dict] = None) -> dict:
    """Offline records (one per prompt turn, see eval.offline.evaluate) -> the report dict."""
    categories = sorted({r["category"] for r in records})
    report = {
        "mode": mode,
        "config": dict(config or {}),
        "overall": _offline_row(records, k),
        "categories": {c: _offline_row([r for r in records if r["category"] == c], k) for c in categories},
        "records": records,
    }
    checked = [r for r in records if r.get("matches_plain") is not None]
    if checked:
        report["lossless"] = {"checked": len(checked),
                              "mismatches": [f"{r['id']}#{r['turn']}" for r in checked if not r["matches_plain"]]}
    return report


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def format_table(report: dict) -> str:
    """A fixed-width table: one row per category, then ``all``."""
    k = len(report["overall"]["acceptance_per_position"])
    head = ["category", "prompts", "drafts", "tau"] + [f"acc@{i + 1}" for i in range(k)] + \
        ["spec tok/s", "base tok/s", "speedup"]
    rows = []
    items = list(report["categories"].items())
    if len(items) != 1:
        items.append(("all", report["overall"]))
    for name, r in items:
        rows.append([name, str(r["prompts"]), _fmt(r["drafts"], "d"), _fmt(r["tau"], ".3f")]
                    + [_fmt(a, ".3f") for a in r["acceptance_per_position"]]
                    + [_fmt(r["spec_tokens_per_s"], ".1f"), _fmt(r["plain_tokens_per_s"], ".1f"),
                       _fmt(r["speedup"], ".2f") + ("x" if r["speedup"] is not None else "")])
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    out = [line(head), line(["-" * w for w in widths])] + [line(r) for r in rows]
    cfg = report.get("config", {})
    out.append(f"mode {report['mode']}  K={cfg.get('k', k)}  temperature {cfg.get('temperature', 0)}  "
               f"tau = 1 + accepted/drafts; acc@i = share of drafts whose first i tokens were accepted")
    cond = report["overall"].get("conditional_acceptance_per_position") or []
    if cond:
        out.append("conditional acceptance (token i accepted when 1..i-1 were): "
                   + " / ".join(_fmt(c, ".3f") for c in cond))
    if report.get("draft_vocab_coverage") is not None:
        out.append(f"draft-vocab coverage of the target's answer tokens: {report['draft_vocab_coverage']:.3f} "
                   "(a token outside the pruned draft vocab cannot be drafted)")
    lossless = report.get("lossless")
    if lossless:
        bad = lossless["mismatches"]
        out.append(f"lossless check vs plain greedy: {lossless['checked'] - len(bad)}/{lossless['checked']} identical"
                   + (f"; MISMATCH in {', '.join(bad[:8])}" if bad else ""))
    return "\n".join(out)


def plot_acceptance(report: dict, path: str | Path) -> Path:
    """PNG of per-position acceptance: bars for all prompts, a line per category (matplotlib, Agg)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from draftsmith.eval import EvalError

        raise EvalError("the acceptance plot needs matplotlib; `pip install matplotlib` (or pass --no-plot)") from None
    overall = report["overall"]
    rates = [a or 0.0 for a in overall["acceptance_per_position"]]
    xs = list(range(1, len(rates) + 1))
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    ax.bar(xs, rates, color="#4C72B0", alpha=0.75, label=f"all (tau {_fmt(overall['tau'], '.2f')})")
    if len(report["categories"]) > 1:
        for name, row in report["categories"].items():
            ax.plot(xs, [a or 0.0 for a in row["acceptance_per_position"]], marker="o",
                    label=f"{name} (tau {_fmt(row['tau'], '.2f')})")
    ax.set_xticks(xs)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("draft position i")
    ax.set_ylabel("acceptance rate (first i tokens accepted)")
    ax.set_title(f"{report['mode']} speculative decoding, K={len(rates)}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def write_report(report: dict, out_dir: str | Path, plot: bool = True) -> dict[str, Path]:
    """Write ``report.json`` (+ ``acceptance.png``) under ``out_dir``; return the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "report.json"}
    paths["json"].write_text(json.dumps(report, indent=2) + "\n")
    if plot and report["overall"]["acceptance_per_position"]:  # SGLang gives no per-position rates
        paths["plot"] = plot_acceptance(report, out / "acceptance.png")
    return paths
