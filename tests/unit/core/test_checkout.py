"""The checkout's code version: the package version and a digest of every source file of the project's packages, so
that nodes running different code are told apart (preflight compares it; lineage records it)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

from core.checkout import PACKAGES, PROJECT_ROOT, code_version
from tests.conftest import ROOT


def version_of(checkout) -> str:
    code = "from core.checkout import code_version; print(code_version())"
    done = subprocess.run([sys.executable, "-c", code], cwd=checkout, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_version_is_the_package_version_and_a_digest_of_the_sources() -> None:
    assert PROJECT_ROOT == ROOT
    assert re.fullmatch(r"0\.1\.0\+[0-9a-f]{12}", code_version())


def test_a_changed_source_file_changes_the_version_and_a_stray_file_does_not(tmp_path) -> None:
    """Two copies of the packages: equal versions; an edit to a .py (or a config .yaml) is another version, a file
    the digest does not cover (a compiled cache, a note) is not."""
    copy = tmp_path / "checkout"
    for package in PACKAGES:
        shutil.copytree(ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
    before = version_of(copy)
    assert before == code_version()
    (copy / "core" / "notes.txt").write_text("not code")
    assert version_of(copy) == before
    (copy / "config" / "presets" / "tiny-cpu.yaml").write_text(
        (ROOT / "config" / "presets" / "tiny-cpu.yaml").read_text() + "\n# edited\n"
    )
    assert version_of(copy) != before
