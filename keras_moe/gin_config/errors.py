"""The error every gin check raises: a gin file or binding that is missing or invalid."""


class GinConfigError(ValueError):
    """A gin file or binding is missing or invalid; the message names it and the fix.

    Example:
    >>> isinstance(GinConfigError("x"), ValueError)  # callers may catch ValueError
    True
    """


_CLOSING = {"(": ")", "[": "]", "{": "}"}


def _where(text: str, line: int, column: int) -> str:
    """ "column C" for one-line text, "line L, column C" otherwise (both 1-based)."""
    return f"column {column}" if "\n" not in text.strip("\n") else f"line {line}, column {column}"


def unclosed_bracket(text: str) -> tuple[str, int, int] | None:
    """The first bracket of gin `text` that is never closed: `(bracket, line, column)`
    (1-based), or None. Quoted strings and `#` comments are skipped.

    Example:
    >>> unclosed_bracket('TASK_FEATURE_LENGTHS = {"inputs": 64')
    ('{', 1, 24)
    >>> unclosed_bracket('A = [(1, 2), ("}", 3)]') is None
    True
    """
    stack, quote = [], None
    for line_number, line in enumerate(text.splitlines(), start=1):
        escaped = False
        for column, char in enumerate(line, start=1):
            if quote:
                if escaped:
                    escaped = False
                elif char == "\\":
                    escaped = True
                elif char == quote:
                    quote = None
            elif char in "'\"":
                quote = char
            elif char == "#":
                break
            elif char in _CLOSING:
                stack.append((char, line_number, column))
            elif char in _CLOSING.values() and stack and _CLOSING[stack[-1][0]] == char:
                stack.pop()
    return stack[0] if stack else None


def describe_syntax_error(text: str, error: Exception) -> str:
    """One line saying where gin's parser stopped in `text` (a binding or a file's text)
    and why, from the `SyntaxError` or `tokenize.TokenError` it raised.

    Example:
    >>> import gin
    >>> def parse(text):
    ...     try:
    ...         gin.parse_config(text, skip_unknown=True)
    ...     except Exception as e:
    ...         return describe_syntax_error(text, e)
    >>> parse('BATCH_SIZE = 8 8')
    'syntax error at column 16: expected a newline (a binding ends after its value)'
    >>> parse('TASK_FEATURE_LENGTHS = {"inputs": 64')
    "'{' at column 24 is never closed"
    """
    if not isinstance(error, SyntaxError):  # tokenize.TokenError: the text ended inside brackets
        found = unclosed_bracket(text)
        if found is not None:
            bracket, line, column = found
            return f"{bracket!r} at {_where(text, line, column)} is never closed"
        return "a bracket or string is never closed (in this text or a file it includes)"
    message = (error.msg or "invalid syntax").rstrip(".")
    if message == "Expected newline":
        message = "expected a newline (a binding ends after its value)"
    else:
        message = message[:1].lower() + message[1:]
    line = error.lineno or 1
    column = (error.offset or 0) + 1
    return f"syntax error at {_where(text, line, column)}: {message}"
