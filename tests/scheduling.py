"""How `make test` (and `make test-suites`' second part) spreads tests over pytest-xdist workers (`-n 2 --dist
loadscope`).

A work unit is a whole folder where the folder's conftest holds a session fixture its files share (reference training
runs, a pipeline run, Prefect workers, a deployment, SLURM daemons): splitting such a folder would pay for that
fixture twice. Anywhere else a unit is one test file, as with xdist's own loadscope, except in PER_TEST_FILES, whose
tests (the benchmark scripts' toy runs, a minute each, nothing shared) are units of their own. Units go out longest
first, so that the short ones fill the end of the run instead of one worker finishing a long unit alone.
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

SHARED_FOLDERS = ("tests/distributed/", "tests/e2e/", "tests/flows/", "tests/deploy/", "tests/slurm/", "tests/netns/")
# Measured (make test-durations), longest first; a unit not listed goes after these, in collection order.
LONGEST_FIRST = (
    "tests/distributed/",
    "tests/models/test_published_models.py",
    "tests/e2e/",
    "tests/flows/",
    "tests/deploy/",
    "tests/slurm/",
    "tests/test_nodes_by_hand_cli.py",
)


# Files whose tests share no costly fixture and each take minutes: every test is a unit of its own.
PER_TEST_FILES = ("tests/benchmarks/test_toy_runs.py",)


def unit_of(nodeid: str) -> str:
    """The work unit of a test: its shared folder, else the test itself in PER_TEST_FILES, else its file."""
    path = nodeid.split("::", 1)[0]
    if path in PER_TEST_FILES:
        return nodeid
    return next((folder for folder in SHARED_FOLDERS if nodeid.startswith(folder)), path)


class SuiteScheduling(LoadScopeScheduling):
    """xdist's loadscope with Tandem's units and order."""

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)

    def _assign_work_unit(self, node) -> None:
        # The first call comes once the whole queue is built and before any work is sent: order it then.
        if not getattr(self, "_ordered", False):
            self._ordered = True
            rank = {unit: i for i, unit in enumerate(LONGEST_FIRST)}
            ordered = sorted(self.workqueue.items(), key=lambda item: rank.get(item[0], len(rank)))
            self.workqueue.clear()
            self.workqueue.update(ordered)
        super()._assign_work_unit(node)
