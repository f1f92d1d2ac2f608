"""The mutation-testing tools themselves (scripts/mutate_c.py, the map and
the equivalent list): the C operators make the mutants they promise and
leave comments, strings and preprocessor lines alone, a mutant's id does
not move with the code around it, and every critical file has tests."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import mutate_c  # noqa: E402
import mutate_run  # noqa: E402

SAMPLE = """\
/* a comment with a < b and f(x, y); */
#define LIMIT (4 < 5)
static int check(int gpa, int len)
{
    const char *s = "a == b";
    if (gpa > 10 && len <= 2)
        return 0;
    note(gpa, len);
    return 1; // x != y
}
"""


def _afters(path: str, text: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for m in mutate_c.mutants(path, text):
        found.setdefault(m.operator, set()).add(m.after.strip())
    return found


def test_each_operator_makes_its_mutant() -> None:
    found = _afters("x.c", SAMPLE)
    assert "if (gpa >= 10 && len <= 2)" in found["cmp"]
    assert "if (gpa > 10 && len < 2)" in found["cmp"]
    assert "if (gpa > 10 || len <= 2)" in found["logic"]
    assert {"if (gpa > 11 && len <= 2)", "if (gpa > 9 && len <= 2)"} <= found["const"]
    assert "return 2; // x != y" in found["const"]
    assert ";" in found["drop"]
    assert "note(len, gpa);" in found["swap"]


def test_comments_strings_and_preprocessor_lines_are_not_mutated() -> None:
    for m in mutate_c.mutants("x.c", SAMPLE):
        assert m.line not in (1, 2, 5), m
        assert "x != y" in m.after or m.line != 9


def test_a_mutant_is_applied_to_its_line_only() -> None:
    m = next(
        m
        for m in mutate_c.mutants("x.c", SAMPLE)
        if m.operator == "swap" and m.before.strip().startswith("note")
    )
    out = m.apply(SAMPLE).split("\n")
    assert out[m.line - 1].strip() == "note(len, gpa);"
    assert [a for a, b in zip(out, SAMPLE.split("\n"), strict=True) if a != b] == [out[m.line - 1]]
    with pytest.raises(ValueError):
        m.apply(SAMPLE.replace("note(gpa, len);", "other(gpa);"))


def test_ids_stay_when_the_code_around_moves() -> None:
    before = {m.id for m in mutate_c.mutants("x.c", SAMPLE)}
    moved = "\n\n/* more */\nint z;\n" + SAMPLE
    after = {m.id for m in mutate_c.mutants("x.c", moved)}
    assert before <= after
    assert len(before) == len(mutate_c.mutants("x.c", SAMPLE))  # ids are unique


def test_every_real_c_file_gives_mutants_with_unique_ids() -> None:
    for path in ("csrc/guestmem.c", "csrc/shmstream_ring.h", "guests/runtime/net_shm.c"):
        found = mutate_c.mutants(path, (ROOT / path).read_text())
        assert found, path
        assert len({m.id for m in found}) == len(found)


def test_every_critical_file_is_mapped_to_existing_tests() -> None:
    mapping = mutate_run.load_map()
    assert mapping.critical <= set(mapping.tests)
    for path, args in mapping.tests.items():
        assert (ROOT / path).exists(), path
        files = mutate_run.test_files(args)
        assert files, path
        for name in files:
            assert (ROOT / name).exists(), (path, name)


def test_every_known_equivalent_names_a_file_and_gives_a_reason() -> None:
    data = tomllib.loads((ROOT / "scripts" / "mutation_equivalent.toml").read_text())
    mapping = mutate_run.load_map()
    for mutant_id, reason in data["equivalent"].items():
        assert mutant_id.split(":")[0] in mapping.tests, mutant_id
        assert len(reason.split()) >= 5, mutant_id


DIFF = """\
diff --git a/x.c b/x.c
--- a/x.c
+++ b/x.c
@@ -3 +3 @@ int f(void)
-    return 1;
+    return 2;
@@ -10,0 +11,2 @@ int g(void)
+    a();
+    b();
@@ -20,3 +22,0 @@ int h(void)
-    c();
-    d();
-    e();
"""


def test_the_ci_slice_takes_the_lines_a_diff_adds_and_those_around_a_removal() -> None:
    assert mutate_run.hunk_lines(DIFF) == {3, 11, 12, 22, 23}
    assert mutate_run.hunk_lines("") == set()


def test_the_ci_slice_has_a_recorded_base_and_budget_a_clean_clone_knows() -> None:
    mapping = mutate_run.load_map()
    assert len(mapping.base) == 40
    assert mutate_run.check_base(mapping.base) == mapping.base
    assert 0 < mapping.budget <= 540  # CI's 10 minutes, the copy and builds included


def test_a_base_the_clone_does_not_have_is_one_clear_error() -> None:
    with pytest.raises(RuntimeError, match="no commit in this clone"):
        mutate_run.check_base("0" * 40)
    with pytest.raises(RuntimeError, match="no commit in this clone"):
        mutate_run.check_base("")


def test_a_mutant_the_mutator_cannot_make_is_stillborn_not_a_crash(tmp_path) -> None:
    """cosmic-ray raises on a few nodes of its own (an exception handler's
    type it cannot rewrite): that mutant is stillborn and the run goes on."""
    (tmp_path / "x.c").write_text("int x;\n")

    def refuse(text: str) -> str:
        raise AttributeError("'PythonNode' object has no attribute 'value'")

    run = mutate_run.FileRun("x.c", ("tests/x.py",), True, store=tmp_path / "x.json")
    mutant = mutate_run.Mutant("x.c:drop:0:0", "x.c", 1, "drop", refuse, "int x;")
    mutate_run.run_mutant(tmp_path, {}, run, mutant, timeout=1)
    assert mutant.outcome == mutate_run.STILLBORN and "cannot make it" in mutant.by
    assert (tmp_path / "x.c").read_text() == "int x;\n"
    assert "stillborn" in (tmp_path / "x.json").read_text()


def test_the_scratch_copy_keeps_the_guests_objects_and_drops_other_products(tmp_path, monkeypatch):
    """Tests that link a guest of their own need the runtime's objects in
    the copy (it builds the guests only for a mutant that goes into them);
    the extension's objects, caches and the venv stay behind."""
    tree = tmp_path / "tree"
    for name in (
        "guests/build/rt.o",
        "guests/build/rt.d",
        "guests/bin/hello.hvt",
        "guests/hello.c",
        "csrc/hcfast.c",
        "build/temp/hcfast.o",
        "pyvmm/_native.abi3.so",
        "pyvmm/__pycache__/x.pyc",
        ".venv/bin/python3",
    ):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text("x")
    monkeypatch.setattr(mutate_run, "ROOT", tree)
    copy = tmp_path / "copy"
    mutate_run.copy_tree(copy)
    kept = {str(p.relative_to(copy)) for p in copy.rglob("*") if p.is_file()}
    assert kept == {
        "guests/build/rt.o",
        "guests/build/rt.d",
        "guests/bin/hello.hvt",
        "guests/hello.c",
        "csrc/hcfast.c",
    }
