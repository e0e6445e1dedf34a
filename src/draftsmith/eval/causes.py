"""Why served acceptance differs from offline: the causes ``draftsmith check`` can test, each tested.

Every test returns ``{"cause", "status", "evidence", "fix"}`` where status is

- ``confirmed``: a difference was found AND the offline decoder rerun with that difference (the
  server's prompt ids, the layer ids it reads, the d2t it lost) reproduces the served acceptance
  (:func:`explains`);
- ``found``: a difference was found between what the draft was trained with and what the server
  was given, but no rerun reproduced the served acceptance (or none was possible);
- ``ruled out``: tested, no difference (or the rerun does not move offline towards served);
- ``not tested``: the facts are not available (the reason is the evidence).

Gap causes (they make served differ from offline): the chat template / system prompt / template
kwargs (the server's ``prompt_token_ids`` against the trained rendering), the layer ids and their
order (the served draft config against the checkpoint; reruns with the served ids, ids off by one,
the engine default, the unsorted order), d2t/t2d (the served copy's map; a rerun with d2t lost) and
dtype (the server's against offline's, identical prompts with other answers pointing to numerics; a
rerun with the target in the server's dtype, bfloat16 when unknown).
Both-sides causes (they lower served and offline alike, so they are warnings, not gap causes): a
serving context longer than the draft's training max_length, K above the depth it was trained for.

Reruns cost one offline decode of the prompt set each, so they only run when served falls short. They
decode what the server was sent (its prompt ids); when those alone reproduce served, the template is
the cause and no other variation is tried (each would "reproduce" it on the same ids).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

from draftsmith.eval.gap import compare_sides

__all__ = ["explains", "template_cause", "layer_cause", "d2t_cause", "dtype_cause", "context_warning",
           "depth_warning", "served_layer_ids", "layer_variants"]

TEMPLATE = "chat template / system prompt / template kwargs"
LAYERS = "layer ids and their order"
VOCAB = "d2t/t2d vocab map"
DTYPE = "dtype"


def _counts(records):
    from draftsmith.eval.check import counts

    return counts(records)


def _tau(records) -> Optional[float]:
    drafts = sum(r["drafts"] for r in records)
    return 1 + sum(r["accepted"] for r in records) / drafts if drafts else None


def explains(served: Sequence[dict], offline: Sequence[dict], variant: Sequence[dict], k: int, *,
             alpha: float = 0.05, margin: float = 0.01) -> tuple[bool, str]:
    """Whether an offline rerun with a suspected difference (``variant``) reproduces the served
    acceptance: neither side is short of the other (the same statistics as the main verdict, both
    ways), the variant's tau is at least halfway from offline's to served's, and the variant's answers
    match the server's on at least as many prompts as offline's do (greedy answers are the target's
    alone: a variation that changes them away from the server's, e.g. another dtype, is not what the
    server ran, however its tau lands). Returns (verdict, one-line evidence)."""
    kw = dict(alpha=alpha, margin=margin, resamples=500)
    short = (compare_sides(_counts(served), _counts(variant), k, **kw)["shortfall"]
             or compare_sides(_counts(variant), _counts(served), k, **kw)["shortfall"])
    ts, to, tv = _tau(served), _tau(offline), _tau(variant)

    def same_as_served(records) -> int:
        return sum(1 for s, v in zip(served, records) if s.get("token_ids") is not None
                   and list(s["token_ids"]) == list(v["token_ids"]))

    same, base = same_as_served(variant), same_as_served(offline)
    close = None not in (ts, to, tv) and abs(tv - ts) <= 0.5 * abs(to - ts) + 1e-9
    ok = bool(close and not short and same >= base)
    fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    return ok, (f"offline rerun with it: tau {fmt(tv)} (served {fmt(ts)}, offline {fmt(to)}), "
                f"{same}/{len(served)} answers identical to served (offline: {base})")


def _first_diff(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def template_cause(served: Sequence[dict], offline_ids: Sequence[Sequence[int]], tokenizer, *,
                   trained_kwargs: Optional[dict], rerun=None,
                   renderings: Optional[dict[str, Sequence[Sequence[int]]]] = None) -> dict:
    """Compare the server's rendering of each prompt (``prompt_token_ids``) with the trained one.
    ``rerun(prompt_ids) -> (ok, evidence)`` decodes offline on the server's ids (None: no rerun);
    ``renderings`` maps a description (e.g. "without the trained chat_template_kwargs") to the prompts
    rendered that way: one that equals the server's names what the server did differently."""
    fix = ("serve with the template and kwargs the draft was trained with (`draftsmith serve vllm` passes the "
           "checkpoint's --default-chat-template-kwargs; drop a --chat-template that differs), or retrain on "
           "data rendered with the serving template")
    got = [r.get("prompt_token_ids") for r in served]
    if any(g is None for g in got):
        return {"cause": TEMPLATE, "status": "not tested", "fix": "",
                "evidence": "the server returned no prompt_token_ids (vLLM's return_token_ids); cannot compare"}
    differ = [i for i, (g, o) in enumerate(zip(got, offline_ids)) if list(g) != list(o)]
    if not differ:
        return {"cause": TEMPLATE, "status": "ruled out", "fix": "",
                "evidence": f"the server rendered all {len(got)} prompts to the trained token ids"}
    i = differ[0]
    g, o = list(got[i]), list(offline_ids[i])
    n = _first_diff(g, o)
    snip = lambda ids: json.dumps(tokenizer.decode(ids[n:n + 24]))[:80]  # noqa: E731
    evidence = (f"{len(differ)}/{len(got)} prompts rendered differently; prompt {served[i]['id']}: served "
                f"{len(g)} tokens vs trained {len(o)}, first difference at token {n}: served {snip(g)} vs "
                f"trained {snip(o)}")
    if trained_kwargs:
        evidence += f" (trained with chat_template_kwargs {json.dumps(trained_kwargs)})"
    same_as = [what for what, ids in (renderings or {}).items()
               if all(list(g) == list(i) for g, i in zip(got, ids))]
    if same_as:
        evidence += f"; the server's rendering equals the prompts rendered {same_as[0]}"
    status = "found"
    if rerun is not None:
        ok, how = rerun(got)
        evidence += f"; {how}"
        status = "confirmed" if ok else "found"
    return {"cause": TEMPLATE, "status": status, "evidence": evidence, "fix": fix}


