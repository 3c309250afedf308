"""The error every gin check raises: a gin file or binding that is missing or invalid."""


class GinConfigError(ValueError):
    """A gin file or binding is missing or invalid; the message names it and the fix.

    Example:
    >>> isinstance(GinConfigError("x"), ValueError)  # callers may catch ValueError
    True
    """
