"""Running things: the offline model kit, the demo, local replica launchers."""
