"""docs/architecture.md's layer table is pyvmm's import rule, checked
against the code: every room (a sub-package of pyvmm/, or one of its
top-level modules) in exactly one row, no import from a layer to a higher
one, no two rooms importing each other; and every repository path the doc
names in backquotes exists. The imports are read as
tests/unit/test_import_layers.py reads them (every import, a function's
and a TYPE_CHECKING block's too)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import pytest
from test_import_layers import PACKAGE, all_modules, imported

from conftest import ROOT

DOC = ROOT / "docs" / "architecture.md"
HEADER = re.compile(r"^\|\s*layer\s*\|\s*rooms\s*\|\s*job\s*\|\s*$")

#: layer number -> the rooms its row names, top row first.
Table = list[tuple[int, list[str]]]
#: (importing room, imported room) -> one module-level import behind it.
Edges = dict[tuple[str, str], str]


def parse_table(text: str) -> Table:
    """The rows of the doc's ``| layer | rooms | job |`` table."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if HEADER.match(line)), None)
    if start is None:
        raise AssertionError("docs/architecture.md has no | layer | rooms | job | table")
    rows: Table = []
    for line in lines[start + 2 :]:  # past the header and its |---| line
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].isdigit():
            raise AssertionError(f"not a layer row: {line}")
        rows.append((int(cells[0]), re.findall(r"`([^`]+)`", cells[1])))
    return rows


def room_of(module: str, known: Mapping[str, Path]) -> str:
    """``pyvmm.vm.plan`` -> ``vm/``, ``pyvmm.entry`` -> ``entry.py``,
    ``pyvmm`` -> ``__init__.py``."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__.py"
    top = ".".join(parts[:2])
    return f"{parts[1]}/" if known[top].name == "__init__.py" else f"{parts[1]}.py"


def rooms_on_disk() -> set[str]:
    """Every sub-package of pyvmm/ and every top-level module."""
    rooms = {p.name for p in PACKAGE.glob("*.py")}
    rooms |= {f"{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    return rooms


def room_edges() -> Edges:
    known = all_modules()
    edges: Edges = {}
    for name, path in sorted(known.items()):
        for target in sorted(imported(name, path, known)):
            pair = (room_of(name, known), room_of(target, known))
            if pair[0] != pair[1]:
                edges.setdefault(pair, f"{name} imports {target}")
    return edges


def row_problems(table: Table, rooms: set[str]) -> list[str]:
    problems = []
    numbers = [number for number, _ in table]
    if numbers != sorted(set(numbers), reverse=True):
        problems.append(f"layer numbers {numbers} do not fall from the top row to the bottom")
    listed = [room for _, names in table for room in names]
    for room in sorted(set(listed)):
        if listed.count(room) > 1:
            problems.append(f"`{room}` is in {listed.count(room)} rows")
        if room not in rooms:
            problems.append(f"`{room}` is in the table but is no room of pyvmm/")
    problems += [f"`{room}` is in no row" for room in sorted(rooms - set(listed))]
    return problems


def upward_imports(table: Table, edges: Edges) -> list[str]:
    layer = {room: number for number, names in table for room in names}
    return [
        f"`{a}` (layer {layer[a]}) imports `{b}` (layer {layer[b]}): {why}"
        for (a, b), why in sorted(edges.items())
        if a in layer and b in layer and layer[b] > layer[a]
    ]


def mutual_imports(edges: Edges) -> list[str]:
    return [
        f"`{a}` and `{b}` import each other: {why}; {edges[b, a]}"
        for (a, b), why in sorted(edges.items())
        if a < b and (b, a) in edges
    ]


def the_table() -> Table:
    return parse_table(DOC.read_text())


def test_every_room_is_in_exactly_one_row_and_the_table_names_no_other():
    problems = row_problems(the_table(), rooms_on_disk())
    assert not problems, "\n".join(problems)


def test_the_rooms_the_imports_see_are_the_rooms_on_disk():
    known = all_modules()
    assert {room_of(name, known) for name in known} == rooms_on_disk()


def test_no_import_goes_to_a_higher_layer():
    problems = upward_imports(the_table(), room_edges())
    assert not problems, "\n".join(problems)


def test_no_two_rooms_import_each_other():
    problems = mutual_imports(room_edges())
    assert not problems, "\n".join(problems)


# -- the checks see a wrong table --------------------------------------------------


def test_a_row_moved_above_what_imports_it_is_an_upward_import():
    table = the_table()
    kvm = next(i for i, (_, names) in enumerate(table) if "kvm/" in names)
    vm = next(i for i, (_, names) in enumerate(table) if "vm/" in names)
    wrong = [(number, list(names)) for number, names in table]
    wrong[kvm][1].remove("kvm/")
    wrong[vm][1].append("kvm/")  # kvm/ beside vm/: hvt/, devices/, arch/ import it from below
    found = upward_imports(wrong, room_edges())
    assert any(line.startswith("`hvt/") and "imports `kvm/`" in line for line in found), found


def test_a_missing_duplicated_or_unknown_room_is_reported():
    table = [(3, ["vm/", "gone/"]), (2, ["vm/"]), (1, ["common/"])]
    found = row_problems(table, {"vm/", "common/", "kvm/"})
    assert "`vm/` is in 2 rows" in found
    assert "`gone/` is in the table but is no room of pyvmm/" in found
    assert "`kvm/` is in no row" in found
    assert row_problems([(1, ["vm/"]), (2, ["kvm/"])], {"vm/", "kvm/"}) != []


def test_two_rooms_importing_each_other_are_reported():
    edges = {("vm/", "kvm/"): "a imports b", ("kvm/", "vm/"): "b imports a"}
    assert mutual_imports(edges) == ["`kvm/` and `vm/` import each other: b imports a; a imports b"]


def test_the_table_parser_refuses_a_malformed_row():
    with pytest.raises(AssertionError, match="not a layer row"):
        parse_table("| layer | rooms | job |\n|---|---|---|\n| top | `vm/` | runs |\n")


# -- paths named in the doc ---------------------------------------------------------

#: A backquoted token that reads as a path: a slash, path characters only.
PATH = re.compile(r"`([\w.*-]+(?:/[\w.*-]*)+)`")


def missing_paths(text: str) -> list[str]:
    """Paths in backquotes that exist neither from the repository's root
    nor from pyvmm/ (the doc's ``vm/plan.py`` style); a ``*`` must match."""
    missing = []
    for token in sorted(set(PATH.findall(text))):
        if token.startswith("."):
            continue
        bases = (ROOT, PACKAGE)
        if "*" in token:
            found = any(any(base.glob(token)) for base in bases)
        else:
            found = any((base / token).exists() for base in bases)
        if not found:
            missing.append(token)
    return missing


def test_every_path_the_doc_names_exists():
    problems = missing_paths(DOC.read_text())
    assert not problems, "\n".join(problems)


def test_a_path_that_moved_is_reported():
    text = "`pyvmm/plan.py`, `vm/plan.py`, `csrc/native.c`, `csrc/iothread*.c`, `a/b` `x.py`"
    assert missing_paths(text) == ["a/b", "csrc/native.c", "pyvmm/plan.py"]
