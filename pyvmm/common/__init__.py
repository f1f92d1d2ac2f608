"""What every layer shares: errors, the log, the trace, sizes, fd ownership."""
