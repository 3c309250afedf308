"""The error raised when a task's data source is not available here."""


class SourceMissingError(FileNotFoundError):
    """A task's data source is missing; the message names how to get it.

    Registration never raises this: tasks are registered whether or not their
    data is present, and the error comes when a dataset is requested.

    Args:
      what: human-readable name of the missing source.
      fix: the command or package that provides it.
      detail: optional extra context (for example the path that was searched).

    Example:
      >>> err = SourceMissingError("the Bible DB", "pip install x")
      >>> "pip install x" in str(err)
      True
    """

    def __init__(self, what, fix, detail=None):
        self.what = what
        self.fix = fix
        message = f"{what} is not available. Get it with: {fix}"
        if detail:
            message += f" ({detail})"
        super().__init__(message)
