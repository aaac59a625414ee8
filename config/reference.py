"""The configuration reference page, generated from the schema so that it cannot drift from the code: every key of
`FinetuneConfig` with its type, default, bounds and description (one table per section, nested sections and the
entries of `data.sources` in tables of their own), then the keys each preset of config/presets/ sets.

    python -m config.reference --write     # regenerate docs/reference/configuration.md
    python -m config.reference --check     # exit 1 when the committed page differs from the code (make lint)
    python -m config.reference             # print the page

A field without a description stops the generator with a line naming it: the page documents every key or none.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, WithJsonSchema
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from config.loader import DEFAULT_PRESET, PRESETS_DIR
from config.schema import FinetuneConfig
from core.checkout import PROJECT_ROOT

PAGE = Path("docs/reference/configuration.md")
COMMAND = f"python -m config.reference --write {PAGE}"
# Field metadata that bounds a value (pydantic's Field arguments), in the order the page lists them.
BOUNDS = (("gt", "> {}"), ("ge", "≥ {}"), ("lt", "< {}"), ("le", "≤ {}"))
LENGTHS = (("min_length", "length ≥ {}"), ("max_length", "length ≤ {}"))

HEADER = f"""# Configuration reference

*Generated from `config/sections/` and `config/presets/` by `{COMMAND}`: edit the fields' descriptions
there and rerun it, not this page. `make lint` fails when the page and the code differ.*

Every key of a run's config, with its type, its default, the bounds it is checked against and what it does, generated
from the schema (`config/schema.py` and `config/sections/`). A config is a preset (`--config NAME` or a YAML path;
default `tiny-cpu`) plus `--set key=value` overrides, whose values are parsed as YAML; unknown keys are refused. To
see the resolved config of a command line without running anything, add `--print-config`:

```bash
python -m flows.finetune --set train.max_steps=100 --set launch.nnodes=3 --print-config
```

