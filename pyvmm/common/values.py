"""How the command line's numbers are read: ASCII decimal digits only, so
one rule serves every option that takes a count, a size or a time."""

from pyvmm.common.errors import UsageError

#: The most a user or group id can be (2**32 - 1 is the kernel's "no id").
MAX_ID = 2**32 - 2


def is_decimal(text: str) -> bool:
    """ASCII digits only (str.isdigit alone accepts other scripts' digits)."""
    return text.isascii() and text.isdigit()


def positive_int(option: str, text: str, most: int | None = None) -> int:
    """An option's value as a positive decimal integer (ASCII digits only)."""
    if not is_decimal(text) or int(text) <= 0:
        raise UsageError(f"{option}: '{text}' is not a positive integer")
    if most is not None and int(text) > most:
        raise UsageError(f"{option}: {text} is more than {most}")
    return int(text)
