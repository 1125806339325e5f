"""What a model is given (`lmcore.model.inputs`): token ids and positions of the wrong type,
range, shape or device, and bad build options, each named with the value, where it is and what
is allowed, never a raw torch error; under `torch.compile` too."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from lmcore import ModelInputError, build_model
from lmcore.errors import BuildOptionError
from tests.helpers.errors import raises_naming


@pytest.fixture(scope="module")
def tiny():
    return build_model("cs336-tiny")


def test_float_ids_are_a_type_error(tiny) -> None:
    with raises_naming(TypeError, "token ids", "integer tensor", "torch.float32", "ids.long()"):
        tiny(torch.zeros(1, 4))


def test_out_of_range_ids_name_the_value_and_index(tiny) -> None:
    ids = torch.zeros(2, 4, dtype=torch.long)
    ids[1, 2] = 10000
    with raises_naming(
        ModelInputError,
        "token id 10000",
        "at index (1, 2)",
        "vocab_size=10000",
        "valid ids: 0..9999",
    ):
        tiny(ids)
    ids[1, 2] = -1
    with pytest.raises(ValueError, match=r"token id -1 at index \(1, 2\)"):
        tiny(ids)


def test_too_long_sequence(tiny) -> None:
    with raises_naming(
        ModelInputError,
        "sequence length 17",
        "context_length=16",
        "truncate to the last 16 tokens",
    ):
        tiny(torch.zeros(1, 17, dtype=torch.long))


def test_bad_positions(tiny) -> None:
    ids = torch.zeros(1, 4, dtype=torch.long)
    with raises_naming(
        ModelInputError, "token_positions", "0..15", "context_length=16", "min 14, max 17"
    ):
        tiny(ids, torch.arange(14, 18))
    with pytest.raises(
        ModelInputError, match=r"token_positions must be integers of shape \(..., 4\)"
    ):
        tiny(ids, torch.arange(3))


def test_non_tensor_and_scalar_ids(tiny) -> None:
    with pytest.raises(TypeError, match=r"token ids must be a torch.Tensor, got list"):
        tiny([1, 2, 3])
    with pytest.raises(ModelInputError, match=r"token ids need a sequence dimension"):
        tiny(torch.tensor(3))


def test_an_empty_batch_gives_empty_logits(tiny) -> None:
    assert tiny(torch.zeros(0, 8, dtype=torch.long)).shape == (0, 8, 10000)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.uint8, torch.int32])
def test_small_integer_ids_and_positions_give_the_int64_logits(tiny, dtype) -> None:
    ids = torch.randint(0, 100, (2, 8))
    expected = tiny(ids)
    torch.testing.assert_close(tiny(ids.to(dtype)), expected)  # uint8 is not read as a mask
    torch.testing.assert_close(tiny(ids, torch.arange(8, dtype=dtype)), expected)


# Each: the argument, what is wrong with it (the type, dtype, shape, layout or device given) and
# the fix the message suggests.
@pytest.mark.parametrize(
    "ids, positions, error, facts",
    [
        (torch.zeros(1, 4, dtype=torch.long), [0, 1, 2, 3], TypeError,
         ("token_positions", "torch.Tensor", "got list", "torch.tensor(...)")),
        (torch.zeros(1, 1, dtype=torch.long), torch.tensor(0), ModelInputError,
         ("token_positions", "integers of shape (..., 1)", "dtype torch.int64", "shape ()")),
        (torch.zeros(1, 4, dtype=torch.long), torch.zeros(4, dtype=torch.complex64), TypeError,
         ("token_positions", "integer tensor", "torch.complex64", "token_positions.long()")),
        (torch.zeros(1, 4, dtype=torch.complex64), None, TypeError,
         ("token ids", "integer tensor", "torch.complex64", "ids.long()")),
        (torch.zeros(1, 4, dtype=torch.long).to_sparse(), None, TypeError,
         ("token ids", "dense tensor", "torch.sparse_coo", "ids.to_dense()")),
        (torch.zeros(1, 4, dtype=torch.long, device="meta"), None, ModelInputError,
         ("token ids", "on meta", "model is on cpu", "ids.to('cpu')")),
        (torch.zeros(1, 4, dtype=torch.long), torch.arange(4, device="meta"), ModelInputError,
         ("token_positions", "on meta", "model is on cpu", "token_positions.to('cpu')")),
    ],
    ids=["positions-list", "positions-0d", "positions-complex", "ids-complex", "ids-sparse",
         "ids-on-meta", "positions-on-meta"],
)  # fmt: skip
def test_bad_input_is_named_not_a_raw_torch_error(tiny, ids, positions, error, facts) -> None:
    with raises_naming(error, *facts):
        tiny(ids, positions)


@pytest.mark.parametrize(
    "options, facts",
    [
        ({"dtype": torch.int64}, ("dtype torch.int64", "cannot hold trainable weights", "floating-point dtype")),
        ({"dtype": torch.complex64}, ("dtype torch.complex64", "cannot hold trainable weights")),
        ({"dtype": "float32"}, ("dtype 'float32'", "cannot hold trainable weights")),
        ({"device": "bogus"}, ("unknown device 'bogus'", "cpu, meta, cuda or cuda:N")),
        ({"device": 3.5}, ("unknown device 3.5",)),
    ],
)  # fmt: skip
def test_bad_build_options_are_named(options: dict, facts: tuple[str, ...]) -> None:
    with raises_naming(BuildOptionError, *facts):
        build_model("cs336-tiny", **options)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_is_named() -> None:
    with raises_naming(BuildOptionError, "device 'cuda'", "CUDA is not available"):
        build_model("cs336-tiny", device="cuda")


# ------------------------------------------------------------------ compiled value checks


@pytest.mark.parametrize("backend", ["eager"])  # the check is an opaque operator: inductor below
def test_a_compiled_model_checks_ids_and_positions_too(backend: str) -> None:
    torch.manual_seed(0)
    model = build_model("cs336-tiny")
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    ids = torch.randint(0, 10000, (2, 8))
    torch.testing.assert_close(compiled(ids), model(ids))
    for bad in (-1, 10_000):
        wrong = ids.clone()
        wrong[1, 3] = bad
        with raises_naming(
            ModelInputError, f"token id {bad}", "at index (1, 3)", "vocab_size=10000"
        ):
            compiled(wrong)  # was: id -1 silently gave the logits of id 9999
    with raises_naming(
        ModelInputError, "token_positions", "0..15", "context_length=16", "min 10, max 17"
    ):
        compiled(ids, torch.arange(10, 18))


@pytest.mark.slow
def test_inductor_does_not_abort_on_an_id_past_the_table() -> None:
    """With inductor on the CPU, id 10,000 used to abort the process (exit 134); a subprocess
    keeps that from taking the test run down if it ever comes back."""
    code = textwrap.dedent("""
        import torch, lmcore
        model = lmcore.build_model("cs336-tiny, num_layers=1")
        ids = torch.zeros(1, 4, dtype=torch.long)
        ids[0, 2] = 10_000
        try:
            torch.compile(model, backend="inductor")(ids)
        except lmcore.ModelInputError as e:
            print(e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == (
        "token id 10000 at index (0, 2) is out of range for vocab_size=10000 (valid ids: 0..9999)"
    )
