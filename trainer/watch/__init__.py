"""The run's watchers: heartbeats, stragglers, the network probe, the profiler, cancel, crashes, guards, faults."""
