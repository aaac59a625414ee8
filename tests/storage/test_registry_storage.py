"""The registry's atomic claims on local storage and on a real S3 endpoint (moto's server on 127.0.0.1):
racing registrations in separate processes get distinct versions, no entry is overwritten, and the
champion alias ends on the best version."""

from __future__ import annotations

import json

import pytest

from storage.conditional import create_exclusive, read_versioned, replace_if_unchanged
from storage.fs import filesystem, read_bytes
from storage.location import Location, join
from storage.registry import champion, read_entry, register_version, resolve, versions
from tests.racing import race
from tests.registry_helpers import claim, claim_and_promote, entry

RACERS = 6


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path) -> Location:
    """A storage location on a local folder or in a new bucket on the S3 endpoint (with the endpoint as its option)."""
    if request.param == "local":
        return Location(str(tmp_path / "storage"))
    return join(request.getfixturevalue("s3_bucket"), "tandem")


def test_create_exclusive_never_overwrites(storage) -> None:
    url = join(storage, "claims/one.json")
    assert create_exclusive(url, b"first")
    assert not create_exclusive(url, b"second")
    assert read_bytes(url) == b"first"


def test_compare_and_swap_refuses_a_stale_token(storage) -> None:
    url = join(storage, "alias.json")
    assert read_versioned(url) == (None, None)
    assert replace_if_unchanged(url, b"a", None)
    assert not replace_if_unchanged(url, b"b", None)  # "only if absent" after someone created it
    data, token = read_versioned(url)
    assert data == b"a"
    assert replace_if_unchanged(url, b"c", token)
    assert not replace_if_unchanged(url, b"d", token)  # the token went stale with the write of "c"
    assert read_versioned(url)[0] == b"c"


def test_racing_registrations_get_distinct_versions_and_nothing_is_overwritten(storage) -> None:
    url = storage
    register_version(url, "racer", entry(3.0, "before"))  # the race starts from an existing v0001
    calls = [(url, "racer", 2.0 + i / 10, f"writer-{i}") for i in range(RACERS)]
    got = race(claim, calls)
    assert sorted(got) == list(range(2, RACERS + 2))
    assert versions(url, "racer") == list(range(1, RACERS + 2))
    for (_, _, loss, writer), version in zip(calls, got, strict=True):
        doc = read_entry(url, "racer", version)
        assert (doc["writer"], doc["metrics"]["loss"], doc["version"]) == (writer, loss, version)
    assert read_entry(url, "racer", 1)["writer"] == "before"


def test_racing_promotions_leave_the_best_version_champion(storage) -> None:
    url = storage
    losses = [2.5, 1.25, 3.0, 1.5, 2.0, 4.0]
    got = race(claim_and_promote, [(url, "champ", loss, f"w{i}") for i, loss in enumerate(losses)])
    best = got[losses.index(min(losses))]
    alias = champion(url, "champ")
    assert alias["version"] == best and alias["value"] == 1.25 and alias["metric"] == "loss"
    assert resolve(url, "champ:champion")["writer"] == "w1"
    fs, path = filesystem(join(url, "registry/champ/champion.json"))
    assert json.loads(fs.cat_file(path))["schema"] == "tandem.champion/1"


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
