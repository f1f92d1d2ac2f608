"""The unikernel's symbols, read from its file only when a fault needs them.

Start-up reads no symbol (docs/startup.md): ``SymbolFile.open`` only opens
the file at set-up, since the sandbox refuses an open once the guest runs,
and reads its 64-byte header, to know it again; ``lookup`` reads the
section headers, the symbol table and its strings with pread on that fd
the first time it is asked. Every size and offset
is the file's word, so each is checked against the file and a limit; a
file that is not what it was at set-up (rewritten in place since) or has
no usable symbol table gives no names, never an error.
"""

from __future__ import annotations

import bisect
import os
import struct

from pyvmm.loader.elf import EHDR
from pyvmm.loader.elf import SHDR as _SHDR
from pyvmm.loader.elf import SYM as _SYM

_SHT_SYMTAB = 2
_STT_NOTYPE, _STT_OBJECT, _STT_FUNC = 0, 1, 2
_SHN_UNDEF, _SHN_LORESERVE = 0, 0xFF00
#: At most this much of the file is read for symbols (a table larger is
#: not read at all): a fault report must not read a hostile file's 4 GiB.
MAX_TABLE = 64 << 20
MAX_NAME = 256


class SymbolFile:
    """The unikernel file, open for its symbols; ``close`` when done."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._identity = self._identify()
        self._table: tuple[list[int], list[tuple[int, int, str]]] | None = None

    @classmethod
    def open(cls, path: str) -> SymbolFile | None:
        """The file at ``path``, or None if it cannot be opened again."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            return cls(fd)
        except OSError:
            os.close(fd)
            return None

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def lookup(self, address: int) -> tuple[str, int] | None:
        """(name, offset) of the function or label holding ``address``."""
        addresses, symbols = self._symbols()
        i = bisect.bisect_right(addresses, address) - 1
        if i < 0:
            return None
        start, size, name = symbols[i]
        if size and address >= start + size:
            return None
        return name, address - start

    def address_of(self, name: str) -> int | None:
        """The address of the symbol ``name`` (a debugger's "break NAME")."""
        for start, _, symbol in self._symbols()[1]:
            if symbol == name:
                return start
        return None

    def describe(self, address: int, *, caller: bool = False) -> str | None:
        """``name+0xoff`` for ``address``, or None. ``caller``: a return
        address, looked up by the call before it (a call may end its
        function)."""
        found = self.lookup(address - 1 if caller else address)
        if found is None:
            return None
        name, offset = found
        offset += 1 if caller else 0
        return f"{name}+{offset:#x}" if offset else name

    def _symbols(self) -> tuple[list[int], list[tuple[int, int, str]]]:
        if self._table is None:
            try:
                symbols = self._read()
            except (OSError, struct.error, ValueError):
                symbols = []
            symbols.sort()
            self._table = ([s[0] for s in symbols], symbols)
        return self._table

    def _identify(self) -> tuple[int, bytes]:
        """The file's size and ELF header: what says at a fault that it is
        still the file that was loaded (fstat, a path call to glibc, is one
        the sandbox refuses; lseek and pread are not)."""
        return os.lseek(self.fd, 0, os.SEEK_END), os.pread(self.fd, 64, 0)

    def _pread(self, length: int, offset: int) -> bytes:
        if length < 0 or offset < 0 or length > MAX_TABLE:
            raise ValueError("out of range")
        data = os.pread(self.fd, length, offset)
        if len(data) != length:
            raise ValueError("truncated")
        return data

    def _read(self) -> list[tuple[int, int, str]]:
        if self._identify() != self._identity:
            return []  # not the file that was loaded
        head = self._identity[1]
        if len(head) < EHDR.size:
            return []
        if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            return []
        fields = EHDR.unpack_from(head)
        shoff, shentsize, shnum = fields[6], fields[11], fields[12]
        if shentsize != _SHDR.size or not 0 < shnum <= 0xFFFF:
            return []
        table = self._pread(shnum * _SHDR.size, shoff)
        sections = [_SHDR.unpack_from(table, i * _SHDR.size) for i in range(shnum)]
        for sh_type, sh_offset, sh_size, sh_link, sh_entsize in (
            (s[1], s[4], s[5], s[6], s[9]) for s in sections
        ):
            if sh_type != _SHT_SYMTAB or sh_entsize != _SYM.size or sh_link >= shnum:
                continue
            strings = sections[sh_link]
            return self._parse(
                self._pread(sh_size - sh_size % _SYM.size, sh_offset),
                self._pread(strings[5], strings[4]),
            )
        return []

    @staticmethod
    def _parse(symtab: bytes, strtab: bytes) -> list[tuple[int, int, str]]:
        out = []
        for st_name, st_info, _, st_shndx, value, size in _SYM.iter_unpack(symtab):
            kind = st_info & 0xF
            if kind not in (_STT_NOTYPE, _STT_OBJECT, _STT_FUNC) or not st_name:
                continue
            if st_shndx == _SHN_UNDEF or st_shndx >= _SHN_LORESERVE or st_name >= len(strtab):
                continue
            end = strtab.find(b"\0", st_name, st_name + MAX_NAME)
            name = strtab[st_name : end if end >= 0 else st_name + MAX_NAME]
            text = name.decode("ascii", errors="replace")
            if not text.isprintable() or text.startswith(".L"):
                continue
            out.append((value, size, text))
        return out
