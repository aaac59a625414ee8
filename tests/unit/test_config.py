"""Config loading and validation: presets, overrides, one-line errors, DeepSpeed "auto" resolution."""

from __future__ import annotations

import json

import pytest

from config.deepspeed import ModelShape, read_deepspeed_json, resolve_from_runtime, resolve_from_train
from config.loader import PRESETS_DIR, load_config
from config.schema import FinetuneConfig
from config.sections.model_train import TrainConfig
from core.errors import UserError
from tests.qwen_configs import QWEN_ZERO2, QWEN_ZERO3


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
        assert (cfg.train.method, cfg.train.learning_rate) == (method, lr)
        assert (cfg.train.micro_batch_size, cfg.train.gradient_accumulation_steps) == (2, 8)
        assert (cfg.data.max_length, cfg.train.lr_scheduler) == (512, "cosine")
        assert (cfg.train.warmup_ratio, cfg.train.weight_decay) == (0.01, 0.1)
        assert f"zero{stage}.json" in cfg.deepspeed.config


def test_default_preset_loads_with_absolute_existing_paths() -> None:
    cfg = load_config()
    assert cfg.model.name_or_path == "tiny"
    assert cfg.data.source.startswith("/") and cfg.deepspeed.config.startswith("/")
    assert cfg.world_size == 2


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


@pytest.mark.parametrize("qwen", [QWEN_ZERO2, QWEN_ZERO3], ids=["zero2", "zero3"])
def test_qwen_deepspeed_json_is_accepted_unchanged(tmp_path, qwen) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(qwen))
    train = TrainConfig(micro_batch_size=2, gradient_accumulation_steps=8, learning_rate=3e-4, max_grad_norm=1.0)
    ds = resolve_from_train(read_deepspeed_json(str(path)), train, world_size=16)
    assert ds["train_batch_size"] == 2 * 8 * 16
    assert ds["optimizer"]["params"]["lr"] == 3e-4
    assert "scheduler" not in ds  # the schedule belongs to train.lr_scheduler
    final = resolve_from_runtime(ds, bf16=False, shape=ModelShape(64, 1000))
    assert final["bf16"]["enabled"] is False and final["fp16"]["enabled"] is False
    assert "auto" not in json.dumps(final)


def test_conflicting_explicit_batch_size_is_refused() -> None:
    ds = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}
    with pytest.raises(UserError, match="train_micro_batch_size_per_gpu=4 but train gives 2"):
        resolve_from_train(ds, TrainConfig(), world_size=1)


def test_unresolvable_auto_names_the_key() -> None:
    with pytest.raises(UserError, match=r"cannot resolve \"auto\" for zero_optimization.stage"):
        resolve_from_runtime({"zero_optimization": {"stage": "auto"}}, bf16=False, shape=ModelShape(8, 100))


@pytest.mark.parametrize(
    ("setting", "environ", "expected"),
    [
        (None, {}, None),  # unset, no variable: MLflow is off
        (None, {"MLFLOW_TRACKING_URI": "http://mlflow:5000"}, "http://mlflow:5000"),
        ("http://other:5000", {"MLFLOW_TRACKING_URI": "http://mlflow:5000"}, "http://other:5000"),
        ("off", {"MLFLOW_TRACKING_URI": "http://mlflow:5000"}, None),  # off even when the variable is set
    ],
)
def test_track_mlflow_uri_falls_back_to_the_environment_unless_off(setting, environ, expected) -> None:
    cfg = load_config(None, [f"track.mlflow_uri={setting}"] if setting else [])
    assert cfg.track.mlflow_tracking_uri(environ) == expected


def test_track_mlflow_uri_refuses_a_password() -> None:
    with pytest.raises(UserError) as info:
        load_config(None, ["track.mlflow_uri=https://me:hunter2hunter2@mlflow.example.com"])
    assert "hunter2" not in str(info.value)
    assert "track.mlflow_uri has a password in its URL: remove it and set MLFLOW_TRACKING_USERNAME" in str(info.value)


def test_a_tracking_extra_that_is_not_installed_is_named_in_one_line(tmp_path) -> None:
    """The pipeline's check before training, in a process where `import mlflow` fails as it does without the
    extra (a None entry in sys.modules is how Python marks a module as not importable)."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = (
        "import sys; sys.modules['mlflow'] = None\n"
        "from config.loader import load_config\nfrom tracking import check_tracking\n"
        "check_tracking(load_config(None, ['track.mlflow_uri=http://127.0.0.1:1']))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert (
        "core.errors.UserError: track.mlflow_uri: MLflow is not installed in this environment: "
        "pip install 'tandem[mlflow]' (or set track.mlflow_uri=off)"
    ) in done.stderr
