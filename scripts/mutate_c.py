"""The C mutator: small, line-by-line operators over csrc/ and guests/runtime/.

Each operator looks at one code line (comments, preprocessor lines and
string literals are left alone) and proposes zero or more replacement
lines; every proposal is one mutant. The operators are the classic ones:

- ``cmp``: a comparison flipped at its boundary or negated
  (``<`` -> ``<=``, ``<=`` -> ``<``, ``>`` -> ``>=``, ``>=`` -> ``>``,
  ``==`` -> ``!=``, ``!=`` -> ``==``);
- ``logic``: ``&&`` <-> ``||``;
- ``const``: an integer literal off by one (N -> N + 1, and N -> N - 1 for N > 0);
- ``drop``: an expression statement (a call or an assignment) removed;
- ``swap``: the two arguments of a two-argument call swapped.

A mutant's id names the file, the operator, a hash of the line's text and
the position of the change in it, so it stays the same when the code
around it moves (scripts/mutation_equivalent.toml lists ids).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

# One token each; the lookarounds keep <<, >>, ->, <<=, >>= and the like whole.
_CMP = {
    "<=": "<",
    ">=": ">",
    "==": "!=",
    "!=": "==",
    "<": "<=",
    ">": ">=",
}
_CMP_RX = re.compile(r"(?<![<>=!\-&|^+*/%])(<=|>=|==|!=|<|>)(?![<>=])")
_LOGIC_RX = re.compile(r"&&|\|\|")
_INT_RX = re.compile(r"(?<![\w.])(0[xX][0-9a-fA-F]+|[0-9]+)([uUlL]*)(?![\w.])")
_CALL2_RX = re.compile(r"\b([A-Za-z_]\w*)\s*\(([^(),]+),([^(),]+)\)")
_KEYWORDS = {"if", "while", "for", "switch", "return", "sizeof", "defined"}
_DECL_START = re.compile(
    r"^\s*(?:static\s+|const\s+|volatile\s+|unsigned\s+|signed\s+|struct\s+\w+\s*\*?|"
    r"enum\s+\w+\s+|union\s+\w+\s+)*"
    r"(?:void|char|short|int|long|float|double|bool|size_t|ssize_t|off_t|"
    r"u?int(?:8|16|32|64|ptr)_t|[a-z_]\w*_t)\b"
)


@dataclass(frozen=True)
class CMutant:
    id: str
    path: str  # relative to the repository root
    line: int  # 1-based
    operator: str
    before: str
    after: str

    def apply(self, text: str) -> str:
        """The file's text with this mutant's line replaced."""
        lines = text.split("\n")
        if lines[self.line - 1] != self.before:
            raise ValueError(f"{self.path}:{self.line} is not the line this mutant was made from")
        lines[self.line - 1] = self.after
        return "\n".join(lines)


def _code_mask(text: str) -> list[str]:
    """Each line with comments and string/char literals blanked to spaces,
    so that operators only see code (offsets are kept)."""
    out = []
    i, n = 0, len(text)
    chars = list(text)
    state = None  # None, "line", "block", '"', "'"
    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if state is None:
            if c == "/" and nxt == "/":
                state = "line"
            elif c == "/" and nxt == "*":
                state = "block"
                chars[i] = chars[i + 1] = " "
                i += 2
                continue
            elif c in "\"'":
                state = c
                i += 1
                continue
        if state == "line":
            if c == "\n":
                state = None
            else:
                chars[i] = " "
        elif state == "block":
            if c == "*" and nxt == "/":
                chars[i] = chars[i + 1] = " "
                state = None
                i += 2
                continue
            if c != "\n":
                chars[i] = " "
        elif state in ("'", '"'):
            if c == "\\":
                chars[i] = " "
                if i + 1 < n and text[i + 1] != "\n":
                    chars[i + 1] = " "
                i += 2
                continue
            if c == state:
                state = None
            elif c != "\n":
                chars[i] = " "
        i += 1
    out = "".join(chars).split("\n")
    return out


def _proposals(code: str, line: str) -> list[tuple[str, int, str]]:
    """(operator, column, new line) for one line; ``code`` is the line with
    comments and literals blanked, ``line`` the real text."""
    found: list[tuple[str, int, str]] = []
    stripped = code.strip()
    if not stripped or stripped.startswith("#"):
        return found
    # Includes inside templates, attributes and the like are not mutated.
    if "__attribute__" in code or "_Static_assert" in code or "STATIC_CHECK" in code:
        return found
    for m in _CMP_RX.finditer(code):
        tok = m.group(1)
        # A template-like "<x>" in C is only ever an include: skipped above.
        found.append(("cmp", m.start(), line[: m.start()] + _CMP[tok] + line[m.end() :]))
    for m in _LOGIC_RX.finditer(code):
        new = "||" if m.group(0) == "&&" else "&&"
        found.append(("logic", m.start(), line[: m.start()] + new + line[m.end() :]))
    # Array sizes and case labels are left alone: an off-by-one there is a
    # layout change the compiler or the ABI checks catch, not a logic bug.
    if not re.match(r"^\s*case\b", code) and not _DECL_START.match(code):
        for m in _INT_RX.finditer(code):
            digits, suffix = m.group(1), m.group(2)
            value = int(digits, 0)
            variants = [value + 1] + ([value - 1] if value > 0 else [])
            for v in variants:
                lit = (hex(v) if digits.lower().startswith("0x") else str(v)) + suffix
                found.append(("const", m.start(), line[: m.start()] + lit + line[m.end() :]))
    if _is_expression_statement(stripped):
        indent = line[: len(line) - len(line.lstrip())]
        found.append(("drop", len(indent), indent + ";"))
    for m in _CALL2_RX.finditer(code):
        if m.group(1) in _KEYWORDS:
            continue
        a, b = m.span(2), m.span(3)
        first, second = line[a[0] : a[1]], line[b[0] : b[1]]
        if first.strip() == second.strip():
            continue
        new = line[: a[0]] + second.strip() + ", " + first.strip() + line[b[1] :]
        # Keep the leading space style: "f(x, y)" -> "f(y, x)".
        if first.startswith(" "):
            new = line[: a[0]] + " " + second.strip() + ", " + first.strip() + line[b[1] :]
        found.append(("swap", a[0], new))
    return found


def _is_expression_statement(stripped: str) -> bool:
    """A whole statement on one line that is a call or an assignment (not a
    declaration, a return, a jump or a control header)."""
    if not stripped.endswith(";") or stripped.count(";") != 1:
        return False
    if re.match(r"^(return|break|continue|goto|case|default|do|else|if|for|while)\b", stripped):
        return False
    if stripped.startswith(("}", "{")) or _DECL_START.match(stripped):
        return False
    if re.match(r"^[A-Za-z_][\w]*\s+\**[A-Za-z_]\w*\s*(=|;|\[)", stripped):
        return False  # a declaration with a type name the pattern above does not know
    return bool(re.search(r"\w\s*\(|[^=!<>]=[^=]|\+\+|--", stripped))


def mutants(path: str, text: str) -> list[CMutant]:
    """Every mutant of one C file, in file order."""
    lines = text.split("\n")
    masked = _code_mask(text)
    result: list[CMutant] = []
    seen: dict[str, int] = {}
    continued = False
    for number, (line, code) in enumerate(zip(lines, masked, strict=True), start=1):
        # The rest of a multi-line #define (or #if) is preprocessor text too.
        is_pp = code.strip().startswith("#") or continued
        continued = code.rstrip().endswith("\\") and (is_pp or continued)
        if is_pp:
            continue
        line_hash = hashlib.sha1(line.strip().encode()).hexdigest()[:8]
        for operator, column, after in _proposals(code, line):
            if after == line:
                continue
            base = f"{path}:{operator}:{line_hash}:{column - (len(line) - len(line.lstrip()))}"
            change = hashlib.sha1(after.strip().encode()).hexdigest()[:4]
            key = f"{base}:{change}"
            seen[key] = seen.get(key, 0) + 1
            mid = key if seen[key] == 1 else f"{key}#{seen[key]}"
            result.append(CMutant(mid, path, number, operator, line, after))
    return result
