"""English pre-training on the Debian Python, Perl (and Linux) documentation.

Sources (Debian packages; markup stripped by `tasks.markup` in the source):
  * Python 3.11 reST sources: /usr/share/doc/python3.11/html/_sources/**/*.rst.txt
    (`apt-get install -y python3.11-doc`)
  * Perl POD: /usr/share/perl/5.36.0/pod/*.pod (`apt-get install -y perl-doc`)
  * Linux kernel reST sources (optional, separate task):
    /usr/share/doc/linux-doc-6.1/html/_sources/**/*.rst.txt
    (`apt-get install -y linux-doc-6.1`)

One example per file ({"id": path, "text": prose}); files are split
train/validation/test by CRC-32 of their relative path (~90/5/5).

$KERAS_MOE_DOCS_PREFIX, when set, is put in front of these paths: a folder
where the packages were unpacked without root (`apt-get download perl-doc &&
dpkg -x perl-doc_*.deb FOLDER`). `check_sources` names every missing package in
one apt command; the training CLI runs it before building the model.

Registered (plus `_byte` twins): `docs_span_corruption` (Python + Perl),
`docs_prefix_lm`, `linux_docs_span_corruption`.

Example:
  >>> from keras_moe import tasks
  >>> ds = tasks.get_dataset("docs_span_corruption",
  ...                        {"inputs": 512, "targets": 114})
"""

import collections
import functools
import glob
import os

import numpy as np
import seqio
import tensorflow as tf

from keras_moe.tasks import markup, preprocessors, registry
from keras_moe.tasks import splits as splits_lib
from keras_moe.tasks.errors import SourceMissingError

DocRoot = collections.namedtuple("DocRoot", ["name", "root", "pattern", "kind", "package"])

APT_HINT = "apt-get update && apt-get install -y {}"
PREFIX_ENV = "KERAS_MOE_DOCS_PREFIX"
# Module-level so that a deployment (or a test) can point them elsewhere.
PYTHON_DOCS = DocRoot(
    "python", "/usr/share/doc/python3.11/html/_sources", "**/*.rst.txt", "rest", "python3.11-doc"
)
PERL_DOCS = DocRoot("perl", "/usr/share/perl/5.36.0/pod", "*.pod", "pod", "perl-doc")
LINUX_DOCS = DocRoot(
    "linux", "/usr/share/doc/linux-doc-6.1/html/_sources", "**/*.rst.txt", "rest", "linux-doc-6.1"
)

_STRIP = {"rest": markup.strip_rest, "pod": markup.strip_pod}


def _paths(doc_root):
    return sorted(glob.glob(os.path.join(doc_root.root, doc_root.pattern), recursive=True))


def located(doc_root: DocRoot) -> DocRoot:
    """`doc_root` under $KERAS_MOE_DOCS_PREFIX when that is set.

    Args:
      doc_root: a DocRoot with its system path.

    Example:
      >>> import os
      >>> os.environ[PREFIX_ENV] = "/home/me/debs"
      >>> located(PERL_DOCS).root
      '/home/me/debs/usr/share/perl/5.36.0/pod'
      >>> del os.environ[PREFIX_ENV]
    """
    prefix = os.environ.get(PREFIX_ENV)
    if not prefix:
        return doc_root
    return doc_root._replace(root=os.path.join(prefix, doc_root.root.lstrip("/")))


def check_sources(doc_roots) -> None:
    """Raises one SourceMissingError naming the apt packages of all missing roots.

    Args:
      doc_roots: DocRoots that must each hold at least one file.

    Example:
      >>> check_sources([PERL_DOCS._replace(root="/nonexistent")])
      Traceback (most recent call last):
      ...
      keras_moe.tasks.errors.SourceMissingError: The Debian perl documentation is not available. Get it with: apt-get update && apt-get install -y perl-doc (no *.pod under /nonexistent)
    """  # noqa: E501 - a doctest output line
    missing = [r for r in doc_roots if not _paths(r)]
    if missing:
        raise SourceMissingError(
            f"The Debian {' and '.join(r.name for r in missing)} documentation",
            APT_HINT.format(" ".join(r.package for r in missing)),
            detail="; ".join(f"no {r.pattern} under {r.root}" for r in missing),
        )


def list_files(doc_root):
    """Sorted (id, path) of a documentation root; SourceMissingError if absent.

    The id is "<name>/<relative path>", stable across machines.
    """
    check_sources([doc_root])
    return [(f"{doc_root.name}/{os.path.relpath(p, doc_root.root)}", p) for p in _paths(doc_root)]


def read_document(path, kind):
    """Reads one file and strips its markup ("rest" or "pod")."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return _STRIP[kind](f.read())


def split_files(doc_roots, split):
    """(id, path, kind) of all files of `split` across `doc_roots`."""
    splits_lib.check_split(split)
    out = []
    for doc_root in doc_roots:
        for doc_id, path in list_files(doc_root):
            if splits_lib.split_of(doc_id) == split:
                out.append((doc_id, path, doc_root.kind))
    return out


def _dataset_fn(split, shuffle_files, seed=None, roots=()):
    doc_roots = [r() for r in roots]
    check_sources(doc_roots)  # Names every missing package at once.
    files = split_files(doc_roots, split)
    if shuffle_files:
        np.random.RandomState(seed).shuffle(files)

    def generate():
        for doc_id, path, kind in files:
            text = read_document(path, kind)
            if text:
                yield {"id": doc_id, "text": text}

    return tf.data.Dataset.from_generator(
        generate,
        output_signature={"id": tf.TensorSpec([], tf.string), "text": tf.TensorSpec([], tf.string)},
    )


def make_source(*root_getters):
    """A seqio source over documentation roots.

    Args:
      *root_getters: zero-argument callables returning a DocRoot; looked up at
        dataset time so the module-level roots can be changed after import.
    """
    return seqio.FunctionDataSource(
        functools.partial(_dataset_fn, roots=tuple(root_getters)), splits=splits_lib.SPLITS
    )


def _python():
    return located(PYTHON_DOCS)


def _perl():
    return located(PERL_DOCS)


def _linux():
    return located(LINUX_DOCS)


def _checker(*root_getters):
    return lambda: check_sources([r() for r in root_getters])


def register():
    source = make_source(_python, _perl)
    for name, steps in (
        ("docs_span_corruption", preprocessors.span_corruption_preprocessors()),
        ("docs_prefix_lm", preprocessors.prefix_lm_preprocessors()),
    ):
        registry.register_task(name, source, steps)
        registry.register_source_check(name, _checker(_python, _perl))
    registry.register_task(
        "linux_docs_span_corruption",
        make_source(_linux),
        preprocessors.span_corruption_preprocessors(),
    )
    registry.register_source_check("linux_docs_span_corruption", _checker(_linux))


register()
