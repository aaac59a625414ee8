"""What every layer of Tandem shares, and nothing else: error types and exit codes (`errors.py`), the checkout's root
and code version (`checkout.py`), the rank log line format (`rank_log.py`), what counts as a secret and how it is
masked (`redact.py`), this machine's memory (`meminfo.py`) and whether a pid is alive (`processes.py`). Imports nothing
of ours."""
