"""An image's network-arguments template: where the pod's address goes.

The template (``--ipv4={cidr} --ipv4-gateway={gateway}``) is the image
author's text, so it is read as text with plain names in braces and
nothing more: no attribute or index access, no conversion, no format spec
(str.format would carry out all three for the image). ``{{`` and ``}}``
are literal braces. The template and the words it gives are both capped,
so splitting them into words stays a matter of microseconds.
"""

from __future__ import annotations

import re
import shlex

#: The values a template may name (network.Link.values gives them).
NAMES = ("ip", "prefix", "cidr", "netmask", "gateway", "mac", "mtu", "ifname")
TEMPLATE_MAX = 1024  # characters
WORDS_MAX = 2048  # characters of the filled-in template
_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]|[^{}]+")
_SHOWN = 40  # characters of a bad piece quoted in the message
_LISTED = ", ".join("{" + name + "}" for name in NAMES)


class TemplateError(Exception):
    """Why a template is refused (one line, without the template itself)."""


Pieces = tuple[tuple[str, bool], ...]  # (text, is a name)


def _quoted(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")


def parse(template: str) -> Pieces:
    """The template's literal text and names, or TemplateError."""
    if len(template) > TEMPLATE_MAX:
        raise TemplateError(f"{len(template)} characters, more than {TEMPLATE_MAX}")
    if "\0" in template:
        raise TemplateError("it contains a NUL character")
    pieces: list[tuple[str, bool]] = []
    for match in _TOKEN.finditer(template):
        token, name = match.group(0), match.group(1)
        if token in ("{{", "}}"):
            pieces.append((token[0], False))
        elif name is not None:
            if name not in NAMES:
                raise TemplateError(
                    f"{_quoted(token)} is not a name it may use: {_LISTED} "
                    "(plain names only; {{ and }} for literal braces)"
                )
            pieces.append((name, True))
        elif token in ("{", "}"):
            raise TemplateError(f"a lone {token!r} at character {match.start() + 1}")
        else:
            pieces.append((token, False))
    try:
        shlex.split("".join("x" if is_name else text for text, is_name in pieces))
    except ValueError as err:  # an unclosed quote, a trailing backslash
        raise TemplateError(str(err).lower()) from None
    return tuple(pieces)


def fill(pieces: Pieces, values: dict[str, str]) -> list[str]:
    """The guest's words: the template with the interface's values in."""
    text = "".join(values[part] if is_name else part for part, is_name in pieces)
    if len(text) > WORDS_MAX:
        raise TemplateError(f"it expands to {len(text)} characters, more than {WORDS_MAX}")
    try:
        return shlex.split(text)
    except ValueError as err:  # a value that opened a quote
        raise TemplateError(str(err).lower()) from None
