"""A newcomer's install works as the README says: on the Python versions setup.cfg
admits, and, after a plain (non-editable) `pip install`, `keras_moe.parse_gin("switch_tiny.gin")`
finds the gin files by name."""

import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
from packaging.specifiers import SpecifierSet

from tests.test_environment import requirements_from_setup_cfg

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _read(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


def _python_requires():
    import configparser

    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(_read("setup.cfg"))
    return SpecifierSet(parser.get("options", "python_requires"))


def oldest_python(specifier):
    """The oldest Python 3 minor version ("3.N") that `specifier` admits."""
    for minor in range(0, 40):
        if specifier.contains(f"3.{minor}"):
            return f"3.{minor}"
    raise ValueError(f"python_requires {specifier} admits no Python 3 version")


def test_oldest_python_admitted_can_install_the_pinned_requirements():
    # python_requires once said >=3.10 while keras==3.15.* needs >=3.11: on 3.10,
    # `pip install .` and scripts/install.sh stopped with "Package 'keras' requires a
    # different Python" and nothing of keras_moe was importable.
    oldest = oldest_python(_python_requires())
    pinned = [
        r
        for r in requirements_from_setup_cfg(_read("setup.cfg"), extras=())
        if any(spec.operator in ("==", "===") for spec in r.specifier)
    ]
    assert pinned, "setup.cfg pins no requirement any more"
    problems = []
    for requirement in pinned:
        try:
            needs = md.metadata(requirement.name).get("Requires-Python")
        except md.PackageNotFoundError:
            continue  # tests/test_environment.py reports missing requirements
        if needs and not SpecifierSet(needs).contains(oldest):
            problems.append(
                f"{requirement} (installed {md.version(requirement.name)}) needs Python {needs}"
            )
    assert not problems, f"setup.cfg's python_requires admits Python {oldest}, but: " + "; ".join(
        problems
    )


def test_the_readme_states_the_oldest_python_admitted():
    stated = re.findall(r"Python (3\.\d+)\+", _read("README.md"))
    assert stated, "the README no longer says which Python it needs"
    assert set(stated) == {oldest_python(_python_requires())}


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_parse_gin_by_name_after_a_non_editable_install(tmp_path):
    """The wheel of a fresh checkout holds the gin files (gin/ enters it as
    keras_moe/gin_files through setup.cfg's package_dir) and the tasks (tasks/ as
    keras_moe/tasks), and parse_gin finds switch_tiny.gin by name from another folder.
    The dev environment's editable install cannot show this: there the files are read
    from the checkout itself."""
    setuptools = pytest.importorskip("setuptools")
    if tuple(int(x) for x in setuptools.__version__.split(".")[:2]) < (70, 1):
        pytest.importorskip("wheel")  # bdist_wheel moved into setuptools in 70.1
    # A copy, so that the build writes its build/ and egg-info folders there, not here.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    for name in ("keras_moe", "gin", "tasks"):
        shutil.copytree(
            os.path.join(ROOT, name),
            src / name,
            symlinks=True,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
    dist = tmp_path / "dist"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(dist),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    (wheel,) = dist.glob("keras_moe-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        site = tmp_path / "site"
        z.extractall(site)  # a pure-Python wheel installs as its files
    gin_files = {
        os.path.relpath(os.path.join(d, f), ROOT).replace(os.sep, "/")
        for d, _, files in os.walk(os.path.join(ROOT, "gin"))
        for f in files
        if f.endswith(".gin")
    }
    missing = {"keras_moe/gin_files/" + p.split("/", 1)[1] for p in gin_files} - names
    assert not missing and "keras_moe/gin_files/models/switch_tiny.gin" in names, missing
    assert "keras_moe/tasks/__init__.py" in names
    assert "keras_moe/tasks/data/vocab/embedded_8k.model" in names

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = (
        "import keras_moe\n"
        "print(keras_moe.__file__)\n"
        "c = keras_moe.parse_gin('switch_tiny.gin')\n"
        "print('config', c.sparse_ffn['class_name'], c.num_experts, c.d_model)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(site), TF_CPP_MIN_LOG_LEVEL="3")
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[0].startswith(str(site)), f"keras_moe came from {lines[0]}, not the wheel"
    assert "config keras_moe>SwitchFeedForward 8 64" in lines, run.stdout


def test_the_editable_install_maps_the_tasks_and_gin_folders_of_this_checkout():
    """`pip install -e .` (scripts/install.sh) maps the repository's tasks/ into the
    package as `keras_moe.tasks` (setup.cfg's package_dir; there is no link inside
    keras_moe/), and parse_gin reads gin/ by name."""
    import keras_moe
    import keras_moe.tasks
    from keras_moe import gin_config

    here = os.path.dirname(keras_moe.__file__)
    assert os.path.dirname(here) == ROOT
    assert keras_moe.tasks.__file__ == os.path.join(ROOT, "tasks", "__init__.py"), (
        f"keras_moe.tasks comes from {keras_moe.tasks.__file__}: run `pip install -e .` "
        "in this checkout"
    )
    assert gin_config.resolve("switch_tiny") == os.path.join(
        ROOT, "gin", "models", "switch_tiny.gin"
    )


FAKE_PYTHON = r"""#!/usr/bin/env bash
# `python -m pip install ...` as pip prints it on a fresh machine; `python -` reads the
# environment report's code and prints a stand-in line.
if [[ "$1 $2" == "-m pip" ]]; then
  echo "$*" >> "$CALLS"
  if [[ "$*" == *"t5==0.9.4"* ]]; then
    echo "ERROR: pip's dependency resolver does not currently take into account all the" \
      "packages that are installed. This behaviour is the source of the following" \
      "dependency conflicts." >&2
    echo "t5 0.9.4 requires mesh-tensorflow[transformer]>=0.1.13, which is not installed." >&2
    echo "t5 0.9.4 requires seqio-nightly, which is not installed." >&2
    echo "t5 0.9.4 requires tfds-nightly, which is not installed." >&2
    echo "WARNING: something else pip had to say" >&2
  fi
  if [[ -n "$FAIL_ON" && "$*" == *"$FAIL_ON"* ]]; then
    echo "ERROR: no matching distribution" >&2
    exit 1
  fi
  exit 0
fi
cat > /dev/null
echo "keras_moe environment: (stand-in)"
"""


def _install(tmp_path, extras="test", fail_on=""):
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    calls = tmp_path / "calls"
    env = dict(os.environ, PYTHON=str(python), CALLS=str(calls), FAIL_ON=fail_on)
    done = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "install.sh"), extras],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done, calls.read_text().splitlines() if calls.exists() else []


@pytest.mark.e2e
def test_install_says_what_it_installs_and_hides_only_t5s_known_resolver_lines(tmp_path):
    """A newcomer sees a line per stage (the first takes minutes), not pip's resolver
    ERROR about the t5 dependencies install.sh leaves out on purpose; anything else
    pip says still shows."""
    done, calls = _install(tmp_path)
    assert done.returncode == 0, done.stderr
    stages = [line for line in done.stdout.splitlines() if line.startswith("install.sh: ")]
    assert (
        len(stages) == 6 and "minutes" in stages[0] and stages[-1].startswith("install.sh: done")
    ), done.stdout
    assert "ERROR" not in done.stdout + done.stderr, done.stderr
    assert "WARNING: something else pip had to say" in done.stderr
    assert "t5==0.9.4" in calls[-1] and "--no-deps" in calls[-1], calls


@pytest.mark.e2e
def test_install_stops_when_pip_fails(tmp_path):
    done, _ = _install(tmp_path, extras="", fail_on="t5==0.9.4")
    assert done.returncode == 1
    assert "ERROR: no matching distribution" in done.stderr
