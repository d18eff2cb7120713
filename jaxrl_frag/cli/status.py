"""The command line's exit statuses."""

USAGE_ERROR = 2  # a setting that cannot work, or the parser's own errors
NON_FINITE = 3  # the run went non-finite; the last good checkpoint is kept
ENV_WORKER_FAILED = 4  # a host environment's worker process failed
WRITE_FAILED = 5  # the run directory could not be written (a full disk)
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process that Ctrl-C ended
