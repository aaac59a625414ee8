"""The base model as a local directory: a user's own as given, or a built-in model (`tiny`, `tiny-qwen2.5`) built
once in a subprocess (torch stays out of the pipeline's process) and kept under its recipe's digest."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from config.chat_template import TEMPLATE_DIR
from config.loader import DEFAULT_PRESET, preset_path, read_yaml
from config.schema import FinetuneConfig
from config.sections.model_train import BUILTIN_MODELS
from core.checkout import PROJECT_ROOT
from core.errors import UserError
from storage import layout
from storage.digest import digest_bytes
from storage.fs import exists
from storage.location import Location, is_local, join, local_path

TINY_CORPUS = PROJECT_ROOT / "data" / "sample" / "conversations.json"
BUILTIN_PREFIX = "tandem-"  # a built-in model's registry name: tandem-tiny, tandem-tiny-qwen2.5
# A Hugging Face cache snapshot (.../models--Qwen--Qwen2.5-0.5B-Instruct/snapshots/<commit>) is named by its repository.
HUB_SNAPSHOT = re.compile(r"models--[^/]+--([^/]+)/snapshots/[^/]+$")


def registry_name(cfg: FinetuneConfig) -> str:
    """The name the trained model registers under (the registry's, MLflow's and the model card's):
    register.model_name, else the model's own (`model_name_of`)."""
    return cfg.register.model_name or model_name_of(cfg.model.name_or_path)


def model_name_of(name_or_path: str) -> str:
    """A model's directory or hub repository name, lowercased (Qwen/Qwen2.5-0.5B-Instruct: qwen2.5-0.5b-instruct);
    tandem-<name> for a built-in model, by its name or a directory trainer.model.tiny built."""
    if name_or_path in BUILTIN_MODELS:
        return BUILTIN_PREFIX + name_or_path
    if built := builtin_in(Path(name_or_path)):
        return BUILTIN_PREFIX + built
    path = name_or_path.rstrip("/")
    snapshot = HUB_SNAPSHOT.search(path)
    base = snapshot.group(1) if snapshot else path.rsplit("/", 1)[-1]
    # register.model_name's pattern: letters, digits, '.', '_' and '-', a letter or digit first.
    name = re.sub(r"[^a-z0-9._-]+", "-", base.lower()).strip("._-")[:100]
    return name or "model"


def toy_length_note(cfg: FinetuneConfig) -> str | None:
    """Why data.max_length may be too small: a real model trained with the default preset's length, which is sized for
    the built-in tiny model (None for a built-in model, or another length)."""
    toy = read_yaml(preset_path(DEFAULT_PRESET))["data"]["max_length"]
    name = cfg.model.name_or_path
    if name in BUILTIN_MODELS or builtin_in(Path(name)) or cfg.data.max_length != toy:
        return None
    return (
        f"data.max_length={toy} is the {DEFAULT_PRESET} preset's, sized for its built-in tiny model; {name} is a real "
        "model: set data.max_length to what it and your records need (e.g. 2048)"
    )


def builtin_in(directory: Path) -> str | None:
    """Which built-in model a directory holds, from the COMPLETE marker trainer.model.tiny writes last (None:
    another)."""
    try:
        marker = json.loads((directory / layout.COMPLETE).read_text())
    except (OSError, ValueError):
        return None
    built = marker.get("model") if isinstance(marker, dict) else None
    return built if built in BUILTIN_MODELS else None


def tiny_model_url(storage: Location, model: str = "tiny") -> Location:
    """Where a built-in model lives: named by the digest of its recipe inputs, so it is built once.

    `from_pretrained` needs a local directory, so with object-store storage the model goes to a local
    cache; the build is deterministic, so every machine that builds it gets the same bytes.
    """
    sources = [
        PROJECT_ROOT / "trainer" / "model" / "tiny.py",
        PROJECT_ROOT / "trainer" / "model" / "tiny_qwen.py",
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
                "trainer.model.tiny",
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
