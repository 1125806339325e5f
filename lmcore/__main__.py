"""`python -m lmcore` (and `torchrun ... -m lmcore`): the `lmcore` console script."""

import os
import sys
from collections.abc import Callable

from lmcore.cli.main import main

if __name__ == "__main__":
    run: Callable[[], int | None] = main
    if "TORCHELASTIC_ERROR_FILE" in os.environ:  # under torchrun: its failure summary shows
        from torch.distributed.elastic.multiprocessing.errors import record  # the traceback

        run = record(main)
    sys.exit(run())
