"""docs/reference/layouts.md: the checkpoint layout and every export layout, from a real tiny run
(refgen.layouts_run) plus the layout constants of draftsmith.layout."""

from __future__ import annotations

import json
from typing import Any

from . import md, rst

PAGE = "reference/layouts.md"
MODEL = "model/consolidated"


def _value(v: Any, limit: int = 70) -> str:
    text = json.dumps(v)
    return md.code(text if len(text) <= limit else text[: limit - 1] + "…")


def _json_type(v: Any) -> str:
    return {bool: "bool", int: "int", float: "float", str: "string", list: "list", dict: "object",
            type(None): "null"}[type(v)]


def _tensor_rows(rows) -> list[list[str]]:
    return [[md.code(n), md.code(dt), md.code("(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")")]
            for n, dt, shape in rows]


def _indent(lines: list[str]) -> list[str]:
    return [("    " + line) if line else "" for line in lines]


def _collapsed(title: str, body: list[str]) -> list[str]:
    return [f'??? info "{title}"', ""] + _indent(body) + [""]


def _legend(facts: dict) -> list[str]:
    tiny = facts["tiny"]
    first = next(iter(facts["families"].values()))
    info = first["run"]["json"][f"{first['checkpoint']}/meta.json"]["target_info"]
    dims = (f"a {info['num_layers']}-layer {info['model_type']} target built in code (tests/fixtures.py), vocab "
            f"V = {info['vocab_size']}, hidden H = {info['hidden_size']}, {info['num_attention_heads']} attention heads "
            f"of head_dim {info['head_dim']}, {info['num_key_value_heads']} KV head, intermediate "
            f"{info['intermediate_size']}, {info['dtype']}; draft vocab Vd = {tiny['data']['draft_vocab_size']}")
    lines = [md.prose(f"Everything below is what a real run leaves on disk: {dims}. Each registered family "
                      f"trained {tiny['train']['max_steps']} steps on the CPU, then every export layout "
                      f"(`draftsmith export --to vllm CKPT OUT`, `--to sglang`, `--to speculators`) was written from "
                      f"its checkpoint. Shapes follow these tiny sizes (a real "
                      f"target's are larger; the names and the structure are the same); dtypes are those of a "
                      f"float32 run."), ""]
    keys = sorted({k for d in tiny["draft"].values() for k in d if k != "type"})
    lines += ["The tiny `draft` sections:", ""]
    lines += md.table(["draft.type", *map(md.code, keys)],
                      [[md.code(name), *[_value(d[k]) if k in d else "" for k in keys]] for name, d in tiny["draft"].items()])
    return lines


def _run_dir(facts: dict) -> list[str]:
    from draftsmith import layout
    from draftsmith.train import checkpoint

    fams = facts["families"]
    trees = {name: f["run"]["files"] for name, f in fams.items()}
    first = next(iter(trees))
    lines = ["## Run directory", ""]
    lines += rst.to_markdown(checkpoint.__doc__, skip=1)
    same = all(t == trees[first] for t in trees.values())
    lines += [md.prose(f"What the tiny run left under `output.dir` ({'every family: the same files' if same else first}):"), ""]
    lines += md.fenced("\n".join(f"<output_dir>/{p}" for p in trees[first]))
    if not same:
        for name, t in trees.items():
            if t != trees[first]:
                lines += [f"`{name}`:", ""] + md.fenced("\n".join(f"<output_dir>/{p}" for p in t))
    lines += [md.prose("A checkpoint directory is complete (resume and serve accept it) when it holds "
                       + ", ".join(f"`{p}`" for p in layout.REQUIRED_FILES) + f" (`draftsmith.layout.REQUIRED_FILES`); "
                       f"`{layout.MODEL_SUBDIR.as_posix()}` (`MODEL_SUBDIR`) is the servable draft."), ""]
    return lines


def _checkpoint_files(facts: dict) -> list[str]:
    fams = facts["families"]
    lines = ["## meta.json", "", md.prose("The trainer's record of the run and the data position (JSON). Fields, "
                                          "with their values in the tiny run:"), ""]
    fields: dict[str, dict] = {}
    for name, f in fams.items():
        meta = f["run"]["json"][f"{f['checkpoint']}/meta.json"]
        for k, v in meta.items():
            fields.setdefault(k, {"type": _json_type(v), "families": [], "example": v})["families"].append(name)
    lines += md.table(["Field", "Type", "Families", "Example"],
                      [[md.code(k), e["type"], "all" if len(e["families"]) == len(fams) else ", ".join(e["families"]),
                        _value(e["example"])] for k, e in fields.items()])
    first = next(iter(fams.values()))
    ck = first["checkpoint"]
    lines += ["## vocab.safetensors", "", md.prose("The draft vocabulary: `draft_ids` are the target ids it keeps, "
                                                   "`d2t` maps draft id to target id as `id + d2t[id]`, `t2d` marks "
                                                   "the kept target ids. dtype and shape per family in the tiny run:"), ""]
    vocab = {name: {n: (dt, shape) for n, dt, shape in f["run"]["tensors"][f"{f['checkpoint']}/vocab.safetensors"]}
             for name, f in fams.items()}
    names = sorted({n for v in vocab.values() for n in v})
    lines += md.table(["Family", *map(md.code, names)],
                      [[md.code(fam), *[" ".join(_tensor_rows([[n, *v[n]]])[0][1:]) if n in v else "absent"
                                        for n in names]] for fam, v in vocab.items()])
    lines += ["## optim.pt, rng.pt, config.yaml", ""]
    for name in ("optim.pt", "rng.pt"):
        keys = first["run"]["other"][f"{ck}/{name}"].get("keys", [])
        lines += [md.prose(f"`{name}` (read with `torch.load(weights_only=True)`), top-level keys: "
                           + ", ".join(f"`{k}`" for k in keys) + "."), ""]
    lines += [md.prose("`config.yaml`: the run config as loaded, every key of every section with defaults filled "
                       "in (see the config reference)."), ""]
    return lines


def _export(name: str, to: str, ckpt_config: dict, exp: dict) -> list[str]:
    lines = [f"#### `{name}`: export --to {to}", ""]
    if "refused" in exp:
        return lines + ['!!! warning "Refused"', ""] + _indent(md.fenced(exp["refused"])) + [""]
    lines += [md.prose("Files: " + ", ".join(f"`{p}`" for p in exp["files"]) + "."), ""]
    from .layouts_run import flatten

    cfg = flatten(exp["json"]["config.json"])
    rows = []
    for k in sorted(set(cfg) | set(ckpt_config)):
        if cfg.get(k, "<absent>") != ckpt_config.get(k, "<absent>"):
            rows.append([md.code(k), _value(ckpt_config[k]) if k in ckpt_config else "absent",
                         _value(cfg[k]) if k in cfg else "absent"])
    if len(rows) > len(cfg) / 2:  # a structure of its own (speculators): the whole file
        lines += ["config.json:", ""]
        lines += md.table(["Key", "Value"], [[md.code(k), _value(v)] for k, v in cfg.items()])
    elif rows:
        lines += ["config.json, where it differs from the checkpoint's:", ""]
        lines += md.table(["Key", "Checkpoint", "Export"], rows)
    else:
        lines += ["config.json: the checkpoint's, unchanged.", ""]
    for fname, obj in sorted(exp["json"].items()):
        if fname != "config.json":
            lines += [md.prose(f"`{fname}`: " + ", ".join(f"`{k}` {_value(v)}" for k, v in flatten(obj).items())
                               + "."), ""]
    for fname, desc in sorted(exp["other"].items()):
        if "tensor" in desc:
            dt, shape = desc["tensor"]
            lines += [md.prose(f"`{fname}`: a tensor, {dt}, shape ({', '.join(map(str, shape))},)."), ""]
        else:
            lines += [md.prose(f"`{fname}`: {json.dumps(desc)}."), ""]
    for fname, rows_ in sorted(exp["tensors"].items()):
        lines += _collapsed(f"{fname}: {len(rows_)} tensors", md.table(["Tensor", "dtype", "Shape"], _tensor_rows(rows_)))
    return lines


def _families(facts: dict) -> list[str]:
    from draftsmith.drafts import FAMILIES

    from .layouts_run import flatten

    lines = ["## Drafts and exports, per family", "",
             md.prose(f"`{MODEL}/` of each checkpoint is the servable draft (config.json and model.safetensors). "
                      "`draftsmith export --to vllm CKPT OUT` (or `--to sglang`, `--to speculators`) writes a standalone engine-ready copy "
                      "(`serve` writes the same copy under the draft as `vllm_export/` or `sglang_export/`); a layout "
                      "an engine cannot serve is refused with the reason."), ""]
    for name, f in facts["families"].items():
        ck = f["checkpoint"]
        config = f["run"]["json"][f"{ck}/{MODEL}/config.json"]
        flat = flatten(config)
        lines += [f"### `{name}`", "", md.prose(f"{FAMILIES[name].display}; on-disk layout "
                                                 f"`{FAMILIES[name].layout}`."), ""]
        lines += [f"`{MODEL}/config.json`:", ""]
        lines += md.table(["Key", "Value"], [[md.code(k), _value(v)] for k, v in flat.items()])
        rows = f["run"]["tensors"][f"{ck}/{MODEL}/model.safetensors"]
        lines += [f"`{MODEL}/model.safetensors` ({len(rows)} tensors):", ""]
        lines += md.table(["Tensor", "dtype", "Shape"], _tensor_rows(rows))
        for to, exp in f["exports"].items():
            lines += _export(name, to, flat, exp)
    return lines


def render(facts: dict | None = None) -> str:
    from .layouts_run import run

    facts = facts if facts is not None else run()
    lines = md.header("Checkpoint and export layouts")
    lines += _legend(facts)
    lines += _run_dir(facts)
    lines += _checkpoint_files(facts)
    lines += _families(facts)
    return "\n".join(lines).rstrip("\n") + "\n"
