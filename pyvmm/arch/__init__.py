"""Architecture-specific boot state; everything else in pyvmm is portable."""