def served_layer_ids(draft_dir: Optional[str]) -> Optional[tuple[list[int], list[int]]]:
    """(engine ids as the served config lists them, as vLLM reads them: sorted, distinct) of the draft
    the server loaded, or None when unknown."""
    if not draft_dir or not (Path(draft_dir) / "config.json").is_file():
        return None
    from draftsmith.drafts import get_family
    from draftsmith.drafts.family import lookup
    from draftsmith.eval.offline import family_of_dir

    config = json.loads((Path(draft_dir) / "config.json").read_text())
    fam = get_family(family_of_dir(Path(draft_dir)))
    listed = lookup(config, fam.layer_ids_key)
    if not isinstance(listed, list):
        return None
    engine = [int(i) - fam.layer_id_offset for i in listed]
    return engine, sorted(set(engine))


def layer_variants(trained: Sequence[int], num_layers: int, first: int = 0,
                   served: Optional[Sequence[int]] = None) -> list[tuple[str, list[int]]]:
    """Layer-id lists an engine may read instead of ``trained`` (engine ids): what the served config
    says, every id one lower / one higher (the hook-vs-engine off-by-one), ascending order (vLLM sorts
    the ids, a draft trained on another order reads its fc blocks swapped), the engine default."""
    from draftsmith.targets.contract import engine_default_aux_layer_ids

    out: list[tuple[str, list[int]]] = []
    if served is not None:
        out.append(("the served config's ids, sorted as vLLM reads them", sorted(set(served))))
    out.append(("every id one lower", [i - 1 for i in trained]))
    out.append(("every id one higher", [i + 1 for i in trained]))
    out.append(("ascending order (vLLM sorts the ids)", sorted(trained)))
    out.append(("the engine default (2, L//2, L-3)", engine_default_aux_layer_ids(num_layers)))
    seen, keep = {tuple(trained)}, []
    for why, ids in out:
        if tuple(ids) in seen or len(ids) != len(trained) or not all(first <= i <= num_layers for i in ids):
            continue
        seen.add(tuple(ids))
        keep.append((why, ids))
    return keep


