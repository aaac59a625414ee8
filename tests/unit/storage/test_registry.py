"""The model registry on storage: versions resolved by name, a corrupt entry refused naming its file, and atomic claims
on local storage and on a real S3 endpoint (moto's server on 127.0.0.1): racing registrations in separate processes get
distinct versions, no entry is overwritten, and the champion alias ends on the best version."""

from __future__ import annotations

import json

import pytest

from core.errors import UserError
from core.redact import MASK
from storage.fs import filesystem
from storage.location import Location, join
from storage.registry import champion, read_entry, register_version, resolve, versions
from tests.racing import race
from tests.registry_helpers import claim, claim_and_promote, entry, registered


def test_resolve_names_versions_and_the_champion(tmp_path) -> None:
    storage = Location(str(tmp_path))
    registered(storage, 2.5, 2.0, 2.2)
    assert [resolve(storage, ref)["version"] for ref in ("m", "m:1", "m:v2", "m:v0003", "m:champion")] == [
        3,
        1,
        2,
        3,
        2,
    ]
    with pytest.raises(UserError, match=r"m:v0009 is not registered under .* \(versions: v0001, v0002, v0003\)"):
        resolve(storage, "m:9")
    with pytest.raises(UserError, match=r"other: no such model in .*registry \(models: m\)"):
        resolve(storage, "other:champion")


def test_an_edited_entry_or_champion_is_refused_naming_the_file(tmp_path) -> None:
    from pathlib import Path

    registered(Location(str(tmp_path)), 2.5)
    entry_file = Path(tmp_path) / "registry" / "m" / "v0001.json"
    entry_file.write_text(entry_file.read_text().replace('"loss": 2.5', '"loss": 1.5'))  # still valid JSON
    refused = rf"^{entry_file}: sha256 digest mismatch: recorded .* the registry file is corrupt"
    with pytest.raises(UserError, match=refused):
        read_entry(Location(str(tmp_path)), "m", 1)
    alias = Path(tmp_path) / "registry" / "m" / "champion.json"
    alias.write_bytes(alias.read_bytes().replace(b'"version": 1', b'"version": 2'))
    with pytest.raises(UserError, match=rf"^{alias}: sha256 digest mismatch"):
        champion(Location(str(tmp_path)), "m")
    assert json.loads(entry_file.read_text())["metrics"]["loss"] == 1.5  # refused, not repaired in place


RACERS = 6


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


def test_registry_entries_are_stored_masked_and_still_verify(tmp_path) -> None:
    canary = "canary-7f3a9c2e51d04b68"
    body = {**entry(2.0, "w"), "notes": {"HF_TOKEN": canary}, "run_url": "s3://u:pw@bucket/runs/r"}
    version, _ = register_version(Location(str(tmp_path)), "m", body)
    raw = (tmp_path / "registry" / "m" / "v0001.json").read_text()
    assert canary not in raw and ":pw@" not in raw
    stored = read_entry(Location(str(tmp_path)), "m", version)  # the digest covers the masked body
    assert stored["notes"] == {"HF_TOKEN": MASK} and stored["run_url"] == "s3://u:***@bucket/runs/r"
    assert json.loads(raw)["metrics"] == body["metrics"]
