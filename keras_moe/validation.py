"""Type predicates behind the argument checks (a bool is not a number here).

Example:
>>> is_int(3), is_int(True), is_int(3.0), is_number(0.5), is_number(False)
(True, False, False, True, False)
"""

import numbers


def is_int(value):
    """An integer (Python or NumPy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value):
    """A real number (Python or NumPy), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
