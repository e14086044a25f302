"""What comes in, checked before anything is written: the manifest, the bundle on disk, the
LoRA weights, the binding to a pinned base, the base catalog, golden sets, target-module
matching, bounded JSON parsing and the digests that name content."""
