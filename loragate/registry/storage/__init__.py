"""Bytes at rest: the content-addressed artifact store (local directory or S3), scratch
space that crashed writers leave behind, bundle signatures, and the resolver index files
replicas read."""
