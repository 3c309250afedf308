"""The environment meets what keras_moe itself declares and needs, and nothing more.

Checked: the requirements that setup.cfg states (and the packages that
scripts/install.sh installs beside them, such as t5 with --no-deps) are
installed at versions that satisfy them; none of them is a nightly build or
has a nightly twin installed; and each of their top-level packages (`seqio`,
`tensorflow_datasets`, ...) comes from exactly one distribution. Other
packages of the user's environment and their own dependencies are not
keras_moe's business and are not checked (no `pip check`).
"""

import configparser
import importlib.metadata as md
import os
import re
import sys
from collections import defaultdict

import pytest
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Nightly builds published under another name than "<name>-nightly".
NIGHTLY_ALIASES = {
    "tensorflow": ("tf-nightly", "tf-nightly-cpu"),
    "tensorflow-datasets": ("tfds-nightly",),
    "tensorboard": ("tb-nightly",),
}


def requirements_from_setup_cfg(text, extras=("test",)):
    """The requirements of `install_requires` and of the given extras of a setup.cfg text.

    Raises ValueError naming a line that is not a valid requirement.
    """
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(text)
    lines = parser.get("options", "install_requires", fallback="").splitlines()
    for extra in extras:
        lines += parser.get("options.extras_require", extra, fallback="").splitlines()
    out = []
    for line in lines:
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        try:
            out.append(Requirement(line))
        except InvalidRequirement as e:
            raise ValueError(f"setup.cfg requirement {line!r} does not parse: {e}") from None
    return out


def requirements_from_install_script(text):
    """The quoted requirements that scripts/install.sh passes to `pip_install`."""
    return [Requirement(spec) for spec in re.findall(r'pip_install (?:--no-deps )?"([^"]+)"', text)]


def declared_requirements():
    with open(os.path.join(ROOT, "setup.cfg")) as f:
        declared = requirements_from_setup_cfg(f.read())
    with open(os.path.join(ROOT, "scripts", "install.sh")) as f:
        declared += requirements_from_install_script(f.read())
    return [r for r in declared if r.marker is None or r.marker.evaluate()]


def _is_vendored(dist, root=ROOT):
    """Metadata on sys.path that no pip install put there:
    * setuptools >= 71 appends its own setuptools/_vendor folder to sys.path when it is
      imported (a test that builds a wheel does), and that folder holds private
      *.dist-info copies (packaging, wheel, ...);
    * `pip install -e .` leaves keras_moe.egg-info in the checkout, on sys.path while
      tests run from it; its SOURCES.txt lists the checkout's files (gin/, tasks/), which
      the installed package maps under keras_moe, not as top-level packages."""
    path = getattr(dist, "_path", None)
    if path is None:
        return False
    path = os.path.normpath(str(path))
    return "_vendor" in path.split(os.sep) or (
        path.endswith(".egg-info") and os.path.dirname(path) == os.path.normpath(root)
    )


def installed_versions():
    """{canonical distribution name: [versions]}: several when a name is installed twice.

    Private copies vendored inside another package are not installations and are left out.
    """
    out = defaultdict(list)
    for dist in md.distributions():
        if _is_vendored(dist):
            continue
        name = dist.metadata["Name"]
        if name:
            out[canonicalize_name(name)].append(dist.version)
    return dict(out)


def _is_nightly(version):
    try:
        return Version(version).is_devrelease or "nightly" in version
    except InvalidVersion:
        return True


def pin_problems(requirements, installed):
    """Declared requirements that are missing, installed twice or at a version outside the pin."""
    problems = []
    for req in requirements:
        versions = installed.get(canonicalize_name(req.name), [])
        if not versions:
            problems.append(f"{req} is not installed")
        elif len(set(versions)) > 1:
            problems.append(f"{req.name} is installed more than once: {sorted(set(versions))}")
        elif not req.specifier.contains(versions[0], prereleases=True):
            problems.append(f"{req} is required, {req.name} {versions[0]} is installed")
    return problems


