#!/usr/bin/env python3
"""Build Solo5 from its release archive into a cache outside the repository,
and relink Solo5's own test programs against pyvmm's guest runtime.

    scripts/solo5_build.py [--archive FILE] [--cache DIR] [--arch ARCH]
                           [--force] [--no-bindings] [--print NAME] [-q]

Solo5's code is never part of this repository: it comes from the release
archive in ../shared/upstream/ (``PYVMM_SOLO5_ARCHIVE`` or ``--archive``
names another) and is built, offline, under ``PYVMM_SOLO5_CACHE`` or
``--cache`` (default /var/cache/pyvmm-solo5-build), in
``CACHE/<archive name>/``:

- ``src/``: the archive, configured and built as its README says
  (``include/version.h.distrib`` written first: a git archive has none);
  Solo5's test programs (objects, manifests, the stock ``.hvt`` and
  ``.spt`` builds) and ``tests/tests.bats`` are there;
- ``prefix/``: ``make install``: ``bin/`` (solo5-hvt, solo5-hvt-debug,
  solo5-spt, solo5-elftool, the ``x86_64-solo5-none-static-cc``, ``-ld``
  and ``-objcopy`` toolchain), ``lib/x86_64-solo5-none-static/`` (Solo5's
  bindings, and pyvmm's once installed), ``include/``;
- ``STAMP``: the archive's sha256 and the build's duration, written last.
  A build whose stamp names another archive (or none) is redone from
  scratch; one that matches is reused, so Solo5 is built once per machine.

Then, every time (a few seconds): pyvmm's bindings target is built and
installed into that toolchain with the documented command (``make -C guests
install-solo5 SOLO5_PREFIX=CACHE/.../prefix``), and every hvt test program
of Solo5's is relinked from its unchanged objects with
``x86_64-solo5-none-static-ld -z solo5-abi=pyvmm`` into
``CACHE/<archive name>/pyvmm-<hash>/`` (the hash is the bindings'; a new
runtime gets a new directory, so a running test never sees a program change
under it; relinks of an older runtime are removed after a day).

pyvmm's own programs written for the Solo5 API alone (bench/solo5/: the
udpsink receiver bench/pps.py and bench/soak.py run) are compiled once each
with ``x86_64-solo5-none-static-cc`` and that one object linked three ways,
into ``CACHE/<archive name>/apps-<hash>/`` (the hash covers the sources,
the manifests and the bindings; the same day-long pruning):
``NAME-pyvmm.hvt`` (``-z solo5-abi=pyvmm``: relinked onto pyvmm's runtime),
``NAME-solo5.hvt`` (``-z solo5-abi=hvt``: Solo5's own bindings, unmodified)
and ``NAME-solo5.spt`` (``-z solo5-abi=spt``, for solo5-spt).

``--arch aarch64`` on an x86_64 host cross-builds Solo5's toolchain,
bindings and test programs for arm64 with Debian's cross compiler
(gcc-aarch64-linux-gnu; the tenders stay the host's) into
``CACHE/<archive name>-aarch64/``, and relinks them with pyvmm's aarch64
bindings (``make -C guests ARCH=aarch64 install-solo5``).

Everything runs under one lock (``CACHE/.lock``): a second caller waits for
the first and then finds its work done. ``--print NAME`` prints one path
(``solo5-hvt``, ``solo5-spt``, ``solo5-elftool``, ``cc``, ``ld``,
``prefix``, ``lib``, ``src``, ``hvt-tests``, ``pyvmm-tests``,
``tests.bats``, ``apps``, ``udpsink-pyvmm``, ``udpsink-hvt``,
``udpsink-spt``). Exit status 0, 1 if the build failed (its log is
named), 2 for a bad argument or a missing archive or tool.

As a module: ``ensure()`` does the same and returns a ``Solo5Build`` with
those paths (tests/, bench/ and scripts/solo5_check.py use it).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROG = "solo5-build"
ARCHIVE = ROOT.parent / "shared" / "upstream" / "solo5-v0.12.1.tar.gz"
CACHE = Path("/var/cache/pyvmm-solo5-build")
ARCHIVE_ENV, CACHE_ENV = "PYVMM_SOLO5_ARCHIVE", "PYVMM_SOLO5_CACHE"
#: What Solo5's configure.sh and make need besides a C compiler.
TOOLS = ("make", "cc", "ld", "objcopy", "pkg-config")
STAMP_SCHEMA = "pyvmm-solo5-build/1"

Log = Callable[[str], None]


class BuildError(Exception):
    """A one-line reason; the exit status is ``status``."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Solo5Build:
    """Where everything of one build is. Paths only: nothing is checked."""

    root: Path
    triple: str

    @property
    def arch(self) -> str:
        return self.triple.split("-", 1)[0]

    @property
    def src(self) -> Path:
        return self.root / "src"

    @property
    def prefix(self) -> Path:
        return self.root / "prefix"

    @property
    def bin(self) -> Path:
        return self.prefix / "bin"

    @property
    def lib(self) -> Path:
        """The toolchain's lib directory: Solo5's bindings and pyvmm's."""
        return self.prefix / "lib" / self.triple

    @property
    def cc(self) -> Path:
        return self.bin / f"{self.triple}-cc"

    @property
    def ld(self) -> Path:
        return self.bin / f"{self.triple}-ld"

    @property
    def solo5_hvt(self) -> Path:
        return self.bin / "solo5-hvt"

    @property
    def solo5_hvt_debug(self) -> Path:
        return self.bin / "solo5-hvt-debug"

    @property
    def solo5_spt(self) -> Path:
        return self.bin / "solo5-spt"

    @property
    def elftool(self) -> Path:
        return self.bin / "solo5-elftool"

    @property
    def hvt_tests(self) -> Path:
        """Solo5's test programs as Solo5 builds them (solo5_hvt.o)."""
        return self.root / "hvt-tests"

    @property
    def tests_bats(self) -> Path:
        return self.src / "tests" / "tests.bats"

    @property
    def stamp(self) -> Path:
        return self.root / "STAMP"

    pyvmm_tests: Path | None = None  # set by ensure(): the relinked programs
    apps: Path | None = None  # set by ensure(): bench/solo5's programs, each form

    def app(self, name: str, form: str) -> Path:
        """One of bench/solo5's programs in one form (a key of APP_FORMS)."""
        if self.apps is None:
            raise BuildError("no Solo5-API programs (the bindings were not built)", 2)
        return self.apps / app_file(name, form)

    def path(self, name: str) -> Path:
        """One of the names --print takes."""
        table = {
            "solo5-hvt": self.solo5_hvt,
            "solo5-hvt-debug": self.solo5_hvt_debug,
            "solo5-spt": self.solo5_spt,
            "solo5-elftool": self.elftool,
            "cc": self.cc,
            "ld": self.ld,
            "prefix": self.prefix,
            "lib": self.lib,
            "src": self.src,
            "hvt-tests": self.hvt_tests,
            "tests.bats": self.tests_bats,
        }
        app, _, form = name.rpartition("-")
        if app in APP_NAMES and form in APP_FORMS:
            return self.app(app, form)
        if name == "apps":
            if self.apps is None:
                raise BuildError("no Solo5-API programs (the bindings were not built)", 2)
            return self.apps
        if name == "pyvmm-tests":
            if self.pyvmm_tests is None:
                raise BuildError("no relinked tests (the bindings were not built)", 2)
            return self.pyvmm_tests
        if name not in table:
            extra = ["pyvmm-tests", "apps", *(f"{a}-{f}" for a in APP_NAMES for f in APP_FORMS)]
            raise BuildError(f"--print {name}: one of {', '.join([*table, *extra])}", 2)
        return table[name]


