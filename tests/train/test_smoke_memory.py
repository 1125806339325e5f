"""The memory check of a random-token step (`lmcore.train.smoke.run_steps`): a step that cannot
fit is refused before anything is allocated, naming its largest part."""

from __future__ import annotations

from lmcore.errors import ModelTooLargeError
from lmcore.train.smoke import run_steps
from tests.helpers.errors import raises_naming


def test_a_step_beyond_the_memory_is_refused_naming_the_largest_part() -> None:
    with raises_naming(
        ModelTooLargeError,
        "a step of batch 1,000,000,000,000 × seq 128",
        "the limit max_bytes=1,099,511,627,776 (1.00 TiB)",
        "the largest part is activations",
    ):
        run_steps("tinystories", batch=10**12, device="cpu", max_bytes=2**40)