`null` is an empty value (`--set train.max_steps=null`); where a key may be empty, its description says what empty
means. Checks that read several keys (the node counts of an elastic run, the global batch against the world
size, a gate's direction against its metric) run after these, and their errors name the keys involved
([Troubleshooting](../troubleshooting.md)). [Configuration](../configuration.md) explains how the pieces fit.
"""


class MissingDescription(ValueError):
    """A config field has no description, so the reference cannot document it."""


@dataclass(frozen=True)
class Table:
    """One section's table: its dotted name (`train`, `train.lora`, `data.sources[]`) and its model."""

    key: str
    model: type[BaseModel]


def slug(heading: str) -> str:
    """The anchor MkDocs (and GitHub) give a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", heading.lower()).strip())


def _section_of(annotation: Any) -> tuple[type[BaseModel], bool] | None:
    """(the section model, whether it is a list of them) when a field holds a section, else None."""
    args = [a for a in get_args(annotation) if a is not type(None)] if _is_union(annotation) else [annotation]
    for arg in args:
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg, False
        if get_origin(arg) is list and _section_of(get_args(arg)[0]) is not None:
            return get_args(arg)[0], True
    return None


def _is_union(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType)


def tables(model: type[BaseModel] = FinetuneConfig, prefix: str = "") -> Iterator[Table]:
    """Every section of the config, depth first in the schema's order."""
    for name, field in model.model_fields.items():
        found = _section_of(field.annotation)
        if found is None:
            continue
        section, many = found
        key = f"{prefix}{name}" + ("[]" if many else "")
        yield Table(key, section)
        yield from tables(section, f"{key}.")


def description(key: str, field: FieldInfo) -> str:
    """A field's description (a section's docstring when the field has none); MissingDescription otherwise."""
    text = field.description
    found = _section_of(field.annotation)
    if not text and found is not None:
        text = found[0].__dict__.get("__doc__")
    if not text or not text.strip():
        raise MissingDescription(
            f"{key} has no description; add description=... to its Field in config/sections/ and run {COMMAND}"
        )
    return " ".join(text.split())


def missing_descriptions(model: type[BaseModel] = FinetuneConfig, prefix: str = "") -> list[str]:
    """The dotted keys of every field, nested sections included, that has no description."""
    missing = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        try:
            description(key, field)
        except MissingDescription:
            missing.append(key)
        if (found := _section_of(field.annotation)) is not None:
            missing += missing_descriptions(found[0], f"{key}{'[]' if found[1] else ''}.")
    return missing


def type_name(annotation: Any, key: str = "") -> str:
    """How the page writes a field's type: `int`, list of `str`, one of `a`, `b`, a section's link, `...` or null."""
    if _is_union(annotation):
        args = get_args(annotation)
        named = _or([type_name(a, key) for a in args if a is not type(None)])
        return f"{named} or null" if type(None) in args else named
    if get_origin(annotation) is Literal:
        return "one of " + ", ".join(f"`{choice}`" for choice in get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"section [`{key}`](#{slug(key)})"
    if get_origin(annotation) is list:
        if _section_of(annotation) is not None:
            return f"list of [`{key}[]`](#{slug(key + '[]')}) entries"
        return f"list of {type_name(get_args(annotation)[0], key)}"
    if get_origin(annotation) is dict:
        keys, values = get_args(annotation)
        return f"mapping of {type_name(keys, key)} to {type_name(values, key)}"
    return f"`{getattr(annotation, '__name__', annotation)}`"


def field_type(field: FieldInfo, key: str) -> str:
    """A field's type as the page writes it: a value the schema gives as a string choice (train.objective, an object
    in the config and its name in files) as its choices, any other as `type_name` writes its annotation."""
    for item in field.metadata:
        if isinstance(item, WithJsonSchema) and item.json_schema and "enum" in item.json_schema:
            return "one of " + ", ".join(f"`{choice}`" for choice in item.json_schema["enum"])
    return type_name(field.annotation, key)


def _or(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def value_text(value: Any) -> str:
    """A value as YAML writes it, in a code span: `null`, `true`, `0.0003`, `[]`, `tiny`."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    text = json.dumps(value) if isinstance(value, list | dict | bool) or value is None else str(value)
    return f"`{text}`"


def default_text(key: str, field: FieldInfo) -> str:
    """A field's default: its value, a section's pointer, or *required*."""
    found = _section_of(field.annotation)
    if field.default_factory is not None:
        if found is not None and not found[1]:
            return f"see [`{key}`](#{slug(key)})"
        return value_text(field.default_factory())  # type: ignore[call-arg]
    if field.default is PydanticUndefined:
        return "*required*"
    return value_text(field.default)


def bounds_text(field: FieldInfo) -> str:
    """The checks pydantic applies to a field's value: numeric bounds, lengths, a pattern."""
    found: dict[str, Any] = {}
    for item in field.metadata:
        for name in ("gt", "ge", "lt", "le", "min_length", "max_length", "pattern"):
            if getattr(item, name, None) is not None:
                found[name] = getattr(item, name)
    parts = [text.format(found[name]) for name, text in BOUNDS + LENGTHS if name in found]
    if "pattern" in found:
        parts.append(f"matches `{found['pattern']}`")
    return ", ".join(parts)


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def section_markdown(table: Table) -> str:
    """One section: its heading, its docstring and the table of its keys."""
    doc = " ".join((table.model.__dict__.get("__doc__") or "").split())
    lines = [
        f"## {table.key}",
        "",
        doc,
        "",
        "| key | type | default | bounds | description |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, field in table.model.model_fields.items():
        key = f"{table.key}.{name}"
        row = (
            f"`{key}`",
            field_type(field, key),
            default_text(key, field),
            bounds_text(field),
            description(key, field),
        )
        lines.append("| " + " | ".join(_cell(cell) for cell in row) + " |")
    return "\n".join(lines) + "\n"


def flatten(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf of a nested mapping; lists are values."""
    for name, value in tree.items():
        if isinstance(value, dict) and value:
            yield from flatten(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


def schema_default(key: str) -> Any:
    """The default of a dotted key, read from a config built with no values."""
    node: Any = FinetuneConfig()
    for part in key.split("."):
        if node is None:  # inside an optional section that is unset by default (register.gate)
            return None
        node = getattr(node, part)
    return node


def preset_markdown(path: Path) -> str:
    """A preset: what it is and the command that runs it (its opening comment), then every key it sets."""
    text = path.read_text(encoding="utf-8")
    opening = list(itertools.takewhile(lambda line: line.startswith("#"), text.splitlines()))
    about = [line.lstrip("#").strip() for line in opening if not line.startswith("#   ")]
    command = [line[4:] for line in opening if line.startswith("#   ")]
    lines = [f"### {path.stem}", "", " ".join(about), ""]
    if command:
        lines += ["```bash", *command, "```", ""]
    lines += ["| key | value | default |", "| --- | --- | --- |"]
    for key, value in flatten(yaml.safe_load(text) or {}):
        lines.append(f"| `{key}` | {_cell(value_text(value))} | {_cell(value_text(schema_default(key)))} |")
    return "\n".join(lines) + "\n"


def render() -> str:
    """The whole page."""
    all_tables = list(tables())
    toc = ["| section | what it holds |", "| --- | --- |"]
    toc += [
        f"| [`{t.key}`](#{slug(t.key)}) | {_cell(' '.join((t.model.__dict__.get('__doc__') or '').split()))} |"
        for t in all_tables
    ]
    # The default preset first, then the others by name.
    presets = sorted(PRESETS_DIR.glob("*.yaml"), key=lambda p: (p.stem != DEFAULT_PRESET, p.stem))
    parts = [HEADER, "\n".join(toc) + "\n", *(section_markdown(t) for t in all_tables)]
    parts.append(
        "## Presets\n\nThe keys each preset of `config/presets/` sets, beside the schema's default; every other key "
        "keeps its default. Each preset's opening lines give the command that runs it.\n"
    )
    parts += [preset_markdown(p) for p in presets]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Write, check or print the reference page."""
    parser = argparse.ArgumentParser(prog="python -m config.reference", description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", nargs="?", const=str(PAGE), metavar="PATH", help=f"write the page (default {PAGE})")
    mode.add_argument("--check", nargs="?", const=str(PAGE), metavar="PATH", help="exit 1 when PATH differs")
    args = parser.parse_args(argv)
    try:
        page = render()
    except MissingDescription as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.write:
        target = PROJECT_ROOT / args.write
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(page, encoding="utf-8")
        return 0
    if args.check:
        path = PROJECT_ROOT / args.check
        if not path.is_file() or path.read_text(encoding="utf-8") != page:
            print(
                f"error: {args.check} does not match the schema; run python -m config.reference --write {args.check}",
                file=sys.stderr,
            )
            return 1
        return 0
    print(page, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