ARCHES = ("x86_64", "aarch64")

#: pyvmm's programs for the Solo5 API alone: bench/solo5/NAME.c with its
#: manifest NAME.json, built with Solo5's toolchain only.
APPS = ROOT / "bench" / "solo5"
APP_NAMES = ("udpsink",)
#: Each form's bindings (``-z solo5-abi=``) and file name suffix.
APP_FORMS = {
    "pyvmm": ("pyvmm", "pyvmm.hvt"),
    "hvt": ("hvt", "solo5.hvt"),
    "spt": ("spt", "solo5.spt"),
}


def app_file(name: str, form: str) -> str:
    """udpsink, pyvmm -> udpsink-pyvmm.hvt (udpsink-solo5.hvt, udpsink-solo5.spt)."""
    return f"{name}-{APP_FORMS[form][1]}"


def host_arch() -> str:
    return platform.machine()


def target_triple(arch: str | None = None) -> str:
    return f"{arch or host_arch()}-solo5-none-static"


def cross_env(arch: str) -> dict[str, str]:
    """Solo5's configure.sh builds its toolchain and bindings for another
    architecture with these (Debian's cross compiler); tenders stay the host's."""
    if arch == host_arch():
        return {}
    gnu = f"{arch}-linux-gnu"
    return {"TARGET_CC": f"{gnu}-gcc", "TARGET_LD": f"{gnu}-ld", "TARGET_OBJCOPY": f"{gnu}-objcopy"}


