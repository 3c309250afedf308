"""Strip reStructuredText and POD markup down to prose.

Pure-Python functions applied by the documentation sources (`tasks.docs`)
before tokenization: code, tables, directives and comments are dropped;
admonition and description bodies are kept; inline markup is reduced to its
text.  Paragraphs come out as single lines separated by a blank line.
"""

import html
import re

# Directives whose whole body is code, tables, navigation or metadata.
_REST_DROP_BODY = frozenset(
    """
code-block code sourcecode literalinclude testcode testoutput testsetup
testcleanup doctest productionlist toctree index highlight raw image figure
csv-table list-table table math graphviz include tabularcolumns kernel-doc
kernel-include kernel-feat kernel-abi module currentmodule sectionauthor
moduleauthor program-output parsed-literal digraph autosummary literal
""".split()
)
# Directives whose argument on the directive line is prose.
_REST_PROSE_ARG = frozenset(
    """
note warning seealso tip important hint caution attention danger error
admonition topic rubric sidebar
""".split()
)

_DIRECTIVE = re.compile(r"^\.\.\s+([\w:.+-]+)::(.*)$")
_ADORNMENT = re.compile(r"^([=\-~^\"'`#*+<>:._])\1{2,}$")
_GRID = re.compile(r"^[+|]")
_SIMPLE_BORDER = re.compile(r"^=+( +=+)+$")
_FIELD = re.compile(r"^:[\w .-]+:(\s|$)")


def _indent(line):
    return len(line) - len(line.lstrip())


def _skip_block(lines, i, base):
    """Index of the first line after i that is non-blank with indent <= base."""
    while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > base):
        i += 1
    return i


_INLINE_REST = (
    (re.compile(r":[\w:+.-]+:`~?!?([^`<]*?)\s*<[^`>]*>`"), r"\1"),
    (re.compile(r":[\w:+.-]+:`~?!?([^`]*)`"), r"\1"),
    (re.compile(r"`([^`<]*?)\s*<[^`>]*>`_{1,2}"), r"\1"),
    (re.compile(r"``([^`]*)``"), r"\1"),
    (re.compile(r"`([^`]*)`_{0,2}"), r"\1"),
    (re.compile(r"\*\*([^*]+)\*\*"), r"\1"),
    (re.compile(r"\*([^*\s][^*]*?)\*"), r"\1"),
    (re.compile(r"\s*\[(#\w*|\d+|\*)\]_"), ""),
    (re.compile(r"\b(\w+)_(?=[\s.,;:)]|$)"), r"\1"),
    (re.compile(r"\\(.)"), r"\1"),
)


def _paragraphs(lines):
    paras, current = [], []
    for line in lines + [""]:
        if line.strip():
            current.append(line.strip())
        elif current:
            paras.append(" ".join(current))
            current = []
    return paras


