"""Builds the cffi extension pyvmm._native from csrc/ (see pyproject.toml)
and the native launcher pyvmm/_launcher (csrc/launcher.c, docs/startup.md)
next to it, with pyvmm-oci's native front end pyvmm/_oci (csrc/oci_front.c,
docs/orchestration.md): in the source tree for an editable install, in the
wheel otherwise."""

import os
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_ext import build_ext

LAUNCHER_SOURCE = os.path.join("csrc", "launcher.c")
#: The programs built beside the extension: (sources, name in the package).
PROGRAMS = (
    ((LAUNCHER_SOURCE,), "_launcher"),
    ((os.path.join("csrc", "oci_front.c"), os.path.join("csrc", "oci_timeline.c")), "_oci"),
)
#: The launcher as the scripts directory's ``pyvmm``: build_ext runs before
#: build_scripts, which copies it as it is (no shebang to rewrite), so any
#: install (a wheel, ``pip install .``, an editable one) gets the native
#: command rather than a Python wrapper around pyvmm.entry:run.
COMMAND = os.path.join("build", "command", "pyvmm")


class BuildWithLauncher(build_ext):
    """build_ext, plus the launcher compiled for the interpreter building
    the package (the one pip installs it for, as pip's script shebangs)."""

    def run(self) -> None:
        super().run()
        package_dir = os.path.dirname(self.get_ext_fullpath("pyvmm._native"))
        os.makedirs(package_dir, exist_ok=True)
        target = os.path.join(package_dir, "_launcher")
        compiler = self.compiler
        if compiler is None or isinstance(compiler, str):
            from distutils.ccompiler import new_compiler
            from distutils.sysconfig import customize_compiler

            compiler = new_compiler()
            customize_compiler(compiler)
        python = sys.executable  # a venv's own, not what it links to
        for sources, name in PROGRAMS:
            objects = compiler.compile(
                list(sources),
                output_dir=self.build_temp,
                macros=[("PYVMM_PYTHON", '"' + python.replace('"', '\\"') + '"')],
                extra_postargs=["-O2", "-Wall"],
            )
            try:
                # Static: no dynamic loader runs before main() blocks the signals.
                compiler.link_executable(
                    objects, name, output_dir=package_dir, extra_postargs=["-static"]
                )
            except Exception:  # no static libc: the same, dynamically linked
                compiler.link_executable(objects, name, output_dir=package_dir)
            os.chmod(os.path.join(package_dir, name), 0o755)
        # The same program as the install's `pyvmm` command (see below).
        os.makedirs(os.path.dirname(COMMAND), exist_ok=True)
        self.copy_file(target, COMMAND)
        self.write_sandbox_programs(package_dir)

    def write_sandbox_programs(self, package_dir: str) -> None:
        """The sandbox's filter compiled now, beside the extension, so no
        VM process compiles it (pyvmm/host/sandbox_prebuilt.py). Without
        them every process compiles it, as before: a warning, no failure."""
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.abspath(package_dir)))
        done = subprocess.run(
            [sys.executable, "-s", "-m", "pyvmm.host.sandbox"], env=env, capture_output=True
        )
        if done.returncode:
            last = (done.stderr.decode(errors="replace").strip().splitlines() or ["?"])[-1]
            print(f"warning: the sandbox's filter is not compiled ahead: {last}", file=sys.stderr)


#: setuptools' own build_scripts (its copy of distutils, whatever is imported).
_BuildScripts = Distribution().get_command_class("build_scripts")


class BuildCommand(_BuildScripts):
    """Copies the launcher as it is: build_scripts would read each script
    as Python source to rewrite its shebang, and the launcher is ELF."""

    def run(self) -> None:
        self.mkpath(self.build_dir)
        for script in self.scripts or ():
            target = os.path.join(self.build_dir, os.path.basename(script))
            self.copy_file(script, target)
            os.chmod(target, 0o755)


setup(
    cffi_modules=["csrc/build_native.py:ffibuilder"],
    cmdclass={"build_ext": BuildWithLauncher, "build_scripts": BuildCommand},
    scripts=[COMMAND],
)