def nightly_problems(requirements, installed):
    """Nightly builds of declared requirements: a nightly version, or a nightly twin installed."""
    problems = []
    for req in requirements:
        name = canonicalize_name(req.name)
        for version in installed.get(name, []):
            if _is_nightly(version):
                problems.append(f"{req.name} {version} is a nightly/dev build")
        for twin in (f"{name}-nightly",) + NIGHTLY_ALIASES.get(name, ()):
            if twin in installed:
                problems.append(
                    f"{twin} {installed[twin][0]} is installed beside {req.name} "
                    f"and overwrites its files"
                )
    return problems


def top_level_owners():
    """{top-level package: {distributions with files in it}}, namespace packages left out."""
    owners, regular = defaultdict(set), set()
    for dist in md.distributions():
        if _is_vendored(dist):
            continue
        name = canonicalize_name(dist.metadata["Name"] or "")
        for path in dist.files or ():
            parts = path.parts
            if (
                not parts
                or parts[0] in ("..", "__pycache__", "bin")
                or parts[0].endswith((".dist-info", ".egg-info", ".data", ".pth"))
            ):
                continue
            top = parts[0][:-3] if parts[0].endswith(".py") else parts[0]
            owners[top].add(name)
            if len(parts) == 1 and parts[0].endswith(".py") or parts[1:] == ("__init__.py",):
                regular.add(top)
    return {top: names for top, names in owners.items() if top in regular}


def owner_problems(requirements, owners):
    """Top-level packages of declared distributions that another distribution also fills."""
    declared = {canonicalize_name(r.name) for r in requirements}
    return [
        f"{top} is installed by {sorted(names)}"
        for top, names in sorted(owners.items())
        if names & declared and len(names) > 1
    ]


# --- The helpers can fail: fake setup.cfg texts and distribution lists. -----------------

FAKE_SETUP_CFG = """
[options]
install_requires =
    seqio==0.0.20
    # a comment line, as setup.cfg has one
    tensorflow-datasets==4.9.10
    numpy>=1.26 ; python_version >= "3"

[options.extras_require]
test =
    pytest==9.0.*
"""


def test_requirements_are_parsed_with_their_pins_and_comments_left_out():
    reqs = requirements_from_setup_cfg(FAKE_SETUP_CFG)
    assert [str(r) for r in reqs] == [
        "seqio==0.0.20",
        "tensorflow-datasets==4.9.10",
        'numpy>=1.26; python_version >= "3"',
        "pytest==9.0.*",
    ]
    with pytest.raises(ValueError, match="does not parse"):
        requirements_from_setup_cfg("[options]\ninstall_requires =\n    seqio 0.0.20\n")
    script = 'pip_install --no-deps "t5==0.9.4"\n  pip_install "transformers>=4.45,<6"\n'
    assert [str(r) for r in requirements_from_install_script(script)] == [
        "t5==0.9.4",
        "transformers<6,>=4.45",
    ]


def test_a_nightly_or_a_nightly_twin_is_reported():
    reqs = requirements_from_setup_cfg(FAKE_SETUP_CFG)
    good = {
        "seqio": ["0.0.20"],
        "tensorflow-datasets": ["4.9.10"],
        "numpy": ["2.1.0"],
        "pytest": ["9.0.3"],
        "wcwidth": ["0.1.0.dev1"],
    }  # not declared: not checked
    assert nightly_problems(reqs, good) == []
    twins = dict(
        good,
        **{"tfds-nightly": ["4.9.10.dev202501010044"], "seqio-nightly": ["0.0.21.dev20250101"]},
    )
    problems = nightly_problems(reqs, twins)
    assert len(problems) == 2 and "tfds-nightly" in problems[1] and "seqio-nightly" in problems[0]
    dev = dict(good, seqio=["0.0.20.dev20240101"])
    assert nightly_problems(reqs, dev) == ["seqio 0.0.20.dev20240101 is a nightly/dev build"]


