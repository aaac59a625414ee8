"""What full fine-tuning's reference table (trainer/objectives/preference/reference_table.py) costs each rank in memory:
gathering every rank's rows, writing {run}/reference/{split}.npy and loading it, the way the trainer does it now against
the way it did before, on real ranks (one process each, a gloo process group), at two table sizes.

    python tests/benchmarks/bench_reference_table_memory.py                    # 250,000 and 1,000,000 pairs, 2 ranks
    python tests/benchmarks/bench_reference_table_memory.py --rows 1000000 --ranks 4 --repeats 5

- `new`: each rank sends rank 0 its rows as float64 blocks of a fixed size (reference_table.collect, over
  torch.distributed.gather), rank 0 fills a memory-mapped .npy under a temporary name and renames it, and every rank
  maps the written table read-only (reference_table.write, then written_table, as load_or_compute does);
- `old`: each rank's rows as a dict of Python floats, gathered on every rank with gather_objects, a numpy table built
  from them on every rank, rank 0 writing it through an in-memory .npy, and a resume's load (the whole file read, then
  parsed), as trainer/objectives/preference/reference_table.py did before.

The values stand in for the base model's log-probabilities (a forward pass over a million pairs is too slow for a
benchmark of memory): every rank runs its passes of `--micro` rows, row i on rank i % ranks, as the trainer does.
After loading, each rank reads every value of its table (a training epoch looks every row up). Each variant runs in
fresh processes, `--repeats` times (medians are printed), each rank reporting from /proc/self/status: the peak
resident memory the variant added (VmHWM, reset before it starts: it counts the table's pages a rank has mapped,
which the page cache holds once for every rank of the node), the most private memory it added (RssAnon, sampled every
millisecond: a lower bound), and at the end the private memory still held and the shared table pages mapped (RssFile).
Nothing here asserts: it prints.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from launch.command import free_port

WAYS = ("old", "new")


def status_kb() -> dict[str, int]:
    """This process's memory lines of /proc/self/status, in KiB."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[name] = int(rest.split()[0])
    return out


