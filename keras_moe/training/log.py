"""The training job's messages: one line each on stdout, tagged with their source.

Example:
>>> log("resumed from step 40")
[keras_moe] resumed from step 40
>>> log("teacher loaded", source="keras_moe.distill")
[keras_moe.distill] teacher loaded
"""


def log(message, source="keras_moe"):
    """Prints `[source] message` and flushes (it must show before a crash)."""
    print(f"[{source}] {message}", flush=True)
