"""The draft's RoPE parameters: the rotary types draftsmith trains, what each one's parameters mean, the
scalars of its tables, and the parameters an exported draft carries. Torch-free: the tables are
:class:`draftsmith.drafts.layers.RotaryEmbedding`'s.

A draft rotates q and k with the target's RoPE (its config.json's ``rope_theta`` + ``rope_scaling``, or
transformers 5's ``rope_parameters``). The draft is served by vLLM, which builds the draft's rotary from
the draft's own config.json (``get_rope(head_dim, max_position_embeddings, rope_parameters)``), so every
table here is the one vLLM computes for that draft, where it and transformers differ. With d = head_dim,
i = 0 .. d/2 - 1, base frequencies w_i = theta^(-2i/d), M = max_position_embeddings and
L = original_max_position_embeddings, the angle of position p at frequency i is:

- default:  p * w_i.
- linear:   (p / factor) * w_i (vLLM divides the position; transformers divides w, equal up to rounding).
- llama3:   w_i / factor where the wavelength 2 pi / w_i > L / low_freq_factor, w_i where it is
  < L / high_freq_factor, and between them (1 - s) w_i / factor + s w_i with
  s = (L / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor).
- yarn:     p * (w_i / factor * r_i + w_i * (1 - r_i)), r_i = clamp((i - lo) / (hi - lo), 0, 1), lo and hi
  the dims that turn beta_fast (32) and beta_slow (1) times over L, d log(L / (2 pi n)) / (2 log theta),
  floored and ceiled unless ``truncate: false``; cos and sin are multiplied by the attention factor m.
- longrope: p * w_i / f_i, f = long_factor when M > L (vLLM picks the factors once, by its max_model_len,
  whose default is M; transformers switches per sequence length), else short_factor; cos and sin times m.
- dynamic:  p * w'_i with w' the base frequencies of one fixed theta' (vLLM's fixed table; transformers
  recomputes theta' per sequence length beyond M): theta * alpha^(d / (d - 2)) when ``alpha`` is given,
  else theta * (factor * M / T - (factor - 1))^(d / (d - 2)), T = max_trained_positions (default M), so
  theta' = theta for a config that sets ``factor`` only.

Attention factor m: yarn's ``attention_factor`` if set, else g(factor, mscale) / g(factor, mscale_all_dim)
when both are set and non-zero (DeepSeek), else g(factor, 1), with g(s, k) = 1 + 0.1 k ln s (1 for s <= 1);
longrope's ``long_mscale`` / ``short_mscale`` (the picked side) if set, else sqrt(1 + ln(M / L) / ln L)
(1 for M <= L). vLLM ignores longrope's ``factor`` and ``attention_factor``; so does draftsmith.
"""

from __future__ import annotations

import math
from typing import Any, Optional

__all__ = ["ROPE_TYPES", "rope_type", "rope_problems", "draft_rope", "rope_of_config", "with_original_len",
           "use_long_factors", "attention_scaling", "yarn_factor", "yarn_mscale", "yarn_correction_range", "dynamic_theta"]

ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "dynamic")
# the keys each type reads besides rope_type (what vLLM's get_rope reads); a draft keeps these only
KEYS = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
             "attention_factor", "truncate"),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings", "short_mscale", "long_mscale"),
    "dynamic": ("factor", "alpha", "max_trained_positions"),
}
REQUIRED = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("original_max_position_embeddings",),  # factor: M / L when null (transformers' rule)
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
}
ORIGINAL_LEN_TYPES = ("llama3", "yarn", "longrope")  # L defaults to M (transformers' standardisation)
FLOATS = ("factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
          "attention_factor", "short_mscale", "long_mscale", "alpha")


def rope_type(rope_scaling: Optional[dict]) -> str:
    """``rope_type`` (or the older ``type``) of a rope_scaling dict; ``default`` for None or {}."""
    if not rope_scaling:
        return "default"
    return str(rope_scaling.get("rope_type", rope_scaling.get("type", "default")))


