"""Builds the cffi extension pyvmm._native from csrc/ (see pyproject.toml)
and the native launcher pyvmm/_launcher (csrc/launcher.c, docs/startup.md)
next to it: in the source tree for an editable install, in the wheel
otherwise."""

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

LAUNCHER_SOURCE = os.path.join("csrc", "launcher.c")


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
        objects = compiler.compile(
            [LAUNCHER_SOURCE],
            output_dir=self.build_temp,
            macros=[("PYVMM_PYTHON", '"' + python.replace('"', '\\"') + '"')],
            extra_postargs=["-O2", "-Wall"],
        )
        try:
            # Static: no dynamic loader runs before main() blocks the signals.
            compiler.link_executable(
                objects, "_launcher", output_dir=package_dir, extra_postargs=["-static"]
            )
        except Exception:  # no static libc: the same, dynamically linked
            compiler.link_executable(objects, "_launcher", output_dir=package_dir)
        os.chmod(target, 0o755)


setup(
    cffi_modules=["csrc/build_native.py:ffibuilder"],
    cmdclass={"build_ext": BuildWithLauncher},
)