def archive_path(archive: Path | str | None = None) -> Path:
    return Path(archive or os.environ.get(ARCHIVE_ENV) or ARCHIVE)


def cache_path(cache: Path | str | None = None) -> Path:
    return Path(cache or os.environ.get(CACHE_ENV) or CACHE)


def archive_name(archive: Path) -> str:
    """solo5-v0.12.1.tar.gz -> solo5-v0.12.1."""
    name = archive.name
    for suffix in (".tar.gz", ".tgz", ".tar.xz", ".tar"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def solo5_version(archive: Path) -> str:
    """The SOLO5_VERSION a release build reports: v0.12.1 from the name."""
    name = archive_name(archive)
    return name.split("-", 1)[1] if name.startswith("solo5-") and "-" in name else name


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# -- the lock -----------------------------------------------------------------


@contextmanager
def locked(cache: Path, log: Log) -> Iterator[None]:
    """Hold CACHE/.lock (flock, exclusive) for the whole build."""
    try:
        cache.mkdir(parents=True, exist_ok=True)
        fd = os.open(cache / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise BuildError(
            f"cannot use the cache {cache}: {e.strerror} (set {CACHE_ENV} or --cache)", 2
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another build in {cache}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


# -- stage 1: Solo5 itself, once per archive --------------------------------------


def stamp_matches(build: Solo5Build, sha256: str) -> bool:
    try:
        stamp = json.loads(build.stamp.read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(stamp, dict)
        and stamp.get("schema") == STAMP_SCHEMA
        and stamp.get("archive_sha256") == sha256
        and build.solo5_hvt.exists()
        and build.ld.exists()
        and build.hvt_tests.is_dir()
    )


def check_tools(log: Log, arch: str) -> None:
    cross = cross_env(arch)
    if cross and shutil.which(cross["TARGET_CC"]) is None:
        raise BuildError(
            f"building for {arch} needs {cross['TARGET_CC']}, not installed "
            f"(Debian: apt-get install gcc-{arch}-linux-gnu)",
            2,
        )
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing == ["pkg-config"] and os.geteuid() == 0 and shutil.which("apt-get"):
        # The one tool of Solo5's that scripts/setup does not need itself.
        log("installing pkg-config (Solo5's configure.sh asks it for libseccomp)")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        quiet = {"stdout": subprocess.DEVNULL, "env": env}
        subprocess.run(["apt-get", "update", "-qq"], **quiet)
        subprocess.run(["apt-get", "install", "-y", "-qq", "pkg-config"], **quiet)
        missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise BuildError(
            f"Solo5's build needs {', '.join(missing)}, not installed "
            "(Debian: apt-get install build-essential pkg-config libseccomp-dev)",
            2,
        )
    probe = subprocess.run(["pkg-config", "--exists", "libseccomp"], capture_output=True)
    if probe.returncode != 0:
        raise BuildError(
            "Solo5's tenders need libseccomp's headers, not installed "
            "(Debian: apt-get install libseccomp-dev)",
            2,
        )


def extract(archive: Path, into: Path) -> Path:
    """The archive's one top-level directory, unpacked under ``into``; a
    member or link that would land outside ``into`` is refused."""
    base = into.resolve()

    def inside(path: Path) -> bool:
        return path.resolve().is_relative_to(base)

    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            tops = {Path(m.name).parts[0] for m in members if Path(m.name).parts}
            if len(tops) != 1:
                raise BuildError(f"{archive}: not a release archive (no single top directory)")
            for member in members:
                where = base / member.name
                ok = inside(where) and not (member.isdev() or member.isfifo())
                if member.issym():
                    ok = ok and inside(where.parent / member.linkname)
                elif member.islnk():
                    ok = ok and inside(base / member.linkname)
                if not ok:
                    raise BuildError(f"{archive}: member {member.name!r} is not a plain file")
            tar.extractall(base, members=members)
    except (OSError, tarfile.TarError) as e:
        raise BuildError(f"{archive}: cannot unpack: {e}") from None
    return base / tops.pop()


def run_logged(
    argv: list[str], cwd: Path, log_file: Path, what: str, extra_env: dict[str, str] | None = None
) -> None:
    with open(log_file, "ab") as out:
        out.write(f"\n$ {' '.join(argv)}   (in {cwd})\n".encode())
        out.flush()
        env = dict(os.environ, LC_ALL="C", **(extra_env or {}))
        env.pop("MAKEFLAGS", None)  # not a sub-make of whoever called us
        env.pop("MFLAGS", None)
        done = subprocess.run(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env)
    if done.returncode != 0:
        raise BuildError(f"{what} failed (status {done.returncode}); the log is {log_file}")


def build_solo5(build: Solo5Build, archive: Path, sha256: str, log: Log) -> None:
    """Unpack, configure, build and install Solo5 in build.root, from scratch."""
    arch = build.arch
    check_tools(log, arch)
    started = time.monotonic()
    shutil.rmtree(build.root, ignore_errors=True)
    build.root.mkdir(parents=True)
    log_file = build.root / "build.log"
    log(f"building Solo5 from {archive.name} in {build.root} (log: {log_file})")
    with tempfile.TemporaryDirectory(dir=build.root, prefix=".unpack-") as tmp:
        top = extract(archive, Path(tmp))
        top.rename(build.src)
    version_h = build.src / "include" / "version.h.distrib"
    if not version_h.exists():
        version = solo5_version(archive)
        version_h.write_text(
            "#ifndef __VERSION_H__\n#define __VERSION_H__\n"
            f'#define SOLO5_VERSION "{version}"\n#endif\n'
        )
    jobs = str(max(1, os.cpu_count() or 1))
    configure = ["./configure.sh", f"--prefix={build.prefix}"]
    run_logged(configure, build.src, log_file, "configure", cross_env(arch))
    run_logged(["make", "-j", jobs], build.src, log_file, "make")
    run_logged(["make", "install"], build.src, log_file, "make install")
    collect_hvt_tests(build)
    seconds = time.monotonic() - started
    build.stamp.write_text(
        json.dumps(
            {
                "schema": STAMP_SCHEMA,
                "archive": archive.name,
                "archive_sha256": sha256,
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "seconds": round(seconds, 1),
            },
            indent=1,
        )
        + "\n"
    )
    log(f"built Solo5 in {seconds:.1f} s")


def test_dirs(build: Solo5Build) -> list[Path]:
    """Solo5's test program directories that build an hvt unikernel."""
    tests = build.src / "tests"
    return sorted(d for d in tests.glob("test_*") if (d / f"{d.name}.hvt").exists())


def collect_hvt_tests(build: Solo5Build) -> None:
    """The stock hvt programs, side by side (buggyelf.hvt is a file of its own)."""
    out = build.hvt_tests
    out.mkdir()
    for d in test_dirs(build):
        shutil.copy2(d / f"{d.name}.hvt", out)
    for extra in (build.src / "tests").glob("test_*/buggyelf.hvt"):
        shutil.copy2(extra, out)


# -- stage 2: pyvmm's bindings and the relinked programs, each time -----------------


def install_bindings(build: Solo5Build, log_file: Path) -> bytes:
    """make -C guests install-solo5 into the built toolchain; the bytes of
    what was installed (object and script), to name the relink after."""
    guests = ["make", "-s", "-C", str(ROOT / "guests"), f"ARCH={build.arch}"]
    run_logged(
        [*guests, "install-solo5", f"SOLO5_PREFIX={build.prefix}"],
        ROOT,
        log_file,
        "building pyvmm's bindings (make -C guests install-solo5)",
    )
    return (build.lib / "solo5_pyvmm.o").read_bytes() + (build.lib / "solo5_pyvmm.lds").read_bytes()


def relink_tests(build: Solo5Build, bindings: bytes, log_file: Path, log: Log) -> Path:
    """Every hvt test program's own objects, linked with -z solo5-abi=pyvmm."""
    digest = hashlib.sha256(bindings).hexdigest()[:12]
    out = build.root / f"pyvmm-{digest}"
    if (out / "DONE").exists():
        return out
    tmp = Path(tempfile.mkdtemp(dir=build.root, prefix=".relink-"))
    try:
        for d in test_dirs(build):
            objects = [d / f"{d.name}.o", d / "manifest.o"]
            argv = [str(build.ld), "-z", "solo5-abi=pyvmm", "-o", str(tmp / f"{d.name}.hvt")]
            run_logged([*argv, *map(str, objects)], d, log_file, f"relinking {d.name}")
        for extra in build.hvt_tests.glob("buggyelf.hvt"):
            shutil.copy2(extra, tmp)  # not a program: a broken file, as it is
        (tmp / "DONE").write_text(f"relinked with solo5_pyvmm {digest}\n")
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"relinked {len(test_dirs(build))} test programs with -z solo5-abi=pyvmm into {out}")
    prune(build, keep=out)
    return out


#: Relinked programs of an older runtime are removed once this old: a run
#: that could still be using them has long ended.
STALE_SECONDS = 24 * 3600


def build_apps(build: Solo5Build, bindings: bytes, log_file: Path, log: Log) -> Path:
    """bench/solo5's programs: each compiled once by Solo5's cc, linked in
    every form of APP_FORMS; reused while sources and bindings are the same."""
    digest = hashlib.sha256(bindings)
    for name in APP_NAMES:
        for suffix in (".c", ".json"):
            digest.update((APPS / f"{name}{suffix}").read_bytes())
    out = build.root / f"apps-{digest.hexdigest()[:12]}"
    if (out / "DONE").exists():
        return out
    tmp = Path(tempfile.mkdtemp(dir=build.root, prefix=".apps-"))
    flags = ["-O2", "-Wall", "-Wextra", "-Werror"]
    try:
        for name in APP_NAMES:
            manifest = tmp / f"{name}.mft.c"
            steps = [
                [str(build.elftool), "gen-manifest", str(APPS / f"{name}.json"), str(manifest)],
                [str(build.cc), *flags, "-c", str(manifest), "-o", str(tmp / f"{name}.mft.o")],
                [
                    str(build.cc),
                    *flags,
                    "-c",
                    str(APPS / f"{name}.c"),
                    "-o",
                    str(tmp / f"{name}.o"),
                ],
            ]
            objects = [str(tmp / f"{name}.o"), str(tmp / f"{name}.mft.o")]
            for form, (abi, _) in APP_FORMS.items():
                target = str(tmp / app_file(name, form))
                steps.append([str(build.ld), "-z", f"solo5-abi={abi}", "-o", target, *objects])
            for argv in steps:
                run_logged(argv, tmp, log_file, f"building {name} ({Path(argv[0]).name})")
        (tmp / "DONE").write_text(f"built with solo5_pyvmm {digest.hexdigest()[:12]}\n")
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"built {', '.join(APP_NAMES)} in {len(APP_FORMS)} forms into {out}")
    prune(build, keep=out, kinds=("apps-*", ".apps-*"))
    return out


def prune(build: Solo5Build, keep: Path, kinds: tuple[str, ...] = ("pyvmm-*", ".relink-*")) -> None:
    """Earlier builds of one kind (and the leftovers of interrupted ones) past
    STALE_SECONDS."""
    now = time.time()
    for old in [path for kind in kinds for path in build.root.glob(kind)]:
        try:
            stale = now - old.stat().st_mtime > STALE_SECONDS
        except OSError:
            continue
        if old != keep and stale:
            shutil.rmtree(old, ignore_errors=True)


# -- the whole -----------------------------------------------------------------------


def ensure(
    archive: Path | str | None = None,
    cache: Path | str | None = None,
    *,
    arch: str | None = None,
    force: bool = False,
    bindings: bool = True,
    log: Log | None = None,
) -> Solo5Build:
    """Solo5 built from ``archive`` in ``cache`` (built now if it is not),
    and, with ``bindings``, pyvmm's bindings installed, the test programs
    relinked and bench/solo5's programs built in every form. Raises
    BuildError with a one-line reason."""
    say = log or (lambda message: print(f"{PROG}: {message}", file=sys.stderr))
    source = archive_path(archive)
    if not source.is_file():
        raise BuildError(f"no Solo5 release archive at {source} (set {ARCHIVE_ENV})", 2)
    root = cache_path(cache)
    with locked(root, say):
        arch = arch or host_arch()
        if arch not in ARCHES:
            raise BuildError(f"--arch {arch}: one of {', '.join(ARCHES)}", 2)
        name = archive_name(source) + ("" if arch == host_arch() else f"-{arch}")
        build = Solo5Build(root / name, target_triple(arch))
        sha256 = sha256_of(source)
        if force or not stamp_matches(build, sha256):
            build_solo5(build, source, sha256, say)
        if not bindings:
            return build
        log_file = build.root / "bindings.log"
        log_file.write_text("")
        installed = install_bindings(build, log_file)
        relinked = relink_tests(build, installed, log_file, say)
        apps = build_apps(build, installed, log_file, say)
        return Solo5Build(build.root, build.triple, pyvmm_tests=relinked, apps=apps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Build Solo5 from its release archive into a cache, install pyvmm's "
        "bindings into its toolchain and relink Solo5's test programs with them.",
    )
    parser.add_argument(
        "--archive", help=f"the release archive (default: ${ARCHIVE_ENV} or {ARCHIVE})"
    )
    parser.add_argument("--cache", help=f"the cache directory (default: ${CACHE_ENV} or {CACHE})")
    parser.add_argument(
        "--arch",
        choices=ARCHES,
        help="the toolchain's and programs' architecture (default: the host's; another one is "
        "cross-built, into CACHE/<archive name>-ARCH)",
    )
    parser.add_argument(
        "--force", action="store_true", help="rebuild Solo5 even if the stamp matches"
    )
    parser.add_argument("--no-bindings", action="store_true", help="only Solo5, no pyvmm bindings")
    parser.add_argument(
        "--print", dest="show", metavar="NAME", help="print one path and nothing else"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="say nothing but errors")
    args = parser.parse_args(argv)
    quiet = args.quiet or args.show is not None
    log = (lambda message: None) if quiet else None
    try:
        build = ensure(
            args.archive,
            args.cache,
            arch=args.arch,
            force=args.force,
            bindings=not args.no_bindings,
            log=log,
        )
        if args.show is not None:
            print(build.path(args.show))
        elif not args.quiet:
            print(f"{PROG}: Solo5 in {build.root}: tenders and toolchain in {build.bin}")
            if build.pyvmm_tests is not None:
                print(f"{PROG}: relinked test programs in {build.pyvmm_tests}")
            if build.apps is not None:
                print(f"{PROG}: Solo5-API programs in {build.apps}")
    except BuildError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return e.status
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
