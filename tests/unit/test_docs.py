"""The README and the documentation site against the code they describe: every page is in the site's nav, the README
stays a first visit whose links land, the record shown for each data format is read as that format, and the
commands the pages show name presets, config keys, make targets and modules that exist. (The strict site build,
which checks every link and anchor between pages, runs in `make lint`.)"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from config.loader import PRESETS_DIR
from config.reference import slug
from config.schema import FinetuneConfig
from staging.formats import FORMATS, NORMALIZERS, detect_format

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
GENERATED = {DOCS / "reference" / "configuration.md"}  # its commands come from the schema itself
README_MAX_LINES = 250


def pages() -> list[Path]:
    """The README and every page the site builds from."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def nav_pages(entries: Any) -> list[str]:
    """The page paths of mkdocs.yml's nav, however deep."""
    if isinstance(entries, str):
        return [entries]
    if isinstance(entries, list):
        return [page for entry in entries for page in nav_pages(entry)]
    if isinstance(entries, dict):
        return [page for value in entries.values() for page in nav_pages(value)]
    return []


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page() -> None:
    nav = nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    on_disk = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(nav) == on_disk
    assert "architecture.md" in nav and "reference/configuration.md" in nav


def headings(path: Path) -> set[str]:
    """The anchors of a Markdown page's headings (outside code blocks)."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return {slug(m.group(1).replace("`", "")) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def test_the_readme_is_a_first_visit_whose_links_land() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < README_MAX_LINES
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", readme)
    assert len({target for target, _ in links}) >= 10  # it points at the site's pages
    for target, anchor in links:
        assert (ROOT / target).is_file(), target
        if anchor:
            assert anchor in headings(ROOT / target), f"{target}#{anchor}"


def records(page: str) -> list[tuple[str, Any]]:
    """(format, record) of each `<!-- record: FORMAT -->` example on a page."""
    return [
        (fmt, json.loads(block))
        for fmt, block in re.findall(r"<!-- record: (\w+) -->.*?```json\n(.*?)```", page, flags=re.S)
    ]


def test_the_record_shown_for_each_format_is_read_as_that_format() -> None:
    shown = records((DOCS / "data.md").read_text(encoding="utf-8"))
    assert sorted({fmt for fmt, _ in shown}) == sorted(FORMATS)
    for fmt, record in shown:
        assert detect_format("docs/data.md", [record])[0] == fmt, record
        normalized = NORMALIZERS[fmt](record)  # raises InvalidRecord, with the reason, when the example is wrong
        assert normalized.get("messages") or normalized.get("text")


def config_key_exists(key: str) -> bool:
    """Whether a dotted key names a field of the config (a key under a mapping such as launch.env counts)."""
    model: Any = FinetuneConfig
    for part in key.split("."):
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return isinstance(model, dict) or model is dict
        field = model.model_fields.get(part)
        if field is None:
            return False
        annotation = field.annotation
        args = [a for a in getattr(annotation, "__args__", ()) if a is not type(None)]
        model = next((a for a in (annotation, *args) if isinstance(a, type) and issubclass(a, BaseModel)), annotation)
        model = dict if getattr(model, "__origin__", None) is dict else model
    return True


def module_exists(module: str) -> bool:
    """Whether `python -m module` finds a file of this checkout (without importing it)."""
    base = ROOT.joinpath(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()


def mentions(pattern: str) -> list[tuple[str, str]]:
    """(page, match) of a pattern over the README and the hand-written pages."""
    return [
        (str(path.relative_to(ROOT)), match)
        for path in pages()
        if path not in GENERATED
        for match in re.findall(pattern, path.read_text(encoding="utf-8"))
    ]


@pytest.mark.parametrize(
    ("what", "pattern", "exists"),
    [
        ("config key", r"--set[ =]['\"]?([a-z_]+(?:\.[a-z_]+)+)=", config_key_exists),
        ("preset", r"--config ([a-z0-9][a-z0-9-]*)(?=[\s`])", lambda name: (PRESETS_DIR / f"{name}.yaml").is_file()),
        (
            "make target",
            r"(?m)(?:^\s*|`)make ([a-z][a-z-]+)",  # a command: in a code block or span, not prose ("make it")
            lambda target: re.search(rf"^{target}:", (ROOT / "Makefile").read_text(), re.M) is not None,
        ),
        ("module", r"python -m ([a-z_]+(?:\.[a-z_]+)*)", module_exists),
    ],
)
def test_commands_on_the_pages_name_what_exists(what: str, pattern: str, exists: Any) -> None:
    found = mentions(pattern)
    assert found, f"no {what} found: the pattern is wrong"
    missing = sorted({f"{page}: {name}" for page, name in found if not exists(name)})
    assert not missing, f"the pages name a {what} that does not exist: {missing}"
