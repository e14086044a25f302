"""What comes in, checked before anything is written: the manifest, the bundle on disk, the
LoRA weights, the binding to a pinned base, the base catalog, golden sets, target-module
matching and bounded JSON parsing. The digests that name content are ``registry/digests.py``,
at the top, where every room reaches them without an arrow into intake."""