class AnonPeak(threading.Thread):
    """The most private memory (RssAnon) seen, sampled every millisecond while the variant runs."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = status_kb()["RssAnon"]
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.001):
            self.peak = max(self.peak, status_kb()["RssAnon"])


def value_pairs(indices: Sequence[int], np: Any) -> Any:
    """The stand-in log-probabilities of rows `indices`: (n, 2) float64, distinct per row (`np`: numpy, imported in
    the ranks only)."""
    base = np.asarray(indices, dtype=np.float64)
    return np.stack([-1.0 - base * 1e-6, -2.0 - base * 1e-6], axis=1)


def new_way(run: Any, split: str, rows: int, micro: int, dist: Any, cache: Path) -> Any:
    """Gather in blocks to rank 0, which fills a mapped file and renames it; every rank maps it."""
    import numpy as np

    from trainer.objectives.preference.reference_table import collect, pass_count, write, written_table
    from trainer.parallel.distributed import barrier

    def parts() -> Iterator[tuple[range, Any]]:
        mine = range(dist.rank, rows, dist.world_size)
        for k in range(pass_count(rows, dist.world_size, micro)):
            group = mine[k * micro : (k + 1) * micro]
            yield group, value_pairs(group, np)

    write(run, split, rows, dist, cache, lambda out: collect(parts(), out, dist, rows_per_pass=micro))
    barrier()
    return written_table(run, split, rows, cache)


def old_way(run: Any, split: str, rows: int, micro: int, dist: Any, cache: Path) -> Any:
    """trainer/objectives/preference/reference_table.py before: Python floats gathered on every rank, the table on every
    rank, written through an in-memory .npy, and loaded as a resume loaded it."""
    import numpy as np

    from storage.fs import read_bytes, write_bytes_atomic
    from trainer.objectives.preference.reference_table import ReferenceTable, table_url
    from trainer.parallel.distributed import barrier, gather_objects

    mine = list(range(dist.rank, rows, dist.world_size))
    found: dict[int, tuple[float, float]] = {}
    for start in range(0, len(mine), micro):
        group = mine[start : start + micro]
        values = value_pairs(group, np)
        found.update({i: (float(values[j, 0]), float(values[j, 1])) for j, i in enumerate(group)})
    table = np.zeros((rows, 2), dtype=np.float64)
    for part in gather_objects(found, dist):
        for i, pair in part.items():
            table[i] = pair
    del found
    if dist.is_main:
        buffer = io.BytesIO()
        np.save(buffer, table, allow_pickle=False)
        write_bytes_atomic(table_url(run, split), buffer.getvalue())
    barrier()
    del table
    return ReferenceTable(np.load(io.BytesIO(read_bytes(table_url(run, split))), allow_pickle=False))


def rank(way: str, rows: int, micro: int, folder: str) -> dict:
    """One rank of one variant, in this process (torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR/PORT)."""
    import numpy as np

    from storage.location import Location
    from trainer.parallel.distributed import barrier, init, shutdown

    dist = init(deepspeed_backend=False)
    run, cache = Location(os.path.join(folder, "run")), Path(folder) / "cache" / str(dist.rank)
    variant = new_way if way == "new" else old_way
    # A small table first: the code and the libraries the variant runs are paged in before the figures start.
    np.asarray(variant(run, "warm-up", 64 * micro * dist.world_size, micro, dist, cache).values).sum()
    barrier()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here: what the variant adds
    before, sampler = status_kb(), AnonPeak()
    sampler.start()
    table = variant(run, "train", rows, micro, dist, cache)
    checksum = float(np.asarray(table.values).sum())  # every row read, as an epoch's lookups read them
    sampler.done.set()
    sampler.join()
    after = status_kb()
    barrier()
    shutdown()
    mib = 1024
    return {
        "way": way,
        "rows": rows,
        "rank": dist.rank,
        "peak_rss_added_mib": (after["VmHWM"] - before["VmRSS"]) / mib,
        "peak_private_added_mib": (sampler.peak - before["RssAnon"]) / mib,
        "private_held_mib": (after["RssAnon"] - before["RssAnon"]) / mib,
        "shared_table_mib": (after["RssFile"] - before["RssFile"]) / mib,
        "checksum": checksum,
    }


def launch(way: str, rows: int, micro: int, ranks: int) -> list[dict]:
    """One variant on `ranks` fresh processes; their reports in rank order."""
    with tempfile.TemporaryDirectory(prefix="bench-reference-") as folder:
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(ranks)}
        env["LOCAL_WORLD_SIZE"] = str(ranks)
        args = ["--one", way, "--rows", str(rows), "--micro", str(micro), "--folder", folder]
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, *args],
                env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                stdout=subprocess.PIPE,
                text=True,
                cwd=ROOT,
            )
            for r in range(ranks)
        ]
        outs = [p.communicate()[0] for p in procs]
        if any(p.returncode for p in procs):
            raise SystemExit(f"{way} {rows}: a rank failed (exit codes {[p.returncode for p in procs]})")
    return [json.loads(out.strip().splitlines()[-1]) for out in outs]


FIGURES = ("peak_rss_added_mib", "peak_private_added_mib", "private_held_mib", "shared_table_mib")


def medians(runs: list[list[dict]]) -> list[dict]:
    """Per rank, the median of each figure over the repeats."""
    return [
        {**runs[0][r], **{k: statistics.median(run[r][k] for run in runs) for k in FIGURES}}
        for r in range(len(runs[0]))
    ]


def main(argv: list[str] | None = None) -> list[dict]:
    """The script's entry point: each variant and size in fresh processes; returns the medians as printed."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="250000,1000000", help="table sizes, comma-separated")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--micro", type=int, default=8, help="rows of one pass (train.micro_batch_size)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one", choices=WAYS, help=argparse.SUPPRESS)  # a rank of one variant
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.one is not None:
        print(json.dumps(rank(options.one, int(options.rows), options.micro, options.folder)), flush=True)
        return []
    results = []
    for rows in (int(n) for n in options.rows.split(",")):
        for way in WAYS:
            started = time.perf_counter()
            runs = [launch(way, rows, options.micro, options.ranks) for _ in range(options.repeats)]
            results += medians(runs)
            seconds = (time.perf_counter() - started) / options.repeats
            for row in results[-options.ranks :]:
                print(
                    f"{way} {rows:>9,} pairs rank {row['rank']}: peak RSS +{row['peak_rss_added_mib']:7.1f} MiB, "
                    f"peak private +{row['peak_private_added_mib']:7.1f} MiB, held private "
                    f"{row['private_held_mib']:+7.1f} MiB, shared table pages {row['shared_table_mib']:6.1f} MiB "
                    f"({seconds:.1f} s a run)",
                    flush=True,
                )
    summarize(results)
    return results


def summarize(results: list[dict]) -> None:
    """The ratios, old over new, of the worst rank's peak at each size; and how the new way grows with rows."""
    worst = {
        (way, rows): max(r["peak_rss_added_mib"] for r in results if (r["way"], r["rows"]) == (way, rows))
        for way, rows in {(r["way"], r["rows"]) for r in results}
    }
    private = {
        (way, rows): max(r["peak_private_added_mib"] for r in results if (r["way"], r["rows"]) == (way, rows))
        for way, rows in worst
    }
    for rows in sorted({rows for _, rows in worst}):
        print(
            f"{rows:,} pairs: the worst rank's peak RSS added, old / new = {worst['old', rows]:.1f} / "
            f"{worst['new', rows]:.1f} MiB = {worst['old', rows] / max(worst['new', rows], 0.1):.1f} x; peak private "
            f"{private['old', rows]:.1f} / {private['new', rows]:.1f} MiB",
            flush=True,
        )


if __name__ == "__main__":
    main()
