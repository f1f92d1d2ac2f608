"""Systematic mutation runs: the scratch tree, the builds, the cache, the budget.

Used by scripts/mutate (``--files``, ``--all``, ``--changed``). Every mutant
is applied to one file of a scratch copy of the tree, the copy is rebuilt
when the file is C, the tests that scripts/mutation_map.toml gives for the
file run against the copy, and the file is put back. The copy runs with
``PYTHONPATH`` set to itself, so the tests' ``python -m pyvmm`` children
import the mutated code (checked before anything runs).

Results are kept in the cache directory (``PYVMM_MUTATION_CACHE``, default
/var/cache/pyvmm-mutation) under a key made of the file's text, the text of
its mapped test files and the operator set, so a change to any of those
starts that file afresh and an unchanged file costs nothing the second time.
Python results are cosmic-ray session databases (``py/*.sqlite``, readable
with ``cr-report``); C results are JSON (``c/*.json``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import mutate_c

ROOT = Path(__file__).resolve().parent.parent
MAP = ROOT / "scripts" / "mutation_map.toml"
EQUIVALENT = ROOT / "scripts" / "mutation_equivalent.toml"
CACHE = Path(os.environ.get("PYVMM_MUTATION_CACHE", "/var/cache/pyvmm-mutation"))

KILLED, SURVIVED, STILLBORN = "killed", "survived", "stillborn"


#: Seconds the prebuilt filter's compile may take (well under a second unmutated).
PREBUILT_TIMEOUT = 60


def sh(argv, cwd: Path, env: dict[str, str], timeout: float = 1800):
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


# --- the map and the known-equivalent list ---------------------------------------


@dataclass(frozen=True)
class Map:
    tests: dict[str, tuple[str, ...]]  # product file -> pytest arguments
    critical: frozenset[str]
    base: str = ""  # [ci] base: the commit CI's --changed compares with
    budget: float = 600  # [ci] budget: CI's seconds


def load_map(path: Path = MAP) -> Map:
    data = tomllib.loads(path.read_text())
    tests = {name: tuple(args) for name, args in data["tests"].items()}
    ci = data.get("ci", {})
    return Map(
        tests,
        frozenset(data["critical"]["files"]),
        str(ci.get("base", "")),
        float(ci.get("budget", 600)),
    )


def load_equivalents(path: Path = EQUIVALENT) -> dict[str, str]:
    """mutant id -> why it is equivalent (no test can tell it from the original)."""
    data = tomllib.loads(path.read_text())
    return {k: v for k, v in data.get("equivalent", {}).items()}


def test_files(args: tuple[str, ...]) -> list[str]:
    return [a.split("::")[0] for a in args if a.startswith("tests/")]


def cache_key(repo: Path, path: str) -> str:
    """What a file's stored mutants depend on: its text and the operators."""
    digest = hashlib.sha256()
    digest.update((repo / path).read_bytes())
    operators = ROOT / "scripts" / ("mutate_c.py" if is_c(path) else "mutate_py.py")
    digest.update(operators.read_bytes())
    return digest.hexdigest()[:16]


def tests_key(repo: Path, args: tuple[str, ...]) -> str:
    """What a result depends on besides the file: the tests' arguments and
    text. A killed mutant stays killed when the tests change (tests are
    added, the code is not); a survivor is run again."""
    digest = hashlib.sha256(" ".join(args).encode())
    for name in sorted(set(test_files(args))):
        digest.update(name.encode())
        if (repo / name).exists():
            digest.update((repo / name).read_bytes())
    return digest.hexdigest()[:12]


def is_c(path: str) -> bool:
    return path.endswith((".c", ".h"))


# --- the scratch tree ----------------------------------------------------------------


