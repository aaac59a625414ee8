"""The base model as a local directory: a user's own as given, or a built-in model (`tiny`, `tiny-qwen2.5`) built
once in a subprocess (torch stays out of the pipeline's process) and kept under its recipe's digest."""

from __future__ import annotations

import subprocess
import sys

from config.chat_template import TEMPLATE_DIR
from config.schema import FinetuneConfig
from config.sections.model_train import BUILTIN_MODELS
from core.checkout import PROJECT_ROOT
from core.errors import UserError
from storage import layout
from storage.digest import digest_bytes
from storage.fs import exists
from storage.location import Location, is_local, join, local_path

TINY_CORPUS = PROJECT_ROOT / "data" / "sample" / "conversations.json"


def tiny_model_url(storage: Location, model: str = "tiny") -> Location:
    """Where a built-in model lives: named by the digest of its recipe inputs, so it is built once.

    `from_pretrained` needs a local directory, so with object-store storage the model goes to a local
    cache; the build is deterministic, so every machine that builds it gets the same bytes.
    """
    sources = [
        PROJECT_ROOT / "trainer" / "tiny.py",
        PROJECT_ROOT / "trainer" / "tiny_qwen.py",
        TINY_CORPUS,
        TEMPLATE_DIR / "qwen2.5.jinja",
    ]
    recipe = b"".join(path.read_bytes() for path in sources)
    name = f"{model}-{digest_bytes(recipe, 'blake3')[:12]}"
    if is_local(storage):
        return layout.model_dir(storage, name)
    return Location(str(PROJECT_ROOT / ".tandem" / "models" / name))


def resolve_model(cfg: FinetuneConfig) -> str:
    """The base model's local directory; builds a built-in model in a subprocess (torch stays out of the flow)."""
    name = cfg.model.name_or_path
    if name not in BUILTIN_MODELS:
        return name
    url = tiny_model_url(layout.root(cfg.run), name)
    if not exists(join(url, layout.COMPLETE)):
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "trainer.tiny",
                "--out",
                local_path(url),
                "--corpus",
                str(TINY_CORPUS),
                "--model",
                name,
            ],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
        )
        if result.returncode == 2:  # a UserError (e.g. Qwen's tokenizer package missing): its one line
            raise UserError(result.stderr.strip().splitlines()[-1])
        if result.returncode != 0:
            raise RuntimeError(f"building the {name} model failed:\n{result.stderr[-2000:]}")
    return local_path(url)
