"""trainer/watch/profiler.py's device busy time, on profiler events shaped as a CUDA run records them (no GPU here): an
operator on the CPU (aten::mm) carries the time of the kernel it launched, and the kernel is an event of its own."""

from __future__ import annotations

from torch.autograd import DeviceType
from torch.autograd.profiler_util import EventList, FunctionEvent

from storage.location import Location
from trainer.watch.profiler import StepProfiler, device_busy_us, tables


class Recorded:
    """What tables() reads of a finished torch.profiler.profile: its key averages."""

    def __init__(self, events: EventList) -> None:
        self.events = events

    def key_averages(self) -> object:
        return self.events.key_averages()


def cuda_events() -> EventList:
    """aten::mm on the host for 100 us, whose kernel ran 40 us on the device; an elementwise kernel of 15 us."""
    mm = FunctionEvent(id=1, name="aten::mm", thread=0, start_us=0, end_us=100, use_device="cuda", stack=[])
    mm.append_kernel("gemm_kernel", 0, 40)
    kernels = [
        FunctionEvent(
            id=i,
            name=name,
            thread=0,
            start_us=start,
            end_us=start + us,
            device_type=DeviceType.CUDA,
            use_device="cuda",
            stack=[],
        )
        for i, name, start, us in [(2, "gemm_kernel", 10, 40), (3, "elementwise_kernel", 60, 15)]
    ]
    events = EventList([mm, *kernels], use_device="cuda")
    events._build_tree()
    return events


def test_each_kernel_counts_once_as_the_tables_own_total_does() -> None:
    averages = cuda_events().key_averages()
    assert device_busy_us(averages) == 55  # not 95: aten::mm's 40 us are its kernel's
    assert "Self CUDA time total: 55.000us" in averages.table(sort_by="self_device_time_total")


def test_the_file_starts_with_the_steps_and_the_busy_fraction() -> None:
    text = tables(Recorded(cuda_events()), wall=0.0001, first=4, last=6)
    assert text.splitlines()[:2] == [
        "steps 4-6 (3), wall 0.000 s",
        "device busy 0.000 s (55.0% of the wall time), host operations 0.000 s",
    ]
    assert "By self device time:" in text and "By self CPU time:" in text


def test_the_window_follows_the_warm_up_and_ends_with_the_run() -> None:
    """Steps after the attempt's three warm-up steps (after a resume too), never past the run's last step."""
    window = StepProfiler(5, start=0, total=6, run_url=Location("unused"), rank=0)
    assert [s for s in range(1, 8) if window.profiles(s)] == [4, 5, 6]
    resumed = StepProfiler(2, start=8, total=20, run_url=Location("unused"), rank=0)
    assert [s for s in range(1, 21) if resumed.profiles(s)] == [12, 13]
    assert not StepProfiler(3, start=0, total=3, run_url=Location("unused"), rank=0).enabled


def test_a_profiled_step_on_the_cpu_writes_its_table_and_names_the_steps(tmp_path) -> None:
    import torch

    profiler = StepProfiler(1, start=0, total=4, run_url=Location(str(tmp_path)), rank=1)
    events: list[dict] = []
    profiler.before(4)
    torch.ones(64, 64) @ torch.ones(64, 64)
    profiler.after(4, events.append)
    table = (tmp_path / "profile" / "rank-1.txt").read_text()
    assert table.startswith("steps 4-4 (1), wall ") and "aten::mm" in table
    assert events == [
        {"event": "profile", "step": 4, "first_step": 4, "last_step": 4, "table": "profile/rank-{rank}.txt"}
    ]