def copy_tree(dst: Path) -> None:
    """The working tree as it is now, without build products and caches,
    but with the guests' objects: tests that build a guest of their own
    link it against the runtime's (testkit.helpers.build_runtime_guest),
    and the copy builds the guests only when a mutated file goes into them
    (make rebuilds what a mutant's newer source needs)."""
    products = shutil.ignore_patterns(
        ".git",
        "__pycache__",
        "*.so",
        "*.o",
        "*.d",
        "*.egg-info",
        ".pytest_cache",
        ".hypothesis",
        ".ruff_cache",
        "_native.c",
        ".build.lock",
        ".venv",
    )
    guests = ROOT / "guests"

    def ignore(directory: str, names: list[str]) -> set[str]:
        left_out = products(directory, names)
        if Path(directory).is_relative_to(guests):
            left_out -= {n for n in names if n.endswith((".o", ".d"))}
        return left_out

    shutil.copytree(ROOT, dst, ignore=ignore, symlinks=True)


def build_native(repo: Path, env: dict[str, str], testkit: bool = True) -> str | None:
    """Build pyvmm._native for the scratch copy, into its pyvmm/; an error
    text or None. cffi compiles in an empty directory (a pyproject.toml in
    its current directory would be read as a setup configuration) whose
    csrc is a link to the copy's, as build_native.py's paths are relative."""
    build = repo.parent / "build"
    build.mkdir(exist_ok=True)
    if not (build / "csrc").exists():
        (build / "csrc").symlink_to(repo / "csrc")
    code = (
        f"import sys; sys.path.insert(0, {str(repo / 'csrc')!r}); import build_native; "
        "print(build_native.ffibuilder.compile(tmpdir='.', verbose=False))"
    )
    done = sh([sys.executable, "-c", code], build, env)
    if done.returncode:
        return (done.stdout + done.stderr)[-2000:]
    built = Path(done.stdout.strip().splitlines()[-1])
    built = built if built.is_absolute() else build / built
    shutil.copy2(built, repo / "pyvmm" / built.name)
    # The sandbox's filter compiled ahead, as setup.py's build does
    # (pyvmm/host/sandbox_prebuilt.py); a mutant it fails on, or that makes
    # the compile loop, is compiled again at run time, where the tests fail
    # or time out on it.
    try:
        sh([sys.executable, "-m", "pyvmm.host.sandbox"], repo, env, timeout=PREBUILT_TIMEOUT)
    except subprocess.TimeoutExpired:
        pass
    if testkit:
        kit = sh([sys.executable, "-m", "testkit.build"], repo, env)
        if kit.returncode:
            return (kit.stdout + kit.stderr)[-2000:]
    return None


def build_guests(repo: Path, env: dict[str, str]) -> str | None:
    done = sh(["make", "-s", "-j2", "-C", "guests"], repo, env)
    return (done.stdout + done.stderr)[-2000:] if done.returncode else None


def rebuild(repo: Path, env: dict[str, str], path: str) -> str | None:
    """Rebuild what a C file goes into: the extension for csrc/*.c; the
    extension, testkit's and the guests for csrc/*.h (the ring and ABI
    headers are shared); the guests for guests/runtime/."""
    if path.startswith("guests/"):
        return build_guests(repo, env)
    error = build_native(repo, env, testkit=path.endswith(".h"))
    if error is None and path.endswith(".h"):
        error = build_guests(repo, env)
    return error


def isolation_error(repo: Path, env: dict[str, str]) -> str | None:
    """None when a process started anywhere with this environment imports
    the scratch copy's pyvmm and extension, as the tests' children do."""
    code = "import pyvmm, pyvmm._native as n; print(pyvmm.__file__); print(n.__file__)"
    done = sh([sys.executable, "-c", code], Path("/"), env)
    paths = done.stdout.split()
    if done.returncode or len(paths) != 2 or not all(p.startswith(str(repo)) for p in paths):
        return f"pyvmm comes from {paths or done.stderr[-300:]}, not {repo}"
    return None


