"""Run configuration: flat dataclasses per section, YAML on disk, defaults in code.

A run config has five sections (``target``, ``data``, ``draft``, ``train``, ``output``). Loading
rejects unknown sections and keys by name with a close-match hint, checks every value's type, and
reports ALL problems at once in a :class:`ConfigError`. The ``draft`` section is flat in YAML, but
its dataclass is the family's (``draft.type`` picks it from the drafts registry): a key of another
family is refused by name with the families it belongs to. ``--set section.key=value`` overrides are
parsed as YAML scalars/lists and validated the same way.
"""

from __future__ import annotations

import difflib
import types
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Optional, Union

from draftsmith.drafts import FAMILIES, DraftConfig, default_family
from draftsmith.targets import TP_KWARG

__all__ = ["ConfigError", "RunConfig", "TargetConfig", "DataConfig", "DraftConfig", "TrainConfig", "OutputConfig",
           "SECTIONS", "CHOICES", "build_config", "load_config", "dump_config", "parse_overrides", "draft_class"]


class ConfigError(ValueError):
    """The run config (YAML file, AutoModel recipe or ``--set`` overrides) has unknown sections or keys,
    wrong types or out-of-range values; ``str()`` lists every problem on its own line. Fix: correct each key
    the message names (docs/reference/config.md lists every key with its type and default)."""

    def __init__(self, problems: list[str], source: str = "config"):
        self.problems = problems
        head = f"{source}: {len(problems)} problem(s)" if len(problems) > 1 else f"{source}:"
        super().__init__(head + (" " if len(problems) == 1 else "\n  ") + "\n  ".join(problems))


@dataclass
class TargetConfig:
    path: str = "smollm2"  # HF checkpoint dir, hub id org/name (the local HF cache, hub.py), or `smollm2` (embedded default)
    engine: str = "hf"  # hf | vllm | sglang | remote | cache, all behind the same engine contract
    dtype: str = "float32"  # float32 | bfloat16 | float16: dtype the target runs in
    aux_layer_ids: Optional[list[int]] = None  # vLLM layer ids; default (2, L//2, L-3)
    engine_kwargs: Optional[dict] = None  # passed to the engine, e.g. {max_model_len: 2048, gpu_memory_utilization: 0.5}
    tp_size: Optional[int] = None  # vllm/sglang tensor-parallel degree (their tensor_parallel_size / tp_size); null = theirs (1)
    device_map: Optional[str] = None  # hf: auto (accelerate spreads the target over the GPUs) | null (on train.device)
    # engine `remote`: the target runs in `draftsmith serve-target` processes (docs/guides/remote.md)
    remote_urls: list[str] = field(default_factory=list)  # e.g. [http://127.0.0.1:8001, http://127.0.0.1:8002]
    prefetch_depth: int = 1  # supervision requests in flight (0 = synchronous)
    remote_timeout_s: float = 300.0  # per request (connect and each read)
    remote_retries: int = 5  # failed attempts tolerated per request before the run stops
    remote_backoff_s: float = 0.5  # first wait when no server is up; doubles per retry
    remote_health_interval_s: float = 5.0  # how often a down server is re-checked
    remote_auth_token_file: Optional[str] = None  # bearer token file (same as serve-target's)
    remote_data_plane: str = "auto"  # auto | nccl | gloo | wire: how /features tensors travel (auto: nccl if both sides have CUDA)
    # engine `cache`: features read from an offline feature cache (`draftsmith cache CONFIG --out DIR`)
    cache_dir: Optional[str] = None  # the DIR `draftsmith cache` wrote; required when target.engine is cache


