"""Which checks run on which components: ids that name the check, the component and the
variant; boolean arguments checked flipped; selection by kind and by dist:name, and its errors;
the Python API, which runs a case without pytest or refuses one pytest would skip."""

from __future__ import annotations

import re

import pytest
import torch

from tests.helpers.errors import assert_naming, raises_naming
from tests.helpers.kit import NODE, QUIET, Norm, PlantedRegistry, norm, run_kit

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.usefixtures("kit_warmed_up")


def test_ids_name_the_check_the_component_and_the_variant(pytester: pytest.Pytester) -> None:
    outcomes = run_kit(pytester, "--lmcore-component", "good-norm")
    assert sorted(outcomes) == [
        NODE + f"test_{t}[norm:good-norm{v}]"
        for t, v in sorted([
            ("activations", ""), ("build", ""), ("cache", ""), ("compile", ""),
            ("coordinates", ""), ("flops", ""),
            ("forward", "-bfloat16"),
            ("forward", "-float32"), ("gradients", ""), ("meta", ""), ("params", ""),
            ("per_token", ""), ("roles", ""), ("state_dict", ""),
        ])
    ]  # fmt: skip


def test_a_boolean_argument_is_also_checked_flipped(pytester: pytest.Pytester) -> None:
    outcomes = run_kit(pytester, "--lmcore-component", "bool-arg")
    assert outcomes[NODE + "test_params[ffn:bool-arg(gated=false)]"] == "passed"
    assert outcomes[NODE + "test_params[ffn:bool-arg]"].startswith(
        "declares params(d_model=64, gated=True) = 65"
    )
    assert NODE + "test_compile[ffn:bool-arg(gated=false)]" not in outcomes  # defaults only


def test_a_required_argument_without_default_skips_with_the_reason(
    pytester: pytest.Pytester,
) -> None:
    result = pytester.runpytest(
        *QUIET, "--lmcore-conformance", "--lmcore-component", "needs-arg", "-rs",
        plugins=[PlantedRegistry()],
    )  # fmt: skip
    result.assert_outcomes(skipped=14)
    result.stdout.fnmatch_lines(
        [
            "*norm:needs-arg has required argument(s) unused with no default; the conformance kit builds components from their declared defaults*"
        ]
    )


def test_kind_selects(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(
        *QUIET,
        "--lmcore-conformance",
        "--lmcore-kind",
        "pos",
        "--collect-only",
        "-q",
        plugins=[PlantedRegistry()],
    )
    names = {line for line in result.outlines if line.startswith(NODE)}
    assert names and all("[pos:" in n for n in names)
    targets = {re.sub(r"-(float32|bfloat16)$", "", n.split("[")[1].rstrip("]")) for n in names}
    assert targets == {"pos:good-rotary", "pos:quadratic", "pos:undeclared-bias"}


def test_dist_qualified_selection_and_ambiguous_names(pytester: pytest.Pytester) -> None:
    plugin = PlantedRegistry(norm("twin", Norm))
    plugin.registry.add(norm("twin", Norm), name="other")
    outcomes = run_kit(pytester, "--lmcore-component", "other:twin", "-k", "params", plugin=plugin)
    assert outcomes == {NODE + "test_params[norm:other:twin]": "passed"}
    both = run_kit(pytester, "--lmcore-component", "twin", "-k", "params", plugin=plugin)
    assert set(both) == {
        NODE + "test_params[norm:planted:twin]",
        NODE + "test_params[norm:other:twin]",
    }


@pytest.mark.parametrize(
    "args, facts",
    [
        (
            ["--lmcore-kind", "nrom"],
            ("--lmcore-kind 'nrom' is not a component kind", "(did you mean 'norm'?)",
             "kinds are adapter, attn, block, ffn, mixer, norm, optimizer, parametrization, pos, quant, schedule"),
        ),
        (
            ["--lmcore-component", "leaki"],
            ("--lmcore-component 'leaki' matches no registered component", "(did you mean 'leaky'?)",
             re.compile(r"registered: .*planted:leaky"), "(`lmcore plugins` lists them"),
        ),
        (
            ["--lmcore-component", "elsewhere:leaky"],
            ("--lmcore-component 'elsewhere:leaky' matches no registered component",
             re.compile(r"registered: .*planted:leaky")),
        ),
        (
            ["--lmcore-kind", "attn", "--lmcore-component", "good-norm"],
            ("'good-norm' matches no registered component of kind attn",),
        ),
    ],
)  # fmt: skip
def test_a_selection_that_matches_nothing_is_a_usage_error(
    pytester: pytest.Pytester, args: list[str], facts: tuple[str | re.Pattern[str], ...]
) -> None:
    result = pytester.runpytest(*QUIET, "--lmcore-conformance", *args, plugins=[PlantedRegistry()])
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert_naming(result.stderr.str(), *facts)


def test_the_python_api_runs_a_case_without_pytest() -> None:
    from lmcore.testing import ConformanceError, cases

    registry = PlantedRegistry().registry
    [case] = [c for c in cases(registry, components=["miscounted"]) if c.check.name == "params"]
    assert case.name == "test_params[norm:miscounted]"
    state = torch.random.get_rng_state()
    with pytest.raises(ConformanceError, match=r"declares params\(d_model=64\) = 65"):
        case.run()
    assert torch.equal(torch.random.get_rng_state(), state), (
        "a case must not disturb the caller's RNG"
    )


def test_running_a_case_pytest_would_skip_raises_case_skipped_with_the_reason() -> None:
    """`Case.run` used to build the component anyway and crash with a TypeError."""
    from lmcore.testing import CaseSkipped, cases

    found = cases(PlantedRegistry().registry, components=["needs-arg"])
    assert found and all(case.skip_reason for case in found)
    for case in found:
        with raises_naming(
            CaseSkipped,
            re.compile(r"^test_\w+\[norm:needs-arg[^\]]*\] cannot run: "),
            "norm:needs-arg has required argument(s) unused with no default",
            re.compile(r"the conformance kit builds components from their declared defaults$"),
        ) as caught:
            case.run()
        assert caught.value.reason == case.skip_reason
