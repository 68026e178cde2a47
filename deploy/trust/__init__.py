"""Ferry's trust model: who signs what (packages, assignments, certificates), and what a device accepts."""