def strip_rest(text):
    """reST (Sphinx) source -> prose paragraphs.

    Args:
      text: the content of a ``.rst`` / ``.rst.txt`` file.

    Returns:
      Paragraphs, one per line, separated by blank lines.

    Example:
      >>> strip_rest("Title\\n=====\\n\\nUse :func:`open`::\\n\\n   f = open(p)\\n")
      'Title\\n\\nUse open:'
    """
    lines = text.expandtabs(8).splitlines()
    out, i, n = [], 0, len(lines)
    while i < n:
        line = lines[i]
        s, ind = line.strip(), _indent(line)
        if not s:
            out.append("")
            i += 1
            continue
        if s.startswith(".."):
            m = _DIRECTIVE.match(s)
            if m and m.group(1).split(":")[-1] not in _REST_DROP_BODY:
                if m.group(1) in _REST_PROSE_ARG and m.group(2).strip():
                    out.append(" " * ind + m.group(2).strip())
                i += 1
                while i < n and lines[i].strip().startswith(":") and _indent(lines[i]) > ind:
                    i += 1  # Directive options.
            else:  # Dropped directive, comment, target or substitution.
                i = _skip_block(lines, i + 1, ind)
            continue
        if s == "::":
            i = _skip_block(lines, i + 1, ind)
            continue
        if s.startswith(">>>"):
            while i < n and lines[i].strip():
                i += 1
            continue
        if _SIMPLE_BORDER.match(s):
            j = i + 1
            while j < n:
                if _SIMPLE_BORDER.match(lines[j].strip()) and (
                    j + 1 >= n or not lines[j + 1].strip()
                ):
                    j += 1
                    break
                j += 1
            i = j
            continue
        if _ADORNMENT.match(s) or _GRID.match(s) or _FIELD.match(s):
            i += 1
            continue
        if s.endswith("::"):
            kept = line.rstrip()[:-2].rstrip()
            if kept.strip():
                out.append(kept + (":" if not line.rstrip()[:-2].endswith(" ") else ""))
            i = _skip_block(lines, i + 1, ind)
            continue
        out.append(line)
        i += 1
    paras = []
    for para in _paragraphs(out):
        for pattern, repl in _INLINE_REST:
            para = pattern.sub(repl, para)
        para = " ".join(para.split())
        if para:
            paras.append(para)
    return "\n\n".join(paras)


_POD_SKIP = frozenset(["=over", "=back", "=cut", "=pod", "=encoding", "=for"])
_POD_DOUBLE = re.compile(r"([A-Z])<{2,}\s+(.*?)\s+>{2,}", re.S)
_POD_SINGLE = re.compile(r"([A-Z])<([^<>]*)>")
# Last resort for codes whose text holds a lone "<" (e.g. "<-- HERE").
_POD_LOOSE = re.compile(r"\b([BCEFILSXZ])<([^>]*)>")


def _pod_code(code, content):
    if code in ("X", "Z"):
        return ""
    if code == "E":
        named = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/"}
        if content in named:
            return named[content]
        if content.isdigit():
            return chr(int(content))
        if content.lower().startswith("0x"):
            return chr(int(content, 16))
        return html.unescape(f"&{content};")
    if code == "L":
        if "|" in content:
            return content.split("|", 1)[0]
        return content.replace("/", " ").replace('"', "").strip()
    return content


def _pod_inline(text):
    text = _POD_DOUBLE.sub(lambda m: _pod_code(m.group(1), m.group(2)), text)
    previous = None
    while previous != text:
        previous = text
        text = _POD_SINGLE.sub(lambda m: _pod_code(m.group(1), m.group(2)), text)
    return _POD_LOOSE.sub(lambda m: _pod_code(m.group(1), m.group(2)), text)


def strip_pod(text):
    """Perl POD -> prose paragraphs (headings and items kept as text).

    Args:
      text: the content of a ``.pod`` file.

    Returns:
      Paragraphs, one per line, separated by blank lines.

    Example:
      >>> strip_pod("=head1 NAME\\n\\nUse B<print>.\\n\\n    print 1;\\n\\n=cut\\n")
      'NAME\\n\\nUse print.'
    """
    paras, skip_until = [], None
    for para in re.split(r"\n(?:[ \t]*\n)+", text.expandtabs(8)):
        if not para.strip():
            continue
        first = para.split(None, 1)[0] if para.strip() else ""
        if skip_until:
            if para.startswith("=end") and first == "=end":
                skip_until = None
            continue
        if para.startswith("="):
            rest = para[len(first) :].strip()
            if first == "=begin":
                skip_until = "=end"
            elif first.startswith("=head") or first == "=item":
                if first == "=item":
                    rest = re.sub(r"^(\*|\d+\.?)\s*", "", rest)
                if rest:
                    paras.append(rest)
            continue  # =over, =back, =cut, =pod, =encoding, =for, unknown.
        if para[0] in " \t":
            continue  # Verbatim (code) paragraph.
        paras.append(para)
    out = []
    for para in paras:
        para = " ".join(_pod_inline(para).split())
        if para:
            out.append(para)
    return "\n\n".join(out)
