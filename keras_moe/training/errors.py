"""The error the training tools raise for a bad configuration or model dir."""


class TrainingConfigError(ValueError):
    """A training/eval setting is invalid; the message names it and the fix.

    The CLIs print the message (no traceback) and exit with status 2, before
    anything is written to the model dir.
    """


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or Inf; the message names the step.

    Raised by `callbacks.NonFiniteLossGuard` before any checkpoint of that
    step is written; `keras-moe-train` prints it and exits with status 3.
    """

    def __init__(self, step, loss, last_checkpoint=None):
        self.step, self.loss = step, loss
        where = f"; the last good checkpoint is {last_checkpoint}" if last_checkpoint else ""
        super().__init__(
            f"training loss became {loss} at step {step}: stopping, no checkpoint of step "
            f"{step} written{where}. Lower the learning rate, keep the router in float32 "
            "(SwitchFeedForward.router_dtype), or check the input data."
        )


class CorruptCheckpointError(TrainingConfigError):
    """A checkpoint file is truncated, torn or fails its checksum."""


class WorkerFailureError(RuntimeError):
    """A multi-worker collective failed or timed out: a peer worker died or is unreachable.

    `keras-moe-train` prints it and exits with status 4; restart all workers
    with the same command to resume from the last checkpoint.
    """


class TrainingInterrupted(Exception):
    """Training was stopped by Ctrl-C (SIGINT); the message names the step reached and
    the newest checkpoint. `keras-moe-train` prints it and exits with status 130."""

    def __init__(self, step=None, checkpoint=None):
        self.step, self.checkpoint = step, checkpoint
        at = f" at step {step}" if step is not None else ""
        newest = (
            f"the newest checkpoint is {checkpoint}"
            if checkpoint
            else "no checkpoint was written yet"
        )
        super().__init__(f"interrupted{at}; {newest}. Run the same command to resume.")


class CompileOnlyError(ValueError):
    """A setting of a compile-only run (`keras-moe-compile`) is invalid; the message
    names it and the fix. The command prints it and exits with status 2."""
