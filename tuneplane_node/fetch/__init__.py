"""The node's HTTP clients for what a tenant names, below the job wings that use them: a
volume's download (fetching.py: aiohttp's client, its errors translated there), an OCI
registry's manifests and blobs for a volume (ociregistry.py), what an image registry
says of an image (registry.py)."""
