"""Config loading and validation: presets, typed overrides, one-line errors naming the key."""

from __future__ import annotations

import pytest

from config.loader import PRESETS_DIR, load_config
from config.methods import METHODS
from config.schema import FinetuneConfig
from core.errors import UserError


@pytest.mark.parametrize("preset", sorted(p.stem for p in PRESETS_DIR.glob("*.yaml")))
def test_every_preset_validates_and_starts_with_its_command(preset: str) -> None:
    import itertools

    import yaml

    text = (PRESETS_DIR / f"{preset}.yaml").read_text()
    header = list(itertools.takewhile(lambda line: line.startswith("#"), text.splitlines()))
    assert any("python -m flows.finetune" in line for line in header), f"{preset}.yaml must start with its command"
    tree = yaml.safe_load(text)
    cfg = FinetuneConfig.model_validate(tree)
    assert cfg.launch.nnodes >= 1


def test_gpu_presets_mirror_qwen_scripts() -> None:
    import yaml

    for name, method, lr, stage in (
        ("qwen-7b-lora", "lora", 3e-4, 2),
        ("qwen-7b-qlora", "qlora", 3e-4, 2),
        ("qwen-14b-full", "full", 1e-5, 3),
    ):
        cfg = FinetuneConfig.model_validate(yaml.safe_load((PRESETS_DIR / f"{name}.yaml").read_text()))
        assert (cfg.train.method, cfg.train.learning_rate) == (METHODS[method], lr)
        assert (cfg.train.micro_batch_size, cfg.train.gradient_accumulation_steps) == (2, 8)
        assert (cfg.data.max_length, cfg.train.lr_scheduler) == (512, "cosine")
        assert (cfg.train.warmup_ratio, cfg.train.weight_decay) == (0.01, 0.1)
        assert f"zero{stage}.json" in cfg.deepspeed.config


def test_default_preset_loads_with_absolute_existing_paths() -> None:
    cfg = load_config()
    assert cfg.model.name_or_path == "tiny"
    assert cfg.data.source.startswith("/") and cfg.deepspeed.config.startswith("/")
    assert cfg.world_size == 2


def test_the_task_directory_is_made_absolute_but_not_required_where_the_config_is_read(tmp_path, monkeypatch) -> None:
    """eval.tasks.include_path: every node reads it at the same path, and the nodes check it (preflight), not the
    machine that reads the config."""
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["eval.tasks.names=[mine]", "eval.tasks.include_path=my-tasks"])
    assert cfg.eval.tasks.include_path == str(tmp_path / "my-tasks")
    home = load_config(None, ["eval.tasks.names=[mine]", "eval.tasks.include_path=~/tasks"]).eval.tasks.include_path
    assert home is not None and home.startswith("/") and "~" not in home


def test_overrides_are_typed() -> None:
    cfg = load_config(None, ["train.max_steps=7", "launch.env={NCCL_SOCKET_IFNAME: eth0}", "run.name=abc"])
    assert cfg.train.max_steps == 7
    assert cfg.launch.env == {"NCCL_SOCKET_IFNAME": "eth0"}
    assert cfg.run.name == "abc"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("train.learning_rate=-1", "train.learning_rate: Input should be greater than 0 (got -1)"),
        ("train.method=sgd", "train.method: Input should be 'full', 'lora' or 'qlora'"),
        ("train.lerning_rate=1e-4", "train.lerning_rate: unknown key (allowed here: method, learning_rate"),
        ("bogus.key=1", "bogus: unknown key (allowed here: run, data, model"),
        ("data.source=/nonexistent/x.json", "data.source: /nonexistent/x.json does not exist"),
        ("deepspeed.config=nope.json", "deepspeed.config:"),
        ("train.max_steps", "--set 'train.max_steps': expected KEY=VALUE"),
    ],
)
def test_bad_values_give_one_line_naming_the_key(override: str, expected: str) -> None:
    with pytest.raises(UserError) as info:
        load_config(None, [override])
    message = str(info.value)
    assert expected in message
    assert "\n" not in message


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(UserError, match=r"no such file; give a YAML path or a preset \(.*tiny-cpu"):
        load_config("no-such-preset")