def test_a_version_outside_a_pin_or_a_missing_requirement_is_reported():
    reqs = requirements_from_setup_cfg(FAKE_SETUP_CFG)
    good = {
        "seqio": ["0.0.20"],
        "tensorflow-datasets": ["4.9.10"],
        "numpy": ["2.1.0"],
        "pytest": ["9.0.3"],
    }
    assert pin_problems(reqs, good) == []
    bad = dict(good, seqio=["0.0.19"], pytest=["8.3.0"])
    del bad["numpy"]
    assert pin_problems(reqs, bad) == [
        "seqio==0.0.20 is required, seqio 0.0.19 is installed",
        'numpy>=1.26; python_version >= "3" is not installed',
        "pytest==9.0.* is required, pytest 8.3.0 is installed",
    ]
    twice = dict(good, seqio=["0.0.20", "0.0.19"])
    assert "installed more than once" in pin_problems(reqs, twice)[0]
    # A local version label (torch's "+cpu") satisfies an exact public pin.
    assert pin_problems([Requirement("torch==2.13.0")], {"torch": ["2.13.0+cpu"]}) == []


def test_a_top_level_package_filled_by_two_distributions_is_reported():
    reqs = requirements_from_setup_cfg(FAKE_SETUP_CFG)
    owners = {
        "seqio": {"seqio", "seqio-nightly"},
        "tensorflow_datasets": {"tensorflow-datasets"},
        "yaml": {"pyyaml", "other-yaml"},
    }  # not declared: not checked
    assert owner_problems(reqs, owners) == ["seqio is installed by ['seqio', 'seqio-nightly']"]


# --- The real environment. ---------------------------------------------------------------


def test_setup_cfg_states_the_pins_the_readme_relies_on():
    pins = {canonicalize_name(r.name): str(r.specifier) for r in declared_requirements()}
    assert pins["seqio"] == "==0.0.20" and pins["tensorflow-datasets"] == "==4.9.10"
    assert pins["t5"] == "==0.9.4"  # from scripts/install.sh


def test_declared_requirements_are_installed_at_the_pinned_versions():
    problems = pin_problems(declared_requirements(), installed_versions())
    assert not problems, "\n".join(problems)


def test_no_nightly_build_of_a_declared_requirement():
    problems = nightly_problems(declared_requirements(), installed_versions())
    assert not problems, "\n".join(problems)


def test_one_seqio_and_one_tensorflow_datasets_distribution():
    owners = top_level_owners()
    assert owners.get("seqio") == {"seqio"}
    assert owners.get("tensorflow_datasets") == {"tensorflow-datasets"}
    problems = owner_problems(declared_requirements(), owners)
    assert not problems, "\n".join(problems)


def test_the_checkouts_own_egg_info_is_not_an_installation(tmp_path):
    class Dist:
        _path = tmp_path / "keras_moe.egg-info"

    assert _is_vendored(Dist(), root=str(tmp_path))
    assert not _is_vendored(Dist(), root=str(tmp_path / "elsewhere"))


def test_setuptools_vendored_copies_are_not_counted_as_installations():
    # CI failed with "packaging is installed more than once: ['26.3', '26.4']" after a test
    # in the same worker imported setuptools, which put setuptools/_vendor on sys.path.
    setuptools = pytest.importorskip("setuptools")
    vendor = os.path.join(os.path.dirname(setuptools.__file__), "_vendor")
    vendored = [d for d in md.distributions() if os.path.dirname(str(d._path)) == vendor]
    if not vendored:
        pytest.skip("this setuptools vendors no *.dist-info on sys.path")
    counted = installed_versions()
    for dist in vendored:
        name = canonicalize_name(dist.metadata["Name"])
        assert len(set(counted.get(name, []))) <= 1, (name, counted[name])


def test_t5_data_preprocessors_import_without_mesh_tensorflow():
    import t5.data.preprocessors as preprocessors

    assert callable(preprocessors.span_corruption)
    assert "mesh_tensorflow" not in sys.modules