def layer_cause(trained: Sequence[int], served_ids: Optional[tuple[list[int], list[int]]], *, num_layers: int,
                first: int = 0, rerun=None) -> dict:
    """Static: the served config's ids against the trained ones. Dynamic (``rerun(aux_ids) -> (ok,
    evidence)``, only when served falls short): each of :func:`layer_variants`."""
    trained = [int(i) for i in trained]
    fix = (f"serve the draft with the layer ids it was trained on ({trained}, engine ids; `draftsmith serve "
           "vllm` writes them and reorders fc when they are not ascending), or retrain on the served ids")
    evidence, status = [], "ruled out"
    if served_ids is None:
        evidence.append("the served draft config is unknown (no /server_info; let check start the server)")
        status = "not tested"
    else:
        listed, read = served_ids
        if read != trained:
            status = "found"
            how = "in another order" if sorted(read) == sorted(trained) else "other layers"
            evidence.append(f"the server reads layers {read} (its config lists {listed}; vLLM sorts them), "
                            f"the draft was trained on {trained}: {how}")
        else:
            evidence.append(f"the server reads the trained layers {trained}")
    if rerun is not None:
        tried = []
        for why, ids in layer_variants(trained, num_layers, first, served_ids[1] if served_ids else None):
            ok, how = rerun(ids)
            tried.append(f"{ids} ({why})")
            if ok:
                return {"cause": LAYERS, "status": "confirmed", "fix": fix,
                        "evidence": "; ".join(evidence + [f"reading {ids} ({why}) reproduces served: {how}"])}
        evidence.append(f"offline reruns with {', '.join(tried) or 'no other valid ids'} do not reproduce served")
        if status == "not tested":
            status = "ruled out"
    return {"cause": LAYERS, "status": status, "evidence": "; ".join(evidence), "fix": fix if status != "ruled out" else ""}


def _served_d2t(draft_dir: Optional[str]):
    """The d2t tensor of the served draft copy (``d2t`` or ``model.d2t``), None when it has none,
    or ... when the served draft is unknown."""
    if not draft_dir:
        return ...
    from draftsmith.weights import read_tensors

    path = Path(draft_dir) / "model.safetensors"
    if not path.is_file():
        return ...
    found = read_tensors(path, ("d2t", "model.d2t"))
    return next(iter(found.values()), None)


def d2t_cause(draft, served_draft_dir: Optional[str], *, rerun=None) -> dict:
    """A pruned draft's d2t: the served copy's map against the checkpoint's; rerun with d2t lost."""
    cfg = draft.cfg
    if not getattr(cfg, "pruned", False):
        return {"cause": VOCAB, "status": "ruled out", "fix": "",
                "evidence": "the draft predicts the full target vocab (no d2t/t2d)"}
    import torch

    fix = "serve the checkpoint's export (`draftsmith serve vllm` / `export --to vllm` keep d2t and t2d)"
    served = _served_d2t(served_draft_dir)
    evidence, status = [], "ruled out"
    if served is ...:
        evidence.append("the served draft copy is unknown")
        status = "not tested"
    elif served is None:
        evidence.append(f"the served copy {served_draft_dir} has no d2t: the engine reads draft ids as target ids")
        status = "found"
    elif not torch.equal(served.long().cpu(), draft.d2t.long().cpu()):
        evidence.append(f"the served copy's d2t differs from the checkpoint's in "
                        f"{int((served.long().cpu() != draft.d2t.long().cpu()).sum())} entries")
        status = "found"
    else:
        evidence.append("the served copy holds the checkpoint's d2t")
    if rerun is not None:
        ok, how = rerun()
        evidence.append(f"with d2t lost, {how}")
        if ok:
            status = "confirmed"
        elif status == "not tested":
            status = "ruled out"
    return {"cause": VOCAB, "status": status, "evidence": "; ".join(evidence), "fix": fix if status != "ruled out" else ""}


