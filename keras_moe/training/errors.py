"""The error the training tools raise for a bad configuration or model dir."""


class TrainingConfigError(ValueError):
    """A training/eval setting is invalid; the message names it and the fix.

    The CLIs print the message (no traceback) and exit with status 2, before
    anything is written to the model dir.
    """