@dataclass
class DataConfig:
    sources: list[str] = field(default_factory=lambda: ["builtin:sharegpt"])  # files, dirs, builtin:*, hub ids org/name[:split[slice]]
    max_rows: Optional[int] = None  # seeded random subset of the conversations
    max_length: int = 512  # tokens per rendered conversation (truncated)
    # several conversations per draft row (up to max_length), attention and TTT steps within each; the same
    # loss and gradients as unpacked, less padding (train/packing.py); families whose description says packing
    packing: bool = False
    eval_size: float = 0.02  # held-out split: a fraction (< 1) or a count (>= 1)
    eval_sources: list[str] = field(default_factory=list)  # held-out rows from these sources instead (eval_size ignored, all of data.sources train)
    chat_template: Optional[str] = None  # overrides the tokenizer's chat template
    chat_template_kwargs: Optional[dict] = None  # e.g. {enable_thinking: false}; null = those of a `draftsmith regenerate` source (else none)
    draft_vocab_size: Optional[int] = 8192  # draft vocab size: the special tokens, then the most frequent target tokens of the data; null = the full target vocab
    vocab_cache_dir: Optional[str] = None  # default <output.dir>/cache


@dataclass
class TrainConfig:
    epochs: int = 1  # passes over the training rows (max_steps / max_time_s may stop earlier)
    max_steps: Optional[int] = None  # optimizer steps; stops early when reached
    max_time_s: Optional[float] = None  # wall-clock budget for the loop (the LR cosine is fitted to it); a final checkpoint follows
    batch_size: int = 2  # micro-batch size (conversations)
    grad_accum: int = 1  # micro-batches per optimizer step (gradients accumulated)
    group_by_length: bool = False  # batch conversations of similar length (~8% less padding at batch 2); seeded
    lr: float = 1e-4  # peak learning rate (after warmup; the cosine decays from it)
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    optimizer: str = "adamw"  # adamw | muon (torch.optim.Muon on the 2-D hidden weights, AdamW on the rest)
    muon_lr: Optional[float] = None  # Muon's lr (null = train.lr: its update is RMS-matched to AdamW's)
    muon_weight_decay: Optional[float] = None  # null = train.weight_decay
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])  # AdamW (beta1, beta2)
    warmup_steps: int = 0  # optimizer steps of linear LR warmup before the cosine
    warmup_fraction: Optional[float] = None  # warm up over this fraction of the optimizer steps instead (AutoModel's warmup_ratio); null = warmup_steps
    min_lr_ratio: float = 0.0  # cosine decays to lr * min_lr_ratio
    max_grad_norm: float = 0.5  # 0 disables clipping
    bf16: Optional[bool] = None  # bf16 autocast for the draft; null = on for CUDA, off on the CPU
    # recompute in backward instead of keeping activations (torch.utils.checkpoint, non-reentrant): less memory
    # for long contexts and many layers, ~1 more forward of the draft per step; the same loss and gradients.
    # EAGLE-3 recomputes each TTT step, P-EAGLE and the DFlash family each draft layer
    activation_checkpointing: bool = False
    seed: int = 0  # draft init, data order, held-out split and max_rows subsets
    log_every: int = 10  # optimizer steps between tensorboard / W&B scalars
    eval_every: int = 0  # optimizer steps; 0 = only at the end
    # checkpoints/BEST = the checkpoint of the best held-out simulated tau (draft-vocab misses counted), saved at
    # each evaluation that beats it; a run dir given to eval/export/serve resolves to it (train/held_out.py)
    keep_best: bool = False
    early_stop_patience: int = 0  # stop after this many evaluations in a row without a better held-out tau; 0 = never
    save_every: int = 0  # optimizer steps; 0 = only at the end
    save_every_epoch: bool = False  # a checkpoint at the end of every epoch too (epoch_<E>_step_<S>, LATEST moved)
    eval_max_batches: Optional[int] = None  # held-out batches per evaluation; null = all of them
    spec_eval_every: int = 0  # optimizer steps; real speculative decoding on held-out prompts (hf engine); 0 = off
    spec_eval_prompts: int = 8  # held-out conversations that spec_eval_every decodes (K = draft.ttt_steps)
    num_threads: Optional[int] = None  # torch intra-op threads (default: torch's choice)
    # Where and on how many processes: `torchrun --nproc-per-node N -m draftsmith train CONFIG` (or
    # `draftsmith train --nproc N`) runs N ranks; batch_size is per rank, the global batch is
    # batch_size x ranks x grad_accum and the data order depends on it, not on the number of ranks.
    device: str = "auto"  # auto (the local rank's GPU when there is one, else cpu) | cpu | cuda | cuda:N
    parallel: str = "ddp"  # ddp | fsdp2 (fully_shard: parameters, gradients and AdamW state sharded over ranks)


