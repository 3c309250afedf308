"""quality.py's (model, seed) runs in parallel processes (`--workers`)."""

import os
import sys

# Each worker runs the entry script with `--job name:seed`.
QUALITY_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quality.py")


def run_in_workers(jobs, argv, workers):
    """Runs each (name, seed) job as `quality.py <argv> --job name:seed` in up to
    `workers` processes at once. Returns {(name, seed): future of its record}."""
    import json
    import subprocess
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    argv = list(sys.argv[1:] if argv is None else argv)
    directory = tempfile.mkdtemp(prefix="quality_jobs_")

    def one(name, seed):
        path = os.path.join(directory, f"{name}_seed{seed}.json")
        proc = subprocess.run(
            [
                sys.executable,
                QUALITY_SCRIPT,
                *argv,
                "--job",
                f"{name}:{seed}",
                "--job_output",
                path,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        if proc.returncode:
            raise RuntimeError(f"{name} (seed {seed}) failed:\n{proc.stdout[-4000:]}")
        print(proc.stdout.strip().splitlines()[-1], flush=True)
        with open(path) as f:
            return json.load(f)

    pool = ThreadPoolExecutor(workers)
    return {(name, seed): pool.submit(one, name, seed) for name, seed in jobs}
