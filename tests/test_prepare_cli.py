"""`python -m flows.prepare` as users run it: the summary it prints, `--print-config`, S3 configured by the environment
alone, and bad data as one line with exit code 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from tests.conftest import run_cli
from tests.datafiles import arithmetic, qwen, write_jsonl


def test_help_lists_the_options() -> None:
    result = run_cli("flows.prepare", "--help")
    assert result.returncode == 0
    for option in (
        "--data SRC",
        "--format {auto,qwen,sharegpt,openai,alpaca,text}",
        "--storage URL",
        "--config FILE",
        "--set KEY=VALUE",
        "--print-config",
    ):
        assert option in result.stdout
    assert "docs/reference/configuration.md" in result.stdout.strip().splitlines()[-1]


def test_print_config_folds_in_the_flags_and_stages_nothing(tmp_path) -> None:
    storage = tmp_path / "storage"
    result = run_cli(
        "flows.prepare",
        *("--data", "data/sample/conversations.json", "--format", "qwen", "--storage", str(storage)),
        *("--set", "data.max_length=128", "--print-config"),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    printed = yaml.safe_load(result.stdout)
    assert printed["data"]["format"] == "qwen"
    assert printed["data"]["max_length"] == 128
    assert printed["run"]["storage"] == str(storage)
    assert not storage.exists()


def test_prepare_to_s3_configured_by_environment_prints_id_manifest_and_counts(
    tmp_path, s3_endpoint, s3_bucket, tiny_model, prefect_server
) -> None:
    from storage.fs import read_json

    source = write_jsonl(tmp_path / "d.jsonl", [*arithmetic(60), qwen(("user", "no answer"))])
    env = {"AWS_ENDPOINT_URL": s3_endpoint}
    result = run_cli(
        "flows.prepare",
        "--data",
        source,
        "--storage",
        f"{s3_bucket}/tandem",
        "--format",
        "qwen",
        "--set",
        f"model.name_or_path={tiny_model}",
        "--set",
        "data.on_invalid=skip",
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = dict(re.findall(r"^(\w+) +(.+)$", result.stdout, flags=re.MULTILINE))
    manifest = read_json(s3_bucket.with_url(rows["manifest"]))
    assert rows["dataset"] == manifest["dataset_id"] and rows["manifest"].startswith(f"{s3_bucket}/tandem/datasets/")
    for split in ("train", "eval"):
        counts = manifest["splits"][split]
        assert rows[split] == (
            f"{counts['records']} records, {counts['tokens']} tokens, "
            f"{counts['target_tokens']} target tokens, 0 truncated, 0 dropped"
        )
    rejects = rows["manifest"].replace("manifest.json", "rejects.jsonl")
    assert rows["records"] == f"61 read, 60 staged, 1 rejected, 0 dropped (see {rejects})"


def test_bad_data_is_one_line_exit_2_and_stages_nothing(tmp_path, tiny_model, prefect_server) -> None:
    source = write_jsonl(tmp_path / "d.jsonl", arithmetic(5))
    with open(source, "a") as handle:
        handle.write(json.dumps(qwen(("user", "hi"), ("assistant", 3))) + "\n")
    storage = tmp_path / "storage"
    result = run_cli(
        "flows.prepare", "--data", source, "--storage", str(storage), "--set", f"model.name_or_path={tiny_model}"
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert errors == [
        f"error: {source}:6: conversations[1].value: expected a string, got int "
        "(or set data.on_invalid=skip to skip invalid records)"
    ]
    assert "Traceback" not in result.stderr + result.stdout
    assert not list(storage.glob("datasets/ds-*"))


def test_prepare_reaches_s3_through_the_storage_options_alone(
    tmp_path, s3_endpoint, s3_bucket, tiny_model, prefect_server
) -> None:
    """docs/data.md's MinIO recipe "per URL, without the endpoint variable": the endpoint only in run.storage_options
    (the storage) and data.storage_options (a source directory on the store), no AWS_ENDPOINT_URL anywhere; staging,
    the manifest and the summary reach the store through the options alone."""
    from storage.fs import read_json, write_bytes_atomic
    from storage.location import join

    chats = join(s3_bucket, "raw/chats")
    source = write_jsonl(tmp_path / "d.jsonl", arithmetic(40))
    write_bytes_atomic(join(chats, "part-0.jsonl"), Path(source).read_bytes())
    options = f"{{endpoint_url: {s3_endpoint}}}"  # as docs/data.md writes it
    result = run_cli(
        "flows.prepare",
        *("--data", f"{chats}/", "--storage", f"{s3_bucket}/tandem", "--format", "qwen"),
        *("--set", f"run.storage_options={options}", "--set", f"data.storage_options={options}"),
        *("--set", f"model.name_or_path={tiny_model}"),
        # no endpoint in the environment; a store reached without the options fails in seconds, not after 60 s
        env={"AWS_ENDPOINT_URL": None, "AWS_ENDPOINT_URL_S3": None, "TANDEM_STORAGE_RETRY_S": "3"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = dict(re.findall(r"^(\w+) +(.+)$", result.stdout, flags=re.MULTILINE))
    assert rows["manifest"].startswith(f"{s3_bucket}/tandem/datasets/")
    manifest = read_json(s3_bucket.with_url(rows["manifest"]))
    assert [source["url"] for source in manifest["sources"]] == [f"{chats}/part-0.jsonl"]
    assert manifest["records"]["staged"] == 40 and rows["dataset"] == manifest["dataset_id"]


def test_an_image_set_is_never_staged_as_text_for_a_text_only_model(tmp_path, tiny_model, prefect_server) -> None:
    """The issue's report, as a user meets it: LLaMA-Factory's mllm_demo layout for a text model used to stage 24
    records as text (the images column dropped, `<image>` left in the prompt); now one line naming the record and the
    model, exit 2, nothing staged."""
    storage = tmp_path / "storage"
    demo = Path(__file__).resolve().parents[1] / "data" / "mllm_demo" / "dataset_info.json"
    result = run_cli(
        "flows.prepare",
        "--data",
        f"{demo}#mllm_demo",
        "--storage",
        str(storage),
        "--set",
        f"model.name_or_path={tiny_model}",
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert errors == [
        f"error: {demo.parent / 'mllm_demo.json'}[0]: a record with images, but {tiny_model} is a text-only model (its "
        "config.json has no vision_config); train a vision-language model (Qwen2.5-VL, Qwen3-VL) or give data without "
        "images"
    ]
    assert not list(storage.glob("datasets/ds-*"))
