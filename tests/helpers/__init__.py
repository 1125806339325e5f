"""Plain helpers and constants the tests import, one module per area: `errors` (`raises_naming`),
`plugins`, `kit`, `models` (`TINY_SPEC`, `SMALL_SPEC`, checkpoints), `hf`, `gguf`, `runs` (data,
training, evaluation, the command line), `net` (closed and silent ports, a small HTTP server),
`memory` (a fresh process's own peak memory). Fixtures live in the conftest.py of the directory
that needs them; what is here is imported: `from tests.helpers.models import TINY_SPEC`.
"""
