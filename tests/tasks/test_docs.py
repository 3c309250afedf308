"""Documentation tasks and the reST/POD stripping."""

import glob

import pytest
import seqio

from keras_moe import tasks
from keras_moe.tasks import docs, markup, registry

REST = """\
:mod:`glob` --- Pathname expansion
==================================

.. module:: glob
   :synopsis: Unix shell style pathname pattern expansion.

.. index:: single: filenames; pathname expansion

The :mod:`glob` module finds *all* the pathnames, see :func:`fnmatch.fnmatch`
and `the docs <https://example.org>`_.  Use ``**`` for recursion::

   import glob
   SECRETCODE = glob.glob('*.py')

.. note::

   Files beginning with a dot are special.

.. code-block:: python

   also_secret_code()

+--------+--------+
| TABLEA | TABLEB |
+========+========+

=====  =====
SIMPA  SIMPB
=====  =====
first  row
=====  =====

>>> DOCTESTCODE
1

.. function:: glob(pathname)

   Return a list of path names.
"""

POD = """\
=head1 NAME

perlfoo - B<bold> and C<< $x->y >> text

=head2 Details

Use L<perlfunc/open> or L<the manual|perlop>; E<lt>tagE<gt> X<index>.

    my $SECRETCODE = 1;

=over 4

=item * First item

=back

=begin html

<p>HTMLSECRET</p>

=end html

=cut
"""


def test_strip_rest_keeps_prose_drops_code_tables_directives():
    out = markup.strip_rest(REST)
    for kept in [
        "glob --- Pathname expansion",
        "The glob module finds all the pathnames, see fnmatch.fnmatch and the docs.",
        "Use ** for recursion:",
        "Files beginning with a dot are special.",
        "Return a list of path names.",
    ]:
        assert kept in out, (kept, out)
    for dropped in [
        "SECRETCODE",
        "also_secret",
        "TABLEA",
        "SIMPA",
        "first  row",
        "DOCTESTCODE",
        "synopsis",
        "index",
        "====",
        ":func:",
        "``",
        ".. ",
        "<https",
    ]:
        assert dropped not in out, (dropped, out)


def test_strip_pod_keeps_prose_drops_code_and_formatting():
    out = markup.strip_pod(POD)
    assert out.split("\n\n") == [
        "NAME",
        "perlfoo - bold and $x->y text",
        "Details",
        "Use perlfunc open or the manual; <tag> .",
        "First item",
    ]


def test_real_docs_are_stripped():
    py = sorted(glob.glob(docs.PYTHON_DOCS.root + "/library/*.rst.txt"))
    pod = sorted(glob.glob(docs.PERL_DOCS.root + "/*.pod"))
    assert len(py) > 200 and len(pod) > 150  # apt: python3.11-doc perl-doc
    for path in py[::10]:
        text = docs.read_document(path, "rest")
        assert text
        for line in text.split("\n"):
            assert not line.startswith(".. ") and not line.rstrip().endswith("::")
            assert ":func:`" not in line and ":class:`" not in line
    before = after = 0
    for path in pod[::10]:
        text = docs.read_document(path, "pod")
        with open(path, encoding="utf-8", errors="replace") as f:
            raw = f.read()
        for para in text.split("\n\n"):
            assert not para.startswith("="), (path, para[:40])
        for marker in ["C<", "B<", "L<", "I<", "F<"]:
            before += raw.count(marker)
            after += text.count(marker)
    # Nested codes around a lone "<" (perldiag's "<-- HERE") may survive.
    assert before > 1000 and after < 0.01 * before, (before, after)


def test_docs_task_yields_span_corruption_examples():
    task = seqio.get_mixture_or_task("docs_span_corruption")
    vocab = tasks.get_vocabulary()
    ds = task.get_dataset({"inputs": 128, "targets": 32}, split="validation", shuffle=False, seed=0)
    for ex in ds.take(4).as_numpy_iterator():
        assert len(ex["inputs"]) == 128 and len(ex["targets"]) <= 32
        assert ex["targets"][0] == vocab.vocab_size - 1  # First sentinel.
    ids = [
        doc_id
        for doc_id, _, _ in docs.split_files([docs.PYTHON_DOCS, docs.PERL_DOCS], "validation")
    ]
    train = {i for i, _, _ in docs.split_files([docs.PYTHON_DOCS, docs.PERL_DOCS], "train")}
    assert ids and not set(ids) & train


def test_missing_docs_name_the_apt_command(tmp_path, monkeypatch):
    monkeypatch.setattr(docs, "PYTHON_DOCS", docs.PYTHON_DOCS._replace(root=str(tmp_path)))
    with pytest.raises(tasks.SourceMissingError, match="apt-get install -y python3.11-doc"):
        next(iter(tasks.get_dataset("docs_span_corruption", {"inputs": 64, "targets": 16})))


def test_one_apt_command_names_every_missing_package(tmp_path, monkeypatch):
    """$KERAS_MOE_DOCS_PREFIX stands for `/`: an empty one misses both packages,
    one that holds the Python sources misses Perl's alone."""
    monkeypatch.setenv(docs.PREFIX_ENV, str(tmp_path))
    both = "apt-get update && apt-get install -y python3.11-doc perl-doc"
    with pytest.raises(tasks.SourceMissingError) as err:
        registry.check_sources("docs_span_corruption")
    assert both in str(err.value) and str(tmp_path) in str(err.value)
    with pytest.raises(tasks.SourceMissingError, match="install -y python3.11-doc perl-doc"):
        next(iter(tasks.get_dataset("docs_prefix_lm_byte", {"inputs": 64, "targets": 16})))
    python = tmp_path / docs.PYTHON_DOCS.root.lstrip("/")
    python.parent.mkdir(parents=True)
    python.symlink_to(docs.PYTHON_DOCS.root)
    with pytest.raises(tasks.SourceMissingError) as err:
        registry.check_sources("docs_span_corruption")
    assert "apt-get install -y perl-doc (" in str(err.value)
    monkeypatch.delenv(docs.PREFIX_ENV)
    registry.check_sources("docs_span_corruption")  # the system's docs
