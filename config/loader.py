"""Build a `FinetuneConfig` from a YAML preset plus `--set key=value` overrides, and check its paths.

Every failure is a `UserError` with one line that names the key (or the file) and what is accepted.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from config.chat_template import BUILTIN_TEMPLATES
from config.rewards import Reward, RewardKind, check_reward
from config.schema import FinetuneConfig
from config.sections.model_train import BUILTIN_MODELS
from config.sections.run_data import CATALOG_ENTRY
from core.checkout import PROJECT_ROOT
from core.errors import UserError
from core.redact import is_secret_name

PRESETS_DIR = PROJECT_ROOT / "config" / "presets"
DEFAULT_PRESET = "tiny-cpu"
QUIET_KEYS = ("launch.env", "run.storage_options", "data.storage_options")


def preset_path(name_or_path: str) -> Path:
    """A preset name (`tiny-cpu`) or a YAML path, as an existing file."""
    candidate = Path(name_or_path)
    if candidate.suffix not in (".yaml", ".yml") and "/" not in name_or_path:
        candidate = PRESETS_DIR / f"{name_or_path}.yaml"
    if not candidate.is_file():
        known = ", ".join(sorted(p.stem for p in PRESETS_DIR.glob("*.yaml")))
        raise UserError(f"--config {name_or_path}: no such file; give a YAML path or a preset ({known})")
    return candidate


def read_yaml(path: Path) -> dict[str, Any]:
    """The mapping in a YAML file, or a UserError naming the file and line."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise UserError(f"{where}: invalid YAML ({getattr(exc, 'problem', exc)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: a config file must hold a mapping of sections, got {type(data).__name__}")
    return data


def apply_override(tree: dict[str, Any], assignment: str) -> None:
    """Apply one `a.b.c=value` to a nested dict; the value is parsed as a YAML scalar/list."""
    key, sep, raw = assignment.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UserError(f"--set {assignment!r}: expected KEY=VALUE, e.g. --set train.max_steps=100")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    node = tree
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise UserError(f"--set {key}: {part} is a value, not a section")
        node = child
    node[parts[-1]] = value


def format_validation_error(exc: ValidationError, origin: str) -> str:
    """All of pydantic's errors as one line: `origin: key: message (got value); key2: ...`."""
    parts = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            section = key.rsplit(".", 1)[0] if "." in key else None
            allowed = _allowed_keys(section)
            parts.append(f"{key}: unknown key (allowed here: {allowed})")
            continue
        own = str(err["ctx"]["error"]) if err["type"] == "value_error" else ""
        if own.startswith(key):  # a check that names the exact key itself (launch.env.HF_TOKEN ...)
            parts.append(own)
            continue
        got = err.get("input")
        # Never echo what may be a credential: values under launch.env, storage options or a secret-looking name.
        quiet = isinstance(got, dict) or key.startswith(QUIET_KEYS) or any(is_secret_name(str(p)) for p in err["loc"])
        parts.append(f"{key}: {err['msg']}" + ("" if quiet else f" (got {got!r})"))
    return f"{origin}: " + "; ".join(parts)


def _allowed_keys(section: str | None) -> str:
    model: Any = FinetuneConfig
    for part in section.split(".") if section else []:
        field = model.model_fields.get(part)
        if field is None or not hasattr(field.annotation, "model_fields"):
            return "see config/schema.py"
        model = field.annotation
    return ", ".join(model.model_fields)


def validate(tree: dict[str, Any], origin: str) -> FinetuneConfig:
    """A FinetuneConfig from a nested dict, or a one-line UserError."""
    try:
        return FinetuneConfig.model_validate(tree)
    except ValidationError as exc:
        raise UserError(format_validation_error(exc, origin)) from None


def load_config(config: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> FinetuneConfig:
    """Preset (default `tiny-cpu`) + overrides -> validated config with absolute, existing paths."""
    path = preset_path(config or DEFAULT_PRESET)
    tree = read_yaml(path)
    for assignment in overrides:
        apply_override(tree, assignment)
    _let_hosts_decide(tree, overrides)
    origin = f"config {path.name}" + (" with --set" if overrides else "")
    return check_paths(validate(tree, origin))


def _let_hosts_decide(tree: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> None:
    """With the ssh backend the hosts decide launch.nnodes (and a host file launch.nproc_per_node): a preset's
    values give way; only values set with --set must agree with the hosts (config/sections/launch.py says so
    otherwise)."""
    launch = tree.get("launch")
    if not isinstance(launch, dict) or launch.get("backend") != "ssh":
        return
    decided = ["nnodes"] + ([] if launch.get("hosts") else ["nproc_per_node"])
    for key in decided:
        if not any(o.split("=", 1)[0].strip() == f"launch.{key}" for o in overrides):
            launch.pop(key, None)


def _found(path: Path) -> bool:
    """Whether a path exists, or a glob pattern matches something."""
    return bool(glob.glob(str(path), recursive=True)) if _is_glob(str(path)) else path.exists()


def _is_glob(path: str) -> bool:
    return any(char in path for char in "*?[")


def resolve_local(path: str) -> str:
    """A relative path (or glob) made absolute: against the working directory, else the project root."""
    if "://" in path or os.path.isabs(path):
        return path
    candidates = [Path.cwd() / path, PROJECT_ROOT / path]
    chosen = next((c for c in candidates if _found(c)), candidates[0])
    # resolve() would follow symlinks inside a pattern; a glob only needs to be absolute.
    return str(chosen.absolute()) if _is_glob(path) else str(chosen.resolve())


def check_source(key: str, value: str | None) -> str | None:
    """A data source made absolute; a local file, directory or glob must exist or match (URLs are read later).
    A dataset_info.json entry (`path/dataset_info.json#name`) keeps its `#name`."""
    if value is None:
        return None
    if "://" in value and not value.startswith("file://"):
        return value
    path, entry = value, ""
    if (match := CATALOG_ENTRY.match(value)) is not None:
        path, entry = match["path"], f"#{match['name']}"
    return _check_local_source(key, path) + entry


def _check_local_source(key: str, value: str) -> str:
    resolved = resolve_local(value.removeprefix("file://"))
    if _is_glob(resolved):
        if not glob.glob(resolved, recursive=True):
            raise UserError(
                f"{key}: {value} matches no file; check the pattern (relative patterns are tried "
                f"against the working directory, then {PROJECT_ROOT})"
            )
    elif not os.path.exists(resolved):
        raise UserError(
            f"{key}: {value} does not exist; give an existing file, directory or glob (relative paths "
            f"are tried against the working directory, then {PROJECT_ROOT})"
        )
    return resolved


def check_paths(cfg: FinetuneConfig) -> FinetuneConfig:
    """Make the config's local paths absolute and fail early, naming the key, when one is missing."""
    data_source = cfg.data.source if cfg.data.sources else check_source("data.source", cfg.data.source)
    eval_source = check_source("data.eval_source", cfg.data.eval_source)
    sources = [
        s.model_copy(update={"source": check_source(f"data.sources[{i}].source", s.source)})
        for i, s in enumerate(cfg.data.sources or [])
    ] or None
    ds_config = resolve_local(cfg.deepspeed.config)
    model_path = cfg.model.name_or_path
    if model_path not in BUILTIN_MODELS:
        model_path = resolve_local(model_path)
    template = cfg.model.chat_template
    if template is not None and template not in BUILTIN_TEMPLATES:
        template = resolve_local(template)
    storage = cfg.run.storage if "://" in cfg.run.storage else str(Path(cfg.run.storage).resolve())
    # Absolute, as every node reads it, but not checked here: it must exist on the nodes (their preflight checks it),
    # not on the machine that reads the config.
    tasks = cfg.eval.tasks
    if tasks.include_path is not None:
        tasks = tasks.model_copy(update={"include_path": resolve_local(os.path.expanduser(tasks.include_path))})
    rl = cfg.train.rl.model_copy(update={"rewards": check_rewards(cfg.train.rl.rewards)})
    checks = [("deepspeed.config", ds_config)]
    if model_path not in BUILTIN_MODELS:
        checks.append(("model.name_or_path", model_path))
    if template is not None and template not in BUILTIN_TEMPLATES:
        checks.append(("model.chat_template", template))
    for key, value in checks:
        if "://" not in value and not os.path.exists(value):
            raise UserError(
                f"{key}: {value} does not exist; give an existing path (relative paths are tried "
                f"against the working directory, then {PROJECT_ROOT})"
            )
    return cfg.model_copy(
        update={
            "run": cfg.run.model_copy(update={"storage": storage}),
            "data": cfg.data.model_copy(update={"source": data_source, "eval_source": eval_source, "sources": sources}),
            "model": cfg.model.model_copy(update={"name_or_path": model_path, "chat_template": template}),
            "deepspeed": cfg.deepspeed.model_copy(update={"config": ds_config}),
            "eval": cfg.eval.model_copy(update={"tasks": tasks}),
            "train": cfg.train.model_copy(update={"rl": rl}),
        }
    )


def check_rewards(rewards: list[str]) -> list[str]:
    """train.rl.rewards with each file's path made absolute; a missing file, module or function stops here, in one
    line naming it (config/rewards.py `check_reward`)."""
    out = []
    for text in rewards:
        reward = Reward.of(text)
        if reward.kind is RewardKind.FILE:
            reward = Reward(reward.kind, resolve_local(reward.target), reward.function)
        try:
            check_reward(reward)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        out.append(reward.text)
    return out
