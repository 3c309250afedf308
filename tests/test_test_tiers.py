"""The suite's tiers: a test that starts a process or trains a whole job must be marked
end to end (tests/conftest.py fails it otherwise), so that `scripts/test.sh --fast`
leaves out exactly the marked tests."""

import os
import subprocess
import sys

import pytest

from keras_moe.training.run.training_run import Run


def test_an_unmarked_test_that_starts_a_process_fails_naming_the_mark():
    with pytest.raises(pytest.fail.Exception, match=r"starts a process.*@pytest\.mark\.e2e"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    with pytest.raises(pytest.fail.Exception, match="not marked end to end"):
        os.system("true")


def test_an_unmarked_test_that_trains_a_whole_job_fails_naming_the_mark():
    with pytest.raises(pytest.fail.Exception, match=r"trains a whole job.*@pytest\.mark\.e2e"):
        Run.fit(None)


def test_the_refusal_is_not_an_exception_a_test_could_swallow():
    # `except Exception` around a subprocess call must not hide the missing mark.
    with pytest.raises(pytest.fail.Exception):
        try:
            subprocess.run(["true"], check=True)
        except Exception:
            pass


@pytest.mark.e2e
def test_a_marked_test_starts_processes():
    done = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True)
    assert done.stdout.strip() == "42"


@pytest.mark.slow
def test_slow_implies_end_to_end(request):
    assert request.node.get_closest_marker("e2e") is not None
    assert subprocess.run(["true"]).returncode == 0
