"""The storage every conditional write and registry test runs on twice: a local folder and a real S3 endpoint."""

from __future__ import annotations

import pytest

from storage.location import Location, join


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path) -> Location:
    """A storage location on a local folder or in a new bucket on the S3 endpoint (with the endpoint as its option)."""
    if request.param == "local":
        return Location(str(tmp_path / "storage"))
    return join(request.getfixturevalue("s3_bucket"), "tandem")
