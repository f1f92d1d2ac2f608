"""Host-side device backends: what a guest's manifest devices are attached to."""
