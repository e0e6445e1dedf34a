"""docs/reference/config.md: every run-config key, read from the dataclasses in draftsmith.config and
the draft families' sections (draft.type picks the ``draft`` dataclass: drafts.FAMILIES)."""

from __future__ import annotations

import dataclasses
from typing import Any

from . import md
from .source import class_comments, paragraphs

PAGE = "reference/config.md"


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def _owner(cls: type, name: str) -> tuple[type, str]:
    """(the class in ``cls``'s MRO whose body declares field ``name``, the field's comment there). A field
    redeclared without a comment (a family's own ``type`` default) keeps the meaning of the nearest base
    that comments it."""
    owners = [base for base in cls.__mro__ if name in base.__dict__.get("__annotations__", {})]
    if not owners:
        raise LookupError(f"{cls.__name__}.{name}")
    for base in owners:
        text = class_comments(base).get(name, "")
        if text:
            return owners[0], text
    return owners[0], ""


def section_keys(section: str, cls: type) -> list[dict]:
    """One row dict per field of a section dataclass: key, type, default, meaning, owner class."""
    rows = []
    for f in dataclasses.fields(cls):
        owner, meaning = _owner(cls, f.name)
        rows.append({"section": section, "key": f.name, "type": f.type if isinstance(f.type, str) else
                     getattr(f.type, "__name__", str(f.type)), "default": _default(f),
                     "meaning": meaning, "owner": owner})
    return rows


def draft_keys() -> list[dict]:
    """The ``draft`` section: one row per key over every registered family, with the families that
    have it; a default or meaning that differs between families is given per family."""
    from draftsmith.drafts import FAMILIES

    merged: dict[str, dict] = {}
    for fam in FAMILIES.values():
        for row in section_keys("draft", fam.config):
            entry = merged.setdefault(row["key"], {**row, "families": [], "per": []})
            entry["families"].append(fam.name)
            entry["per"].append((fam.name, row))
    for entry in merged.values():
        entry["types"] = _grouped(entry["per"], lambda r: r["type"])
        entry["defaults"] = _grouped(entry["per"], lambda r: md.literal(r["default"]))
        entry["meanings"] = _grouped(entry["per"], lambda r: r["meaning"])
    return list(merged.values())


def _grouped(per: list[tuple[str, dict]], value) -> list[tuple[list[str], Any]]:
    """[(families, value)] in registration order, families with the same value together."""
    groups: list[tuple[list[str], Any]] = []
    for name, row in per:
        v = value(row)
        for fams, seen in groups:
            if seen == v:
                fams.append(name)
                break
        else:
            groups.append(([name], v))
    return groups


def all_keys() -> list[dict]:
    """Every key of every section, in the order of RunConfig's sections (draft: every family's)."""
    from draftsmith.config import SECTIONS

    rows = []
    for section, cls in SECTIONS.items():
        rows += draft_keys() if section == "draft" else section_keys(section, cls)
    return rows


def _per_family(groups: list[tuple[list[str], Any]], render) -> str:
    if len(groups) == 1:
        return render(groups[0][1])
    return "<br>".join(f"{', '.join(fams)}: {render(v)}" for fams, v in groups)


def _meaning(section: str, key: str, text: str) -> str:
    from draftsmith.config import CHOICES

    out = md.prose(text)
    try:
        choices = CHOICES[f"{section}.{key}"]
    except KeyError:
        return out
    if out and not out.endswith("."):
        out += "."
    return (out + " " if out else "") + "One of: " + ", ".join(md.code(c) for c in choices) + "."


def render() -> str:
    import draftsmith.config as config
    from draftsmith.config import SECTIONS
    from draftsmith.drafts import FAMILIES

    intro = " ".join(md.prose(p) for p in paragraphs(config.__doc__)[:2])
    lines = md.header("Config keys", intro)
    lines += [f"The sections, in file order: {', '.join(md.code(s) for s in SECTIONS)}. The `draft` section's keys "
              f"depend on `draft.type`: a key of another family is refused by name. Families: "
              + ", ".join(f"{md.code(f.name)} ({md.prose(f.display)})" for f in FAMILIES.values())
              + f"; the default is {md.code(next(iter(FAMILIES)))}.", ""]
    lines += ["Types are the annotations as written in the source (`Optional[int]`: an integer or `null`); "
              "defaults are what a missing key takes. Override any key on the command line with "
              "`--set section.key=value` (the value is parsed as YAML).", ""]
    for section, cls in SECTIONS.items():
        lines += [f"## `{section}`", ""]
        if section == "draft":
            lines += [md.prose(f"Defined by `{cls.__module__}.{cls.__name__}` and each family's subclass "
                               f"(`Family.config`)."), ""]
            rows = [[md.code(e["key"]), _per_family(e["types"], md.code), _per_family(e["defaults"], str),
                     ", ".join(e["families"]) if len(e["families"]) < len(FAMILIES) else "all",
                     _per_family(e["meanings"], lambda t, k=e["key"]: _meaning("draft", k, t))]
                    for e in draft_keys()]
            lines += md.table(["Key", "Type", "Default", "Families", "Meaning"], rows)
        else:
            lines += [md.prose(f"Defined by `{cls.__module__}.{cls.__name__}`."), ""]
            rows = [[md.code(r["key"]), md.code(r["type"]), md.literal(r["default"]),
                     _meaning(section, r["key"], r["meaning"])] for r in section_keys(section, cls)]
            lines += md.table(["Key", "Type", "Default", "Meaning"], rows)
    return "\n".join(lines).rstrip("\n") + "\n"


def missing_meanings() -> list[str]:
    """``section.key (Class)`` for every key whose source has no comment (the test fails on any)."""
    out = []
    for row in all_keys():
        for name, r in row.get("per", [(None, row)]):
            if not r["meaning"].strip():
                out.append(f"{row['section']}.{row['key']} ({r['owner'].__module__}.{r['owner'].__name__})")
    return sorted(set(out))
