"""Test session setup: generated kernels go to a private cache folder."""
import os
import tempfile

os.environ.setdefault("FLEXSN_DSL_CACHE", tempfile.mkdtemp(prefix="flexsn-dsl-test-cache-"))
