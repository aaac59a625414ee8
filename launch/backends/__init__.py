"""The launch backends: each one module with one function `run(job, info, on_progress)` (launch/job.py `Backend`)."""
