"""The documentation's shape: an index of its pages, and a duration beside every command."""

import glob
import os
import re

from tests.training.helpers import REPO

INDEX = os.path.join(REPO, "docs", "README.md")
PAGES = [os.path.join(REPO, "README.md")] + sorted(
    p for p in glob.glob(os.path.join(REPO, "docs", "*.md")) if p != INDEX
)
# "48 s", "2 min 49 s", "12.5 minutes", "about an hour", "seconds"...
DURATION = re.compile(
    r"\b\d+(\.\d+)?\s*(ms|s|min|minutes?|seconds?|hours?|h)\b"
    r"|\b(seconds?|minutes?|hours?)\b"
)


def test_the_docs_index_has_a_line_for_every_page_and_its_links_resolve():
    index = open(INDEX, encoding="utf-8").read()
    links = re.findall(r"\]\(([^)]+\.md)\)", index)
    for link in links:
        assert os.path.isfile(os.path.join(REPO, "docs", link)), link
    listed = {os.path.normpath(os.path.join(REPO, "docs", link)) for link in links}
    assert set(PAGES) <= listed, sorted(set(PAGES) - listed)
    rows = [line for line in index.splitlines() if line.startswith("| [")]
    assert all(row.count("|") == 4 and row.split("|")[3].strip() for row in rows), rows


def runnable_blocks(path):
    """`(kind, code, text before, text after)` of each shell block, and of each Python
    block that imports something (a program, not a listing), of a Markdown page."""
    text = open(path, encoding="utf-8").read()
    for match in re.finditer(r"^```(bash|python)\n(.*?)^```\n", text, flags=re.S | re.M):
        kind, code = match.groups()
        if kind == "python" and not re.search(r"^\s*(import|from) ", code, flags=re.M):
            continue
        before = text[: match.start()].rstrip().split("\n\n")[-1]
        after = text[match.end() :].lstrip().split("\n\n")[0]
        yield kind, code, before, after


def test_every_command_in_the_readme_and_docs_says_how_long_it_takes():
    """On 2 CPU cores, in the block itself or the paragraph just before or after it
    (or what it needs instead: a TPU, data this machine lacks)."""
    missing = []
    for path in PAGES:
        for kind, code, before, after in runnable_blocks(path):
            if not any(DURATION.search(part) for part in (code, before, after)):
                missing.append(
                    f"{os.path.relpath(path, REPO)}: {kind} {code.strip().splitlines()[0][:60]!r}"
                )
    assert not missing, "\n".join(missing)
