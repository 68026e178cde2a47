"""ferryctl: Ferry's command line for scripts and humans, a client of the REST API (/api/v1/).

It imports nothing of Ferry's own packages: everything it knows comes over HTTP."""
