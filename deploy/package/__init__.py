"""The package container: one library for writing, reading, signing, verifying and unpacking."""