@dataclass
class OutputConfig:
    dir: str = "runs/draftsmith"  # run directory: checkpoints/, cache/, tensorboard/
    tensorboard: bool = True  # <dir>/tensorboard
    # the same scalars to Weights & Biases too (the optional extra: pip install 'draftsmith[wandb]'), rank 0 only
    wandb: bool = False
    wandb_project: Optional[str] = None  # null = draftsmith
    wandb_name: Optional[str] = None  # the run's name; null = the name of output.dir
    wandb_mode: Optional[str] = None  # online | offline | disabled; null = the WANDB_MODE variable, else online


@dataclass
class RunConfig:
    target: TargetConfig = field(default_factory=TargetConfig)
    data: DataConfig = field(default_factory=DataConfig)
    draft: DraftConfig = field(default_factory=lambda: draft_class(default_family())())
    train: TrainConfig = field(default_factory=TrainConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def to_dict(self) -> dict:
        return asdict(self)


def draft_class(family: str) -> type:
    """The ``draft`` section's dataclass of family ``family`` (a registered draft.type)."""
    return FAMILIES[family].config


# section -> dataclass; `draft` is the base every family's section extends (draft_class picks the family's)
SECTIONS: dict[str, type] = {f.name: f.default_factory().__class__ for f in fields(RunConfig)}  # type: ignore[misc]
SECTIONS["draft"] = DraftConfig


class _Choices(dict):
    """Allowed values per ``section.key``; ``draft.type`` is read from the drafts registry when asked
    (a family registered after import, e.g. by a test, is a choice too)."""

    def __missing__(self, key: str) -> tuple[str, ...]:
        if key == "draft.type":
            return tuple(FAMILIES)
        raise KeyError(key)


CHOICES: dict[str, tuple[str, ...]] = _Choices({
    "target.engine": ("hf", "vllm", "sglang", "remote", "cache"),
    "target.remote_data_plane": ("auto", "nccl", "gloo", "wire"),
    "target.dtype": ("float32", "bfloat16", "float16"),
    "train.parallel": ("ddp", "fsdp2"),
    "train.optimizer": ("adamw", "muon"),
})


WANDB_MODES = ("online", "offline", "disabled")  # output.wandb_mode (wandb.init's mode)


def _hint(name: str, options) -> str:
    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.5)
    return f"; did you mean '{close[0]}'?" if close else f"; known: {', '.join(sorted(options))}"


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _check(value: Any, tp: Any) -> bool:
    """True when ``value`` (parsed YAML) fits the annotation ``tp``."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return any(_check(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if origin is list:
        (item,) = typing.get_args(tp)
        return isinstance(value, list) and all(_check(v, item) for v in value)
    if origin is dict or tp is dict:
        return isinstance(value, dict)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:  # YAML `1` for a float key is fine
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    return True


def _coerce_float(value: Any, tp: Any) -> Any:
    """YAML 1.1 reads `3e-4` (no dot) as a string; accept it where a float is expected."""
    wants_float = tp is float or (typing.get_origin(tp) in (Union, types.UnionType) and float in typing.get_args(tp))
    if wants_float and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _draft_section(section: dict, problems: list[str]) -> tuple[type, dict[str, list[str]]]:
    """The dataclass ``draft.type`` picks (the default family's when the type is missing or unknown:
    that is reported, and the other keys are still checked), and key -> the families it belongs to
    (every registered family's keys, ``type`` included)."""
    family = section.get("type", default_family())
    if not isinstance(family, str) or family not in FAMILIES:
        problems.append(f"'draft.type' = {family!r}: expected one of {list(FAMILIES)}")
        family = default_family()
    cls = draft_class(family)
    owners: dict[str, list[str]] = {}
    for name, fam in FAMILIES.items():
        for key in typing.get_type_hints(fam.config):
            owners.setdefault(key, []).append(name)
    return cls, owners


def build_config(raw: dict, source: str = "config") -> RunConfig:
    """Validate a parsed mapping into a :class:`RunConfig`, reporting every problem at once."""
    problems: list[str] = []
    if not isinstance(raw, dict):
        raise ConfigError([f"top level must be a mapping of sections {sorted(SECTIONS)}, got {type(raw).__name__}"], source)
    built: dict[str, Any] = {}
    for sec_name, sec_val in raw.items():
        if sec_name not in SECTIONS:
            problems.append(f"unknown section '{sec_name}'{_hint(str(sec_name), SECTIONS)}")
            continue
        if sec_val is None:
            sec_val = {}
        if not isinstance(sec_val, dict):
            problems.append(f"section '{sec_name}' must be a mapping, got {sec_val!r}")
            continue
        cls, owners = SECTIONS[sec_name], {}
        if sec_name == "draft":
            cls, owners = _draft_section(sec_val, problems)
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for key, value in sec_val.items():
            if key not in hints:
                if key in owners:  # a draft knob of another family: name the families it belongs to
                    problems.append(f"draft.{key} belongs to {'/'.join(owners[key])}; draft.type is "
                                    f"{cls().type}: remove the key, or set draft.type to the family it belongs to")
                else:  # close matches among every family's knobs
                    problems.append(f"unknown key '{sec_name}.{key}'{_hint(str(key), set(hints) | set(owners))}")
                continue
            value = _coerce_float(value, hints[key])
            if not _check(value, hints[key]):
                problems.append(
                    f"'{sec_name}.{key}' = {value!r}: expected {_type_name(hints[key])}"
                )
                continue
            if hints[key] is float and isinstance(value, int):
                value = float(value)
            choices = CHOICES.get(f"{sec_name}.{key}")
            if choices and value not in choices:
                problems.append(f"'{sec_name}.{key}' = {value!r}: expected one of {list(choices)}")
                continue
            kwargs[key] = value
        built[sec_name] = cls(**kwargs)
    cfg = RunConfig(**built)
    problems += _cross_checks(cfg)
    if problems:
        raise ConfigError(problems, source)
    return cfg


def _cross_checks(cfg: RunConfig) -> list[str]:
    """Value-range checks that types alone cannot express."""
    p = []
    positive = {
        "data.max_length": cfg.data.max_length, "train.batch_size": cfg.train.batch_size,
        "train.grad_accum": cfg.train.grad_accum, "train.epochs": cfg.train.epochs,
    }
    for key, v in positive.items():
        if v < 1:
            p.append(f"'{key}' = {v}: expected an integer >= 1")
    if cfg.train.spec_eval_every < 0 or cfg.train.spec_eval_prompts < 1:
        p.append(f"'train.spec_eval_every' = {cfg.train.spec_eval_every}, 'train.spec_eval_prompts' = "
                 f"{cfg.train.spec_eval_prompts}: expected >= 0 (0 = off) and >= 1")
    p += cfg.draft.problems()  # the family's own value ranges (drafts/<family>/config.py)
    t = cfg.train
    if t.early_stop_patience < 0:
        p.append(f"'train.early_stop_patience' = {t.early_stop_patience}: expected >= 0 (0 = never stop early)")
    elif t.early_stop_patience and not t.eval_every:
        p.append(f"'train.early_stop_patience' = {t.early_stop_patience} counts evaluations, but train.eval_every "
                 f"is 0 (only the final one); set train.eval_every to a number of optimizer steps, e.g. 200")
    if (t.keep_best or t.early_stop_patience > 0) and not cfg.data.eval_size and not cfg.data.eval_sources:
        p.append("'train.keep_best' / 'train.early_stop_patience' compare held-out scores, but data.eval_size is 0 "
                 "and data.eval_sources is empty; hold out rows (e.g. data.eval_size: 0.02) or turn them off")
    if cfg.train.warmup_fraction is not None and not 0 <= cfg.train.warmup_fraction < 1:
        p.append(f"'train.warmup_fraction' = {cfg.train.warmup_fraction}: expected a fraction in [0, 1) of the "
                 f"optimizer steps, or null for train.warmup_steps")
    if cfg.train.lr <= 0:
        p.append(f"'train.lr' = {cfg.train.lr}: expected > 0")
    if cfg.train.muon_lr is not None and cfg.train.muon_lr <= 0:
        p.append(f"'train.muon_lr' = {cfg.train.muon_lr}: expected > 0 (or null for train.lr)")
    if cfg.data.eval_size < 0:
        p.append(f"'data.eval_size' = {cfg.data.eval_size}: expected a fraction in [0, 1) or a count >= 1")
    if cfg.data.packing and not getattr(FAMILIES.get(cfg.draft.type), "packing", False):
        built = [name for name, fam in FAMILIES.items() if fam.packing]
        p.append(f"'data.packing' is true but draft.type is {cfg.draft.type!r}: packing is built for "
                 f"{'/'.join(built) or 'no family'} only so far; set data.packing: false "
                 f"(train.group_by_length: true also cuts padding)")
    if cfg.data.draft_vocab_size is not None and cfg.data.draft_vocab_size < 2:
        p.append(f"'data.draft_vocab_size' = {cfg.data.draft_vocab_size}: expected >= 2 or null for the full vocab")
    if not cfg.data.sources:
        p.append("'data.sources' is empty: list at least one file, directory or builtin:sharegpt")
    if cfg.target.engine_kwargs and cfg.target.engine not in ("vllm", "sglang"):
        p.append(f"'target.engine_kwargs' is set but target.engine is '{cfg.target.engine}', which takes none; "
                 f"remove it or use vllm/sglang")
    tp, tp_key = cfg.target.tp_size, TP_KWARG.get(cfg.target.engine)
    if tp is not None and tp < 1:
        p.append(f"'target.tp_size' = {tp}: expected an integer >= 1 (GPUs vllm/sglang shard the target over)")
    elif tp is not None and tp_key is None:  # hf has no tensor parallelism of its own; remote/cache open no target here
        p.append(f"'target.tp_size' is set but target.engine is '{cfg.target.engine}', which takes none; remove it, "
                 f"or shard the target with vllm/sglang (co-located, or behind serve-target --tp-size)")
    elif tp is not None and tp_key in (cfg.target.engine_kwargs or {}) and cfg.target.engine_kwargs[tp_key] != tp:
        p.append(f"'target.tp_size' = {tp} but 'target.engine_kwargs.{tp_key}' = "
                 f"{cfg.target.engine_kwargs[tp_key]!r}; give the degree once, as target.tp_size")
    dm = cfg.target.device_map
    if dm is not None and dm != "auto":
        p.append(f"'target.device_map' = {dm!r}: expected auto (spread the target over the visible GPUs) or null "
                 f"(the whole target on train.device)")
    elif dm is not None and cfg.target.engine not in ("hf", "cache"):  # cache: `draftsmith cache` builds with hf
        how = ("the servers place the target (serve-target --device-map auto)" if cfg.target.engine == "remote"
               else "it places the target itself (shard it with target.tp_size)")
        p.append(f"'target.device_map' is set but target.engine is '{cfg.target.engine}': {how}; remove it, "
                 f"or use target.engine: hf")
    if cfg.target.engine == "remote" and not cfg.target.remote_urls:
        p.append("'target.remote_urls' is empty but target.engine is 'remote'; list the serve-target URLs")
    if cfg.target.engine == "cache" and not cfg.target.cache_dir:
        p.append("'target.cache_dir' is empty but target.engine is 'cache'; build a cache with "
                 "`draftsmith cache CONFIG --out DIR` and set target.cache_dir: DIR")
    if cfg.target.prefetch_depth < 0 or cfg.target.remote_retries < 0 or cfg.target.remote_timeout_s <= 0:
        p.append(f"'target.prefetch_depth' = {cfg.target.prefetch_depth}, 'target.remote_retries' = "
                 f"{cfg.target.remote_retries}, 'target.remote_timeout_s' = {cfg.target.remote_timeout_s}: "
                 f"expected >= 0, >= 0 and > 0")
    o = cfg.output
    if o.wandb_mode is not None and o.wandb_mode not in WANDB_MODES:
        p.append(f"'output.wandb_mode' = {o.wandb_mode!r}: expected one of {list(WANDB_MODES)} or null (WANDB_MODE, else online)")
    unused = [k for k in ("wandb_project", "wandb_name", "wandb_mode") if getattr(o, k) is not None]
    if unused and not o.wandb:
        p.append(f"'output.{unused[0]}' is set but output.wandb is false; set output.wandb: true to log to W&B, "
                 f"or remove {', '.join('output.' + k for k in unused)}")
    device = cfg.train.device.strip().lower()
    if not (device in ("auto", "cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit())):
        p.append(f"'train.device' = {cfg.train.device!r}: expected auto, cpu, cuda or cuda:N")
    if len(cfg.train.betas) != 2:
        p.append(f"'train.betas' = {cfg.train.betas}: expected two numbers, e.g. [0.9, 0.95]")
    return p


def parse_overrides(items: list[str]) -> dict:
    """``["train.lr=3e-4", "data.sources=[a.jsonl]"]`` -> nested dict; values parsed as YAML."""
    import yaml

    out: dict = {}
    problems = []
    for item in items:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or len(parts) != 2 or not all(parts):
            problems.append(f"--set {item!r}: expected section.key=value, e.g. train.lr=3e-4")
            continue
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError as e:
            problems.append(f"--set {item!r}: value is not valid YAML ({e.__class__.__name__})")
            continue
        out.setdefault(parts[0], {})[parts[1]] = value
    if problems:
        raise ConfigError(problems, "--set")
    return out


def _switch_family(raw: dict, draft_over: dict) -> dict:
    """``raw`` for a ``--set draft.type=T`` that switches the file's family: the file's draft keys of
    other families that T does not have are dropped (the file was written for its own family; the
    command line asks for another). Keys given with --set, and every key in a file read as it is,
    are checked strictly; a key of no family is still an unknown key."""
    section, family = raw.get("draft"), draft_over.get("type")
    if not isinstance(section, dict) or family not in FAMILIES or section.get("type", default_family()) == family:
        return raw
    own = set(typing.get_type_hints(draft_class(family)))
    others = {k for f in FAMILIES.values() for k in typing.get_type_hints(f.config)}
    return {**raw, "draft": {k: v for k, v in section.items() if k in own or k not in others}}


def load_config(path: Optional[str | Path], overrides: Optional[list[str]] = None) -> RunConfig:
    """Load YAML from ``path`` (or defaults when None), apply ``--set`` overrides, validate. A
    ``--set draft.type=...`` that switches family drops the file's keys of its own family
    (:func:`_switch_family`)."""
    import yaml

    raw: dict = {}
    source = "defaults"
    if path is not None:
        path = Path(path)
        source = str(path)
        if not path.is_file():
            raise ConfigError(["file not found; pass a YAML run config (see examples/)"], source)
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise ConfigError([f"invalid YAML{where}: {getattr(e, 'problem', e)}"], source) from None
    if not isinstance(raw, dict):
        raise ConfigError([f"top level must be a mapping of sections {sorted(SECTIONS)}"], source)
    if "recipe_args" in raw:  # a NeMo AutoModel recipe as it is: its keys mapped onto ours (recipe.py)
        from draftsmith.recipe import map_recipe

        raw = map_recipe(raw, source).raw
    over = parse_overrides(overrides or [])
    raw = _switch_family(raw, over.get("draft") or {})
    for sec, kv in over.items():
        existing = raw.get(sec)
        if existing is None:
            raw[sec] = kv
        elif isinstance(existing, dict):
            raw[sec] = {**existing, **kv}
        # a non-mapping section stays as it is: build_config reports it
    return build_config(raw, source)


def dump_config(cfg: RunConfig) -> str:
    import yaml

    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
