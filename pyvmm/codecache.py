"""What dataclasses costs at start-up, cut to what pyvmm uses of it.

A dataclass's ``__init__``, ``__repr__`` and ``__eq__`` are written as
source text and compiled with ``exec`` when its module is imported: about
half of the time pyvmm spends importing itself (21 dataclasses on a plain
guest's path, measured in docs/startup.md). The text is the same at every
start, so the command keeps the compiled code objects, keyed by their
source text, in one marshal file next to pyvmm's bytecode and gives
dataclasses an ``exec`` that looks there first. Keyed by the whole text, an
entry can only ever stand for exactly the code it was compiled from; a
different Python (marshal and bytecode change between versions) starts
from an empty cache.

dataclasses also imports ``inspect`` (with ast, dis and tokenize: about
a tenth of the imports) for one call, made only for a class without a
docstring; the command gives it a stand-in that imports the real module at
its first use, and pyvmm's dataclasses all have docstrings
(tests/test_startup.py checks that inspect stays out).

Only the command uses it: pyvmm.entry ``enable``s it, the CLI
``install``s it once it knows the action needs more than --version (which
imports no dataclasses at all), and ``save`` runs once the run's imports
are done, before the sandbox refuses writing files. Whatever fails (no
cache yet, an unwritable directory, a dataclasses module that does not
call ``exec``) leaves imports as they were, only slower.
"""

from __future__ import annotations

import marshal
import os
import sys
import types

_PATH = os.path.join(
    os.path.dirname(__file__), "__pycache__", f"codecache.{sys.implementation.cache_tag}.marshal"
)
# Past this many entries (source texts change as dataclasses do) start over.
_MAX_ENTRIES = 4096

_cache: dict[str, object] = {}
_dirty = False
_enabled = False
_installed = False


def enable() -> None:
    """This process is the pyvmm command: ``install`` may hook dataclasses."""
    global _enabled
    _enabled = True


def _exec(source, globals=None, locals=None, /) -> None:  # noqa: A002 (exec's own names)
    """``exec`` for dataclasses: a source text's code from the cache."""
    global _dirty
    if type(source) is str:
        code = _cache.get(source)
        if code is None:
            # As exec(source) would compile it: dataclasses.py has no
            # __future__ flags to inherit.
            code = compile(source, "<string>", "exec", dont_inherit=True)
            _cache[source] = code
            _dirty = True
        source = code
    exec(source, globals, locals)


class _LazyInspect(types.ModuleType):
    """``inspect`` until something uses it: then the real module."""

    def __getattr__(self, name: str):
        return getattr(_real_inspect(), name)


def _real_inspect() -> types.ModuleType:
    if type(sys.modules.get("inspect")) is _LazyInspect:
        del sys.modules["inspect"]
    import inspect

    dataclasses = sys.modules.get("dataclasses")
    if dataclasses is not None and type(getattr(dataclasses, "inspect", None)) is _LazyInspect:
        dataclasses.inspect = inspect
    return inspect


def install() -> None:
    """Serve dataclasses' generated code from the cache (the command only)."""
    global _cache, _installed
    if not _enabled or _installed:
        return
    try:
        with open(_PATH, "rb") as f:
            version, cache = marshal.loads(f.read())
        if version == sys.version and type(cache) is dict:
            _cache = cache
    except (OSError, ValueError, EOFError, TypeError):
        pass
    if "dataclasses" not in sys.modules and "inspect" not in sys.modules:
        sys.modules["inspect"] = _LazyInspect("inspect")
    import dataclasses

    dataclasses.exec = _exec  # found before the builtin by dataclasses' own code
    _installed = True


def save() -> None:
    """Write the cache if this run compiled anything new (atomically: other
    pyvmm processes may be reading or writing it too)."""
    global _dirty, _cache
    if not (_installed and _dirty):
        return
    _dirty = False
    if len(_cache) > _MAX_ENTRIES:
        _cache = {}
        return
    temp = f"{_PATH}.{os.getpid()}"
    try:
        with open(temp, "wb") as f:
            f.write(marshal.dumps((sys.version, _cache)))
        os.replace(temp, _PATH)
    except (OSError, ValueError):
        try:
            os.unlink(temp)
        except OSError:
            pass
