"""The methods as the config knows them (config/methods.py): `train.method` is the registry's object, read from its
name and written back as it (spec.json, `--print-config`, the UI form); each method answers what the code asks of it;
and no production module compares a method's name outside the registry (a method is asked through its object, and a
name read from storage, a checkpoint's manifest or a registry entry, is looked up in `METHODS` first)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from config.loader import load_config
from config.methods import FULL, LORA, METHODS, QLORA
from config.schema import FinetuneConfig
from core.errors import UserError
from tests.unit.test_layout import ROOT, sources

REGISTRY = ROOT / "config" / "methods.py"


def test_the_method_is_the_registrys_object_and_its_name_in_files() -> None:
    cfg = FinetuneConfig.model_validate({"train": {"method": "qlora"}})
    assert cfg.train.method is QLORA and FinetuneConfig().train.method is LORA
    dumped = cfg.model_dump(mode="json")
    assert dumped["train"]["method"] == "qlora" and cfg.model_dump()["train"]["method"] == "qlora"
    assert FinetuneConfig.model_validate(dumped) == cfg  # spec.json's round trip
    assert FinetuneConfig.model_validate(dumped).train.method is QLORA
    assert yaml.safe_load(yaml.safe_dump(dumped))["train"]["method"] == "qlora"  # --print-config's
    schema = FinetuneConfig.model_json_schema()["$defs"]["TrainConfig"]["properties"]["method"]
    assert (schema["enum"], schema["default"]) == (["full", "lora", "qlora"], "lora")  # the UI form's choices
    assert f"{cfg.train.method}" == "qlora"  # how log lines and the model card write it
    with pytest.raises(UserError) as info:
        load_config(None, ["train.method=dora"])
    assert "train.method: Input should be 'full', 'lora' or 'qlora' (got 'dora')" in str(info.value)


def test_each_method_answers_what_the_code_asks() -> None:
    answers = {
        name: (m.trains_adapters, m.quantizes_base, m.loads_partitioned, m.evaluated_as) for name, m in METHODS.items()
    }
    assert answers == {
        "full": (False, False, True, FULL),
        "lora": (True, False, True, LORA),
        "qlora": (True, True, False, LORA),  # its adapters evaluated on the full-precision base, as its export
    }
    assert list(METHODS.values()) == [FULL, LORA, QLORA] and all(METHODS[m.name] is m for m in METHODS.values())


def names_compared(path: Path) -> list[int]:
    """The line of each comparison of a method's name in a module: a string constant that names a method, compared
    (==, !=, in) with an expression that mentions a method."""
    names = set(METHODS)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        constants = {
            c.value
            for part in (node.left, *node.comparators)
            for c in ast.walk(part)
            if isinstance(c, ast.Constant) and isinstance(c.value, str)
        }
        if constants & names and "method" in ast.unparse(node):
            found.append(node.lineno)
    return found


def test_no_module_compares_a_methods_name() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}" for _, path in sources() if path != REGISTRY for line in names_compared(path)
    ]
    assert not offenders, f"methods dispatched by name (use the method's own attributes): {offenders}"


def test_the_check_finds_a_comparison(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text(
        "def f(train, entry, mode):\n"
        '    if train.method == "full":\n'
        '        return entry.get("method", "lora") in ("lora", "qlora")\n'
        '    return mode == "full"\n'
    )
    assert names_compared(module) == [2, 3]