def run_tests(
    repo: Path, env: dict[str, str], args: tuple[str, ...], timeout: float
) -> tuple[str, str]:
    """(killed or survived, what failed) for pytest on the file's tests; a
    run past ``timeout`` is killed (a mutant that hangs the code)."""
    argv = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-rf", *args]
    proc = subprocess.Popen(
        argv,
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return KILLED, f"timeout ({timeout:.0f} s)"
    except BaseException:  # interrupted or stopped: the tests' processes go too
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if proc.returncode == 0:
        return SURVIVED, ""
    failed = re.findall(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", out, re.M)
    by = ", ".join(f.split("::", 1)[-1] for f in failed[:2])
    return KILLED, by or (out.strip().splitlines() or ["exit status"])[-1][:200]


# --- one file's mutants and their results ------------------------------------------


@dataclass
class Mutant:
    id: str
    path: str
    line: int
    operator: str
    apply: Callable[[str], str]
    before: str
    after: str = ""
    outcome: str | None = None  # killed, survived, stillborn; None: not run
    by: str = ""
    cached: bool = False
    stale: bool = False  # survived against tests that have changed since: to run again


@dataclass
class FileRun:
    path: str
    tests: tuple[str, ...]
    critical: bool
    mutants: list[Mutant] = field(default_factory=list)
    baseline_s: float | None = None
    baseline_error: str | None = None
    store: object = None  # cosmic-ray WorkDB or the C JSON path
    tests_key: str = ""

    def count(self, outcome: str, equivalents: dict[str, str] | None = None) -> int:
        eq = equivalents or {}
        if outcome == "equivalent":
            return sum(m.outcome == SURVIVED and m.id in eq for m in self.mutants)
        if outcome == SURVIVED and equivalents is not None:
            return sum(m.outcome == SURVIVED and m.id not in eq for m in self.mutants)
        return sum(m.outcome == outcome for m in self.mutants)


def load_file(repo: Path, path: str, tests: tuple[str, ...], critical: bool) -> FileRun:
    """The file's mutants with what the cache already knows of them."""
    run = FileRun(path, tests, critical)
    key = cache_key(repo, path)
    run.tests_key = tests_key(repo, tests)
    slug = path.replace("/", "_")
    text = (repo / path).read_text()
    lines = text.split("\n")
    if is_c(path):
        store = CACHE / "c" / f"{slug}-{key}.json"
        known = json.loads(store.read_text()) if store.exists() else {}
        for m in mutate_c.mutants(path, text):
            mutant = Mutant(
                m.id, path, m.line, m.operator, m.apply, m.before.strip(), m.after.strip()
            )
            entry = known.get(m.id)
            if entry and (entry["outcome"] != SURVIVED or entry.get("tests") == run.tests_key):
                mutant.outcome, mutant.by = entry["outcome"], entry["by"]
                mutant.cached = True
            elif entry:
                mutant.stale = True
            run.mutants.append(mutant)
        run.store = store
    else:
        import mutate_py  # cosmic-ray: needed for Python files only

        (CACHE / "py").mkdir(parents=True, exist_ok=True)
        db = mutate_py.session(CACHE / "py" / f"{slug}-{key}.sqlite", path, repo)
        done = mutate_py.results(db)
        postponed = "from __future__ import annotations" in text
        annotations = annotation_spans(text) if postponed else []
        for m in mutate_py.mutants(db, path, text):
            if _inside(m.item.mutations[0].start_pos, annotations):
                continue  # an annotation is never evaluated here (postponed): equivalent
            if _keyword_marker(lines, m.item.mutations[0].start_pos):
                continue  # def f(a, *, b) -> def f(a, /, b): callers pass b by name either way
            before = lines[m.line - 1].strip() if 0 < m.line <= len(lines) else ""
            mutant = Mutant(m.id, path, m.line, m.operator, m.apply, before)
            result = done.get(m.item.job_id)
            if result is not None:
                head, _, by = (result.output or "").partition("\n")
                outcome, _, key = head.partition(" ")
                if outcome != SURVIVED or key == run.tests_key:
                    mutant.outcome, mutant.by, mutant.cached = outcome, by, True
                else:
                    mutant.stale = True
            mutant.item = m.item  # type: ignore[attr-defined]
            run.mutants.append(mutant)
        run.store = db
    return run


def annotation_spans(text: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) of every type annotation in a module, as (line, column)."""
    import ast

    spans = []
    for node in ast.walk(ast.parse(text)):
        notes = []
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            notes.append(node.annotation)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns:
            notes.append(node.returns)
        for a in notes:
            spans.append(((a.lineno, a.col_offset), (a.end_lineno, a.end_col_offset)))
    return spans


def _keyword_marker(lines: list[str], pos) -> bool:
    """Whether ``pos`` is the bare ``*`` that starts keyword-only parameters."""
    row, col = pos
    line = lines[row - 1] if 0 < row <= len(lines) else ""
    return bool(re.match(r"\*\s*[,)]", line[col:]))


def _inside(pos: tuple[int, int], spans) -> bool:
    return any(start <= tuple(pos) < end for start, end in spans)


def save(run: FileRun, mutant: Mutant, diff: str) -> None:
    if is_c(run.path):
        path: Path = run.store  # type: ignore[assignment]
        path.parent.mkdir(parents=True, exist_ok=True)
        known = json.loads(path.read_text()) if path.exists() else {}
        known[mutant.id] = {
            "outcome": mutant.outcome,
            "by": mutant.by,
            "after": mutant.after,
            "tests": run.tests_key,
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
        tmp.replace(path)
        return
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

    outcome = {
        KILLED: TestOutcome.KILLED,
        SURVIVED: TestOutcome.SURVIVED,
        STILLBORN: TestOutcome.INCOMPETENT,
    }[mutant.outcome]
    result = WorkResult(
        worker_outcome=WorkerOutcome.NORMAL,
        test_outcome=outcome,
        output=f"{mutant.outcome} {run.tests_key}\n{mutant.by}",
        diff=diff,
    )
    run.store.set_result(mutant.item.job_id, result)  # type: ignore[attr-defined]


def changed_line(original: str, mutated: str) -> tuple[str, str]:
    a, b = original.split("\n"), mutated.split("\n")
    for x, y in zip(a, b, strict=False):
        if x != y:
            return x.strip(), y.strip()
    return "", ""


def run_mutant(repo: Path, env: dict[str, str], run: FileRun, mutant: Mutant, timeout: float):
    target = repo / run.path
    original = target.read_text()
    try:
        mutated = mutant.apply(original)
    except Exception as error:  # noqa: BLE001 - cosmic-ray fails on a few nodes of its own
        mutant.outcome = STILLBORN
        mutant.by = f"the mutator cannot make it ({type(error).__name__}: {error})"[:200]
        save(run, mutant, "")
        return
    before, after = changed_line(original, mutated)
    mutant.after = mutant.after or after
    try:
        target.write_text(mutated)
        error = rebuild(repo, env, run.path) if is_c(run.path) else None
        if error:
            mutant.outcome, mutant.by = STILLBORN, "does not build"
        else:
            if not is_c(run.path):
                try:
                    compile(mutated, run.path, "exec")
                except SyntaxError:
                    mutant.outcome, mutant.by = STILLBORN, "does not compile"
            if mutant.outcome is None:
                mutant.outcome, mutant.by = run_tests(repo, env, run.tests, timeout)
    finally:
        target.write_text(original)
        if is_c(run.path):
            error = rebuild(repo, env, run.path)
            if error:
                raise RuntimeError(f"{run.path} does not build once restored:\n{error}")
    save(run, mutant, f"- {before}\n+ {after}")


# --- a whole run ---------------------------------------------------------------------


def order(mutants: list[Mutant], seed: str) -> list[Mutant]:
    """A sample order that does not change between runs (so a second run
    with the same budget goes on where the first stopped)."""
    return sorted(mutants, key=lambda m: hashlib.sha1(f"{seed}:{m.id}".encode()).hexdigest())


def build_cost(path: str, costs: dict[str, float]) -> float:
    return 2 * costs.get("guests" if path.startswith("guests/") else "native", 0.0)


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP end a run like Ctrl-C: through its finally
    blocks, so the mutated file, the tests' processes and the scratch copy
    are cleaned up (a default SIGTERM would leave them)."""

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop)


def execute(
    files: list[str],
    budget: float,
    seed: str = "pyvmm",
    max_per_file: int | None = None,
    log: Callable[[str], None] = print,
    only_ids: set[str] | None = None,
    only_lines: dict[str, set[int]] | None = None,
) -> tuple[list[FileRun], dict[str, str]]:
    """Run the files' mutants (cached ones free) until the budget in seconds
    would be passed; the runs and the known equivalents. With ``only_lines``
    (file -> line numbers) a file's mutants are those on its lines only.
    The critical files' mutants go first: they are the ones that fail a run."""
    import tempfile

    start = time.monotonic()
    stop_on_signals()
    mapping = load_map()
    equivalents = load_equivalents()
    scratch = Path(tempfile.mkdtemp(prefix="pyvmm-mutate-"))
    repo = scratch / "repo"
    env = dict(os.environ, PYTHONPATH=str(repo), PYTHONDONTWRITEBYTECODE="1")
    runs: list[FileRun] = []
    try:
        log(f"# scratch copy: {repo}")
        copy_tree(repo)
        costs: dict[str, float] = {}
        t0 = time.monotonic()
        error = build_native(repo, env)
        costs["native"] = time.monotonic() - t0
        if error:
            raise RuntimeError(f"the unmutated copy does not build:\n{error}")
        error = isolation_error(repo, env)
        if error:
            raise RuntimeError(f"isolation failed: {error}")
        log(f"# pyvmm and its extension import from {repo} (the tests' children too)")
        if any(f.startswith("guests/") or f.endswith(".h") for f in files):
            t0 = time.monotonic()
            error = build_guests(repo, env)
            if error:
                raise RuntimeError(f"the unmutated guests do not build:\n{error}")
            t0 = time.monotonic()  # the first build rebuilt everything; time an incremental one
            (repo / "guests" / "runtime" / "string.c").touch()
            build_guests(repo, env)
            costs["guests"] = time.monotonic() - t0
        for path in files:
            tests = mapping.tests[path]
            run = load_file(repo, path, tests, path in mapping.critical)
            if only_lines is not None:
                lines = only_lines.get(path, set())
                run.mutants = [m for m in run.mutants if m.line in lines]
            for m in run.mutants:
                if m.stale and m.id in equivalents:
                    # Equivalent whatever the tests: no test can tell it apart.
                    m.outcome, m.cached, m.stale = SURVIVED, True, False
            runs.append(run)
            cached = sum(m.cached for m in run.mutants)
            log(f"# {path}: {len(run.mutants)} mutants, {cached} known from the cache")
        if only_ids:
            known = {m.id for run in runs for m in run.mutants}
            for missing in sorted(only_ids - known):
                log(f"# {missing}: no such mutant in the file as it is now")
        queues = {
            run.path: [
                m
                for m in order(run.mutants, seed)
                if m.outcome is None and (only_ids is None or m.id in only_ids)
            ]
            for run in runs
        }
        done_here = {run.path: 0 for run in runs}
        for group in ([r for r in runs if r.critical], [r for r in runs if not r.critical]):
            progress = True
            while progress:
                progress = False
                for run in group:
                    queue = queues[run.path]
                    if not queue or (
                        max_per_file is not None and done_here[run.path] >= max_per_file
                    ):
                        continue
                    if run.baseline_s is None and not baseline(repo, env, run, start, budget, log):
                        queue.clear()
                        continue
                    cost = run.baseline_s + build_cost(run.path, costs)
                    left = budget - (time.monotonic() - start)
                    if cost > left:
                        continue
                    mutant = queue.pop(0)
                    # A hang is a kill; the budget bounds how long one is waited for.
                    timeout = max(60.0, min(3 * run.baseline_s + 30, left + 60))
                    run_mutant(repo, env, run, mutant, timeout)
                    done_here[run.path] += 1
                    progress = True
                    mark = "  " if mutant.outcome != SURVIVED else "!!"
                    if mutant.outcome == SURVIVED and mutant.id in equivalents:
                        mark = "=="
                    log(
                        f"{mark} {mutant.outcome:9} {mutant.id}  {mutant.after[:70]}  "
                        f"{mutant.by[:60]}"
                    )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return runs, equivalents


def baseline(
    repo: Path, env: dict[str, str], run: FileRun, start: float, budget: float, log
) -> bool:
    """Time the file's tests unmutated (once, when its first mutant is
    due); whether its mutants can run. Tests that fail are the run's
    failure (``baseline_error``); tests cut off by the budget are not:
    the file is left for a run with more time."""
    left = budget - (time.monotonic() - start)
    if left <= 0:  # --budget 0: report the cache only
        return False
    t0 = time.monotonic()
    outcome, by = run_tests(repo, env, run.tests, timeout=left)
    if by.startswith("timeout"):
        log(f"# {run.path}: its tests take longer than the budget left ({left:.0f} s): not run")
        return False
    run.baseline_s = time.monotonic() - t0
    if outcome != SURVIVED:
        run.baseline_error = by
        log(f"# {run.path}: the tests fail without a mutation: {by}")
        return False
    log(f"# {run.path}: baseline {run.baseline_s:.1f} s")
    return True


def table(runs: list[FileRun], equivalents: dict[str, str]) -> str:
    rows = [
        "| file | critical | mutants | run | killed | survived | equivalent | stillborn "
        "| score | to re-run |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run in runs:
        killed = run.count(KILLED)
        survived = run.count(SURVIVED, equivalents)
        equivalent = run.count("equivalent", equivalents)
        stillborn = run.count(STILLBORN)
        ran = killed + survived + equivalent + stillborn
        score = f"{100 * killed / (killed + survived):.0f}%" if killed + survived else "-"
        if run.baseline_error:
            score = "BASELINE FAILS"
        rows.append(
            f"| {run.path} | {'yes' if run.critical else ''} | {len(run.mutants)} | {ran} "
            f"| {killed} | {survived} | {equivalent} | {stillborn} | {score} "
            f"| {sum(m.stale and m.outcome is None for m in run.mutants)} |"
        )
    return "\n".join(rows)


def survivors(runs: list[FileRun], equivalents: dict[str, str]) -> list[Mutant]:
    return [
        m for run in runs for m in run.mutants if m.outcome == SURVIVED and m.id not in equivalents
    ]


def check_base(base: str) -> str:
    """The full commit ``base`` names in this clone; a RuntimeError saying
    why not (a shallow clone lacks old commits: fetch them or pass --base)."""
    done = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode or not base:
        raise RuntimeError(
            f"the base {base!r} is no commit in this clone "
            "(a shallow clone? fetch its history or pass --base REV)"
        )
    return done.stdout.strip()


def changed_files(base: str, mapping: Map) -> list[str]:
    """Product files that differ between ``base`` and the working tree."""
    done = subprocess.run(
        ["git", "diff", "--name-only", base, "--", "pyvmm", "csrc", "guests/runtime"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(f"git diff against {base!r}: {done.stderr.strip()}")
    names = [n for n in done.stdout.split() if (ROOT / n).exists()]
    unmapped = [n for n in names if n not in mapping.tests and n.endswith((".py", ".c", ".h"))]
    for name in unmapped:
        print(f"# {name}: no tests mapped in scripts/mutation_map.toml, not mutated")
    return [n for n in names if n in mapping.tests]


HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@", re.M)


def changed_lines(base: str, path: str) -> set[int]:
    """The lines of the working tree's ``path`` that a diff from ``base``
    adds or changes; where lines were only removed, the two around the gap
    (a mutant there tests the code that took the removed lines' place)."""
    done = subprocess.run(
        ["git", "diff", "-U0", "--no-color", "--no-ext-diff", base, "--", path],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(f"git diff against {base!r}: {done.stderr.strip()}")
    return hunk_lines(done.stdout)


def hunk_lines(diff: str) -> set[int]:
    lines: set[int] = set()
    for match in HUNK.finditer(diff):
        first, count = int(match[1]), int(match[2] if match[2] is not None else 1)
        lines.update(range(first, first + count) if count else (first, first + 1))
    return lines
