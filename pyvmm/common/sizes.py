"""Sizes and limits that several parts of pyvmm must agree on."""

PAGE_SIZE = 4096
MIB = 1 << 20
#: Guest memory comes in 2 MiB steps (solo5-hvt rounds --mem down to it);
#: the rings pyvmm adds at the top of memory take whole steps too.
MEM_GRANULE = 2 * MIB
#: The hvt ABI's boot page tables map 4 GiB: guest memory ends below.
GUEST_MEMORY_LIMIT = 4096 * MIB