def rope_problems(rope_scaling: Optional[dict], head_dim: Optional[int] = None,
                  where: str = "the target's rope_parameters") -> list[str]:
    """One line per problem of ``rope_scaling`` for a draft (empty: it is one draftsmith trains and vLLM
    serves); ``where`` names the dict in the messages, ``head_dim`` checks longrope's factor lists."""
    kind = rope_type(rope_scaling)
    if kind not in ROPE_TYPES:
        return [f"rope_type {kind!r} ({where}) is not supported; draftsmith supports rope_type "
                f"{', '.join(ROPE_TYPES)}; train on a target whose rope_type is one of those"]
    params = rope_scaling or {}
    out = [f"rope_type {kind!r} needs {key} ({where} has none); set it, the type reads {', '.join(REQUIRED[kind])}"
           for key in REQUIRED.get(kind, ()) if params.get(key) is None]
    for key in ("factor", "alpha", "original_max_position_embeddings", "max_trained_positions"):
        v = params.get(key)
        if key in KEYS[kind] and v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
            out.append(f"{key} = {v!r} ({where}, rope_type {kind!r}): expected a number > 0")
    if kind == "dynamic" and params.get("factor") is None and params.get("alpha") is None:
        out.append(f"rope_type 'dynamic' needs factor or alpha ({where} has neither); set factor (NTK scaling) "
                   "or alpha (NTK-alpha)")
    if kind == "longrope" and head_dim:
        for key in ("short_factor", "long_factor"):
            v = params.get(key)
            if v is not None and (not isinstance(v, (list, tuple)) or len(v) != head_dim // 2):
                got = f"{len(v)} values" if isinstance(v, (list, tuple)) else repr(v)
                out.append(f"{key} ({where}, rope_type 'longrope') has {got}, expected head_dim / 2 = "
                           f"{head_dim // 2} numbers, one per rotary frequency")
    return out


def with_original_len(rope_scaling: Optional[dict], max_position_embeddings: int) -> Optional[dict]:
    """``rope_scaling`` with llama3's / yarn's / longrope's ``original_max_position_embeddings`` set to M
    when it has none (transformers' standardisation, which vLLM's config loading goes through too)."""
    if rope_type(rope_scaling) in ORIGINAL_LEN_TYPES and rope_scaling.get("original_max_position_embeddings") is None:
        return {**rope_scaling, "original_max_position_embeddings": int(max_position_embeddings)}
    return rope_scaling


def use_long_factors(rope_scaling: dict, max_position_embeddings: int) -> bool:
    """longrope: True when vLLM serves ``long_factor`` at its default max_model_len (M > L)."""
    return int(max_position_embeddings) > int(rope_scaling["original_max_position_embeddings"])


def yarn_mscale(scale: float, k: float = 1.0) -> float:
    """YaRN's magnitude correction g(s, k) = 1 + 0.1 k ln s, 1 for s <= 1."""
    return 1.0 if scale <= 1 else 0.1 * k * math.log(scale) + 1.0


def attention_scaling(rope_scaling: Optional[dict], max_position_embeddings: int) -> float:
    """The factor m on cos and sin (1.0 but for yarn and longrope; see the module docstring)."""
    kind, p = rope_type(rope_scaling), rope_scaling or {}
    if kind == "yarn":
        if p.get("attention_factor") is not None:
            return float(p["attention_factor"])
        factor = float(yarn_factor(p, max_position_embeddings))
        if p.get("mscale") and p.get("mscale_all_dim"):
            return float(yarn_mscale(factor, float(p["mscale"])) / yarn_mscale(factor, float(p["mscale_all_dim"])))
        return float(yarn_mscale(factor))
    if kind == "longrope":
        explicit = p.get("long_mscale" if use_long_factors(p, max_position_embeddings) else "short_mscale")
        if explicit is not None:
            return float(explicit)
        original = int(p["original_max_position_embeddings"])
        scale = max_position_embeddings / original
        return 1.0 if scale <= 1.0 else math.sqrt(1 + math.log(scale) / math.log(original))
    return 1.0


def yarn_factor(params: dict, max_position_embeddings: int) -> float:
    """yarn's ``factor``; M / L when it is null (transformers' rule; vLLM needs it set)."""
    f = params.get("factor")
    return f if f is not None else max_position_embeddings / int(params["original_max_position_embeddings"])


def yarn_correction_range(params: dict, head_dim: int, theta: float) -> tuple[float, float]:
    """(lo, hi): the dims between which yarn blends interpolated into original frequencies.

    Dim of n turns over L: d log(L / (2 pi n)) / (2 log theta), for n = beta_fast (lo) and beta_slow (hi);
    floored / ceiled unless ``truncate`` is false, then clamped to [0, d - 1]."""
    original = int(params["original_max_position_embeddings"])

    def dim_of(turns: float) -> float:
        return head_dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(theta))

    lo = dim_of(params.get("beta_fast") if params.get("beta_fast") is not None else 32)
    hi = dim_of(params.get("beta_slow") if params.get("beta_slow") is not None else 1)
    if params.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    return max(lo, 0), min(hi, head_dim - 1)