def dtype_cause(served_dtype: Optional[str], offline_dtype: str, records: Sequence[dict], rerun=None) -> dict:
    """The server's dtype against offline's; same prompt ids but other answers point to numerics.
    ``rerun(dtype) -> (ok, evidence)`` decodes offline with the target in ``dtype`` (only when served
    falls short): the server's dtype when known and different, bfloat16 when unknown."""
    result = _dtype_static(served_dtype, offline_dtype, records)
    candidate = (served_dtype if served_dtype not in (None, offline_dtype) else
                 "bfloat16" if served_dtype is None and offline_dtype != "bfloat16" else None)
    if rerun is None or candidate is None:
        return result
    ok, how = rerun(candidate)
    result["evidence"] += f"; with the target in {candidate}, {how}"
    if ok:
        result.update(status="confirmed", fix=result["fix"] or (
            f"the server likely runs {candidate}: serve with --dtype {offline_dtype} (or run check --dtype {candidate})"))
    elif result["status"] == "not tested":
        result["status"] = "ruled out"
    return result


def _dtype_static(served_dtype: Optional[str], offline_dtype: str, records: Sequence[dict]) -> dict:
    numeric = [r["id"] for r in records if r.get("same_prompt_ids") and r.get("same_tokens") is False]
    extra = (f"; {len(numeric)} prompt(s) got other answers from identical prompt ids ({', '.join(numeric[:4])})"
             if numeric else "")
    fix = (f"compare like with like: serve with --dtype {offline_dtype}, or run check --dtype {served_dtype} "
           "(low precision flips near-tie tokens and lowers acceptance a little)")
    if served_dtype is None:
        return {"cause": DTYPE, "status": "not tested", "fix": "",
                "evidence": "the server's dtype is unknown (no /server_info)" + extra}
    if served_dtype != offline_dtype:
        return {"cause": DTYPE, "status": "found", "fix": fix,
                "evidence": f"the server runs {served_dtype}, offline {offline_dtype}" + extra}
    return {"cause": DTYPE, "status": "ruled out" if not numeric else "found", "fix": "" if not numeric else fix,
            "evidence": f"both run {served_dtype}" + extra}


def context_warning(served_max_len: Optional[int], trained_max_len: Optional[int],
                    lengths: Sequence[int]) -> Optional[str]:
    """A serving context longer than the draft's training max_length (both sides alike)."""
    if served_max_len is None or trained_max_len is None or served_max_len <= trained_max_len:
        return None
    longer = sum(1 for n in lengths if n > trained_max_len)
    return (f"the server allows {served_max_len} tokens of context (--max-model-len) but the draft was trained on "
            f"rows of at most {trained_max_len} (data.max_length); {longer}/{len(lengths)} prompts here are longer. "
            "Acceptance past the trained length drops on the server and offline alike (see the prompt-token "
            "buckets): serve with --max-model-len <= the trained length or train longer rows")


def depth_warning(k: int, proposer) -> Optional[str]:
    """K above the depth the draft was trained to draft (EAGLE TTT steps; both sides alike)."""
    trained = getattr(proposer, "trained_k", None)
    if trained is None or k <= trained:
        return None
    return (f"K={k} is above the depth the draft was trained for ({trained}, {proposer.k_knob or 'draft.ttt_steps'}); "
            f"positions {trained + 1}..{k} extrapolate and accept less on the server and offline alike")
