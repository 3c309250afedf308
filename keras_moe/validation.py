"""Type predicates and the integer check behind the argument checks (a bool is not a number).

Example:
>>> is_int(3), is_int(True), is_int(3.0), is_number(0.5), is_number(False)
(True, False, False, True, False)
>>> check_int("num_experts", 0)
Traceback (most recent call last):
...
ValueError: `num_experts` must be an integer >= 1, got 0.
"""

import numbers


def is_int(value):
    """An integer (Python or NumPy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(name, value, minimum=1, error=ValueError):
    """Raises `error` naming `name` unless `value` is an integer >= `minimum`."""
    if not is_int(value) or value < minimum:
        raise error(f"`{name}` must be an integer >= {minimum}, got {value!r}.")


def is_number(value):
    """A real number (Python or NumPy), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