def dynamic_theta(params: dict, theta: float, head_dim: int, max_position_embeddings: int) -> float:
    """dynamic's fixed base theta' (alpha first, as vLLM; see the module docstring)."""
    power = head_dim / (head_dim - 2)
    if params.get("alpha") is not None:
        return theta * float(params["alpha"]) ** power
    factor = float(params["factor"])
    trained = params.get("max_trained_positions") or max_position_embeddings
    return theta * ((factor * max_position_embeddings / trained) - (factor - 1)) ** power


def draft_rope(rope_scaling: Optional[dict], max_position_embeddings: int) -> Optional[dict]:
    """The rope_scaling a draft trains with and its config.json carries, from the target's: None for
    default RoPE; else ``rope_type`` plus the keys that type reads (vLLM's), numbers as floats (vLLM's
    linear RoPE fails on an int factor), yarn's null ``factor`` filled in (M / L), and longrope's factor
    list of the side vLLM serves at its default max_model_len written as both ``short_factor`` and
    ``long_factor`` (likewise its mscale): the draft rotates as trained whatever --max-model-len vLLM is
    started with. Keys a draft does not use (``partial_rotary_factor``: the draft rotates its whole head;
    mrope sections) are dropped. A ValueError names the first problem (see :func:`rope_problems`)."""
    kind = rope_type(rope_scaling)
    src = dict(with_original_len(rope_scaling, max_position_embeddings) or {})
    problems = rope_problems(src)
    if problems:
        raise ValueError(problems[0])
    if kind == "default":
        return None
    if kind == "yarn":
        src["factor"] = yarn_factor(src, max_position_embeddings)
    if kind == "longrope":
        long = use_long_factors(src, max_position_embeddings)
        factors = [float(x) for x in src["long_factor" if long else "short_factor"]]
        mscale = src.get("long_mscale" if long else "short_mscale")
        src.update(short_factor=factors, long_factor=list(factors))
        src.pop("short_mscale", None)
        src.pop("long_mscale", None)
        if mscale is not None:
            src.update(short_mscale=mscale, long_mscale=mscale)
    out: dict[str, Any] = {"rope_type": kind}
    for key, value in src.items():
        if key in KEYS[kind] and value is not None:
            out[key] = float(value) if key in FLOATS else value
    return out


def rope_of_config(config: dict) -> tuple[Optional[float], Optional[dict]]:
    """(rope_theta, rope_scaling) of a config.json dict, as transformers reads it: a text model's config
    (``text_config`` of a composite one), ``rope_scaling`` before ``rope_parameters`` (one dict per
    attention type: full attention's), ``rope_theta`` top level or in the dict, and for llama3 / yarn /
    longrope a top-level ``original_max_position_embeddings`` (Phi-3) or M when the dict has none.
    rope_scaling is None for default RoPE; rope_theta None when the config has none."""
    config = config.get("text_config") or config
    params = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        params = params.get("full_attention") or next(iter(params.values()))
    params = dict(params) if isinstance(params, dict) else {}
    theta = config.get("rope_theta", params.get("rope_theta"))
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    kind = rope_type(scaling)
    if kind in ORIGINAL_LEN_TYPES and config.get("original_max_position_embeddings") is not None:
        scaling["original_max_position_embeddings"] = config["original_max_position_embeddings"]
    elif config.get("max_position_embeddings") is not None:
        scaling = with_original_len(scaling, config["max_position_embeddings"])
    return (float(theta) if theta is not None else None), (scaling if kind != "default" else None)
