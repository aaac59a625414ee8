"""`python -m flows.registry`: list and show a registry's models as users type it, without a Prefect server."""

from __future__ import annotations

import json

from storage.location import Location, join
from storage.registry import read_entry, register_version, versions
from tests.conftest import run_cli
from tests.registry_helpers import entry, registered


def test_registry_cli_lists_and_shows_without_a_prefect_server(tmp_path) -> None:
    storage = Location(str(tmp_path / "storage"))
    registered(storage, 2.5, 2.0)
    env = {"PREFECT_API_URL": "http://127.0.0.1:9/api"}  # nothing listens there: the CLI must not need it
    listing = run_cli("flows.registry", "--storage", storage.url, "list", env=env, timeout=120)
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert lines[0].split() == ["model", "version", "created", "loss", "perplexity", "token_accuracy", "champion"]
    assert [line.split()[:2] + line.split()[3:4] for line in lines[1:]] == [
        ["m", "v0001", "2.5000"],
        ["m", "v0002", "2.0000"],
    ]
    assert lines[2].endswith("*") and not lines[1].endswith("*")

    shown = run_cli("flows.registry", "--storage", storage.url, "show", "m:champion", env=env, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("m v0002 (champion)\n")
    doc = json.loads(shown.stdout[shown.stdout.index("{") : shown.stdout.index("\nHow to load")])
    assert doc == read_entry(storage, "m", 2)
    assert 'model = PeftModel.from_pretrained(base, "/models/w1")' in shown.stdout

    missing = run_cli("flows.registry", "--storage", storage.url, "show", "m:v7", env=env, timeout=120)
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.strip() == f"error: m:v0007 is not registered under {storage} (versions: v0001, v0002)"


def test_a_registry_that_is_empty_lists_nothing(tmp_path) -> None:
    result = run_cli("flows.registry", "--storage", str(tmp_path), "list", timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == f"no models registered in {tmp_path}/registry"
    assert versions(Location(str(tmp_path)), "m") == []


def test_registry_cli_reads_an_s3_registry(s3_endpoint, s3_bucket) -> None:
    from tests.conftest import run_cli

    storage = join(s3_bucket, "tandem")
    register_version(storage, "remote", entry(1.5, "w0"))
    result = run_cli(
        "flows.registry",
        "--storage",
        str(storage),
        "show",
        "remote:1",
        env={"AWS_ENDPOINT_URL": s3_endpoint},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("remote v0001\n") and '"writer": "w0"' in result.stdout
    assert "# from_pretrained needs a local directory" not in result.stdout  # model_url here is a local path
    # Without the endpoint variable, the endpoint given with the URL, as run.storage_options gives it to the pipeline.
    by_options = run_cli("flows.registry", "--storage", storage.argument(), "list", env={"AWS_ENDPOINT_URL": None})
    assert by_options.returncode == 0, by_options.stderr
    assert [line.split()[:2] for line in by_options.stdout.splitlines()[1:]] == [["remote", "v0001"]]
