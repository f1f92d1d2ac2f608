"""Network devices: the tap backend on the host side of every guest NIC."""
