"""``draftsmith convert-recipe IN OUT``: the draftsmith YAML equivalent to an AutoModel recipe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftsmith import atomic
from draftsmith.config import SECTIONS, ConfigError, build_config

from .mapping import RecipeMapping, is_recipe, map_recipe

__all__ = ["convert_recipe", "cmd_convert", "register"]


def convert_recipe(src: str | Path, out: str | Path) -> RecipeMapping:
    """Write the draftsmith YAML equivalent to the AutoModel recipe ``src`` to ``out`` (atomically: a
    temporary file, then os.replace), after checking it builds; the mapping is its header comment."""
    import yaml

    src, out = Path(src), Path(out)
    if not src.is_file():
        raise ConfigError(["file not found; pass an AutoModel recipe YAML (with a recipe_args block)"], str(src))
    if out.resolve() == src.resolve():
        raise ConfigError([f"OUT {out} is the recipe itself; write the draftsmith config to another file"], str(src))
    try:
        raw = yaml.safe_load(src.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise ConfigError([f"invalid YAML{f' at line {mark.line + 1}' if mark else ''}: {getattr(e, 'problem', e)}"],
                          str(src)) from None
    mapping = map_recipe(raw, str(src)) if is_recipe(raw) else None
    if mapping is None:
        raise ConfigError(["not an AutoModel recipe (no recipe_args block); a draftsmith config needs no "
                           "conversion"], str(src))
    build_config(mapping.raw, str(src))  # every value the draftsmith config would refuse, before writing
    header = "".join(f"# {line}\n" for line in mapping.text().splitlines())
    out.parent.mkdir(parents=True, exist_ok=True)
    body = yaml.safe_dump({sec: mapping.raw[sec] for sec in SECTIONS if sec in mapping.raw}, sort_keys=False)
    atomic.write_text(out, f"# draftsmith run config converted by `draftsmith convert-recipe`\n{header}\n{body}")
    return mapping


def cmd_convert(args: Any) -> int:
    mapping = convert_recipe(args.recipe, args.out)
    print(mapping.text())
    print(f"wrote {args.out}; train with: draftsmith train {args.out}")
    return 0


def register(sub: Any) -> None:
    """Add ``convert-recipe`` to the CLI's subcommands."""
    c = sub.add_parser("convert-recipe", help="write the draftsmith run config equivalent to a NeMo AutoModel "
                                              "EAGLE-3 / P-EAGLE / DFlash-family recipe",
                       description="Map every key of an AutoModel recipe (recipe_args, optimizer, checkpoint, "
                                   "distributed) onto draftsmith's; layer ids are converted from HF-hook ids "
                                   "(j) to engine ids (j + 1). `draftsmith train RECIPE` runs a recipe directly.")
    c.add_argument("recipe", metavar="IN", help="AutoModel recipe YAML (with a recipe_args block)")
    c.add_argument("out", metavar="OUT", help="draftsmith YAML to write (atomically)")
    c.set_defaults(func=cmd_convert)
