"""Chat templates: the built-in ones by name, and `model.chat_template` resolved to the template's text.

`model.chat_template` is a name from `BUILTIN_TEMPLATES` or a path to a Jinja file; the text it names replaces
the tokenizer's own template for staging, for the export (`final/chat_template.jinja`) and in the spec, so the
model is trained and served with one template.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from core.errors import UserError

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
# name -> file under config/templates/
BUILTIN_TEMPLATES = {"qwen2.5": "qwen2.5.jinja"}


def builtin_template(name: str) -> str:
    """The text of a built-in template."""
    return (TEMPLATE_DIR / BUILTIN_TEMPLATES[name]).read_text(encoding="utf-8")


def resolve_chat_template(value: str | None) -> str | None:
    """The template text `model.chat_template` names (None: the tokenizer's own)."""
    if value is None:
        return None
    if value in BUILTIN_TEMPLATES:
        return builtin_template(value)
    path = Path(value)
    if not path.is_file():
        names = ", ".join(sorted(BUILTIN_TEMPLATES))
        raise UserError(
            f"model.chat_template: {value} is neither a built-in template ({names}) nor a file; "
            "give one of those names or the path of a Jinja chat template"
        )
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise UserError(f"model.chat_template: {value} is empty; give a Jinja chat template")
    return text


def template_digest(text: str) -> str:
    """sha256 of a template's UTF-8 bytes (as recorded in the model card)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
