"""Builds the cffi extension pyvmm._native from csrc/ (see pyproject.toml)."""

from setuptools import setup

setup(cffi_modules=["csrc/build_native.py:ffibuilder"])
