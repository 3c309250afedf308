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

DocRoot = collections.namedtuple("DocRoot", ["name", "root", "pattern",
                                             "kind", "fix"])

APT_HINT = "apt-get update && apt-get install -y {}"
# Module-level so that a deployment (or a test) can point them elsewhere.
PYTHON_DOCS = DocRoot("python", "/usr/share/doc/python3.11/html/_sources",
                      "**/*.rst.txt", "rest", APT_HINT.format("python3.11-doc"))
PERL_DOCS = DocRoot("perl", "/usr/share/perl/5.36.0/pod", "*.pod", "pod",
                    APT_HINT.format("perl-doc"))
LINUX_DOCS = DocRoot("linux", "/usr/share/doc/linux-doc-6.1/html/_sources",
                     "**/*.rst.txt", "rest", APT_HINT.format("linux-doc-6.1"))

_STRIP = {"rest": markup.strip_rest, "pod": markup.strip_pod}


def list_files(doc_root):
    """Sorted (id, path) of a documentation root; SourceMissingError if absent.

    The id is "<name>/<relative path>", stable across machines.
    """
    paths = sorted(glob.glob(os.path.join(doc_root.root, doc_root.pattern),
                             recursive=True))
    if not paths:
        raise SourceMissingError(
            f"The {doc_root.name} documentation sources", doc_root.fix,
            detail=f"no {doc_root.pattern} under {doc_root.root}")
    return [(f"{doc_root.name}/{os.path.relpath(p, doc_root.root)}", p)
            for p in paths]


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
    files = split_files([r() for r in roots], split)  # Raises if missing.
    if shuffle_files:
        np.random.RandomState(seed).shuffle(files)

    def generate():
        for doc_id, path, kind in files:
            text = read_document(path, kind)
            if text:
                yield {"id": doc_id, "text": text}

    return tf.data.Dataset.from_generator(
        generate, output_signature={
            "id": tf.TensorSpec([], tf.string),
            "text": tf.TensorSpec([], tf.string)})


def make_source(*root_getters):
    """A seqio source over documentation roots.

    Args:
      *root_getters: zero-argument callables returning a DocRoot; looked up at
        dataset time so the module-level roots can be changed after import.
    """
    return seqio.FunctionDataSource(
        functools.partial(_dataset_fn, roots=tuple(root_getters)),
        splits=splits_lib.SPLITS)


def _python():
    return PYTHON_DOCS


def _perl():
    return PERL_DOCS


def _linux():
    return LINUX_DOCS


def register():
    source = make_source(_python, _perl)
    registry.register_task("docs_span_corruption", source,
                           preprocessors.span_corruption_preprocessors())
    registry.register_task("docs_prefix_lm", source,
                           preprocessors.prefix_lm_preprocessors())
    registry.register_task("linux_docs_span_corruption", make_source(_linux),
                           preprocessors.span_corruption_preprocessors())


register()
