"""Progress lines of a compile-only run: each stage as it starts, and a heartbeat while compiling.

A TPU compile of a large model takes minutes on a CPU host (the compiler
works alone on one or two cores), so `keras-moe-compile` says what it is
doing before each stage and, while the compiler runs, prints the elapsed time
every `heartbeat_seconds`. The lines go to stderr, with the program's name,
as the command's errors do; stdout keeps the report (and `--json`).
"""

import contextlib
import sys
import threading
import time

from keras_moe import startup

# What a compile takes on a small (2-4 core) CPU host, measured with libtpu 0.0.42:
# the tiny Switch model 10-30 s; Switch-Base-128 at batch 32 6-8 minutes, larger
# batches (the C4 job's 256) and Switch-Large-128 10-25 minutes.
EXPECTED_COMPILE_TIME = (
    "expect seconds for tiny models, 10-25 minutes for Switch-Base-128 on a CPU host of a few cores"
)


def format_duration(seconds: float) -> str:
    """`seconds` as "42 s" or "14 min 05 s".

    Example:
    >>> format_duration(42.26), format_duration(845)
    ('42 s', '14 min 05 s')
    """
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    return f"{seconds // 60} min {seconds % 60:02d} s"


class CompileProgress:
    """Writes a compile-only run's stage and heartbeat lines to `stream`.

    Args:
        stream: where the lines go (a text file); None writes nothing.
        heartbeat_seconds: interval of the "still compiling" lines.
        prefix: put before each line (the command's name).
        quiet: a context manager factory run around noisy library loads (the
            command passes `keras_moe.startup.filtered_stderr`); None: no filter.

    Example:
    >>> import io
    >>> out = io.StringIO()
    >>> progress = CompileProgress(out, prefix="compile: ")
    >>> progress.stage("lowering the train step")
    >>> out.getvalue()
    'compile: lowering the train step\\n'
    """

    def __init__(self, stream=None, heartbeat_seconds: float = 60.0, prefix: str = "", quiet=None):
        if not heartbeat_seconds > 0:
            raise ValueError(f"heartbeat_seconds must be > 0, got {heartbeat_seconds!r}.")
        self.stream = stream
        self.heartbeat_seconds = float(heartbeat_seconds)
        self.prefix = prefix
        self._quiet = quiet
        self._lock = threading.Lock()

    def stage(self, text: str) -> None:
        """Prints `text` as one line (a stage that starts now)."""
        if self.stream is None:
            return
        with self._lock:
            self.stream.write(f"{self.prefix}{text}\n")
            self.stream.flush()

    def quiet(self):
        """The context to load a noisy library in (no filter unless one was given)."""
        return self._quiet() if self._quiet is not None else contextlib.nullcontext()

    @contextlib.contextmanager
    def heartbeat(self, what: str = "compiling"):
        """Prints "still <what>: <elapsed>" every `heartbeat_seconds` until the body ends."""
        if self.stream is None:
            yield
            return
        done = threading.Event()
        start = time.monotonic()

        def beat():
            while not done.wait(self.heartbeat_seconds):
                self.stage(f"still {what}: {format_duration(time.monotonic() - start)} elapsed")

        thread = threading.Thread(target=beat, name="compile-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()


SILENT = CompileProgress(None)


def stderr_progress(prog: str, heartbeat_seconds: float = 60.0) -> CompileProgress:
    """A command's progress: lines "<prog>: ..." on stderr, libtpu's start-up chatter filtered.

    Example:
    >>> stderr_progress("keras-moe-compile").prefix
    'keras-moe-compile: '
    """

    return CompileProgress(
        sys.stderr, heartbeat_seconds, prefix=f"{prog}: ", quiet=startup.filtered_stderr
    )
