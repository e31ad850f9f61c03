"""The shared working tree on disk: safe file primitives, the disk record, and bringing the disk to the head."""
