"""pyvmm.codecache: dataclasses' generated code compiled once, then read
from the cache; a damaged or foreign cache is ignored (docs/startup.md)."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

# As the launcher runs it: -I -S, the checkout first on sys.path.
SCRIPT = """
import sys
sys.path.insert(0, sys.argv[2])
from pyvmm import codecache
codecache._PATH = sys.argv[1]
codecache.enable()
codecache.install()
from dataclasses import dataclass, field

@dataclass(frozen=True)
class Point:
    "A point."
    x: int
    y: int = 2
    tags: list = field(default_factory=list, compare=False)

p = Point(1)
assert (p.x, p.y, p.tags) == (1, 2, []) and p == Point(1, 2, ["other"]), p
assert repr(p) == "Point(x=1, y=2, tags=[])", repr(p)
try:
    p.x = 3
except Exception as err:
    assert type(err).__name__ == "FrozenInstanceError"
else:
    raise AssertionError("not frozen")
assert type(sys.modules["inspect"]).__name__ == "_LazyInspect"  # nothing used it yet

@dataclass
class Plain:
    a: int

assert Plain.__doc__ == "Plain(a: int)", Plain.__doc__  # the real inspect, on demand
import inspect
assert str(inspect.signature(Plain)) == "(a: int) -> None"
assert type(sys.modules["inspect"]).__name__ == "module"
print("compiled" if codecache._dirty else "cached")
codecache.save()
"""


def run(path) -> str:
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", SCRIPT, str(path), str(ROOT)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_compiled_once_then_read_from_the_cache(tmp_path):
    cache = tmp_path / "codecache.marshal"
    assert run(cache) == "compiled"
    assert cache.stat().st_size > 0
    assert run(cache) == "cached"


def test_a_damaged_cache_is_ignored_and_rewritten(tmp_path):
    cache = tmp_path / "codecache.marshal"
    cache.write_bytes(b"\x00not marshal data")
    assert run(cache) == "compiled"
    assert run(cache) == "cached"


def test_a_cache_from_another_python_is_ignored(tmp_path):
    import marshal

    cache = tmp_path / "codecache.marshal"
    cache.write_bytes(marshal.dumps(("2.7.18 (elsewhere)", {"x": compile("1", "<s>", "eval")})))
    assert run(cache) == "compiled"


def test_an_unwritable_cache_only_costs_time(tmp_path):
    assert run(tmp_path / "missing-dir" / "codecache.marshal") == "compiled"
