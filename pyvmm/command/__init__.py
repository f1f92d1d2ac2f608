"""The pyvmm command: its entry point, options, man page and one-line errors."""
