"""storage/location.py: a location's command-line form round-trips with its options, a malformed one is one line
naming the expected form, and `join`/`with_url` keep the options (no processes, no storage)."""

from __future__ import annotations

import argparse
import json

import pytest

from storage.location import Location, is_local, join, local_path, location_argument

MINIO = {"endpoint_url": "http://minio:9000", "client_kwargs": {"region_name": "us-east-1"}}


def test_the_command_line_form_is_the_url_alone_without_options_and_json_with_them() -> None:
    plain = Location("/mnt/shared/runs/r1/spec.json")
    assert plain.argument() == "/mnt/shared/runs/r1/spec.json"
    assert Location.parse(plain.argument()) == plain and Location.parse(plain.argument()).options == {}
    remote = Location("s3://tandem/runs/r1/spec.json", MINIO)
    assert json.loads(remote.argument()) == {"url": "s3://tandem/runs/r1/spec.json", "options": MINIO}
    back = Location.parse(remote.argument())
    assert (back.url, dict(back.options)) == (remote.url, MINIO)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"url": "s3://b/spec.json", "options": ', "not valid JSON"),
        ('{"options": {}}', "expected a URL or path"),
        ('{"url": "s3://b/spec.json", "options": ["endpoint_url"]}', "expected a URL or path"),
        ('{"url": "s3://b/spec.json", "endpoint_url": "http://h"}', "expected a URL or path"),
    ],
)
def test_a_malformed_location_on_a_command_line_is_argparses_one_line(text: str, why: str) -> None:
    parser = argparse.ArgumentParser(prog="node", exit_on_error=False)
    parser.add_argument("--spec", type=location_argument)
    with pytest.raises(argparse.ArgumentError) as info:
        parser.parse_args(["--spec", text])
    message = str(info.value)
    assert message.startswith("argument --spec: ") and why in message and "\n" not in message
    assert '{"url": URL, "options": {...}}' in message


def test_join_and_with_url_keep_the_options_and_str_is_the_url() -> None:
    root = Location("s3://tandem/storage/", MINIO)
    spec = join(root, "runs", "r1", "/spec.json")
    assert (str(spec), spec.options) == ("s3://tandem/storage/runs/r1/spec.json", MINIO)
    assert root.with_url("s3://tandem/storage/datasets/ds-1").options == MINIO
    assert not is_local(root) and is_local(Location("/data")) and is_local(Location("file:///data"))
    assert local_path(Location("file:///data/x")) == "/data/x"
    with pytest.raises(ValueError, match="is not on a local filesystem"):
        local_path(root)
