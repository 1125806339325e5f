"""The pytest plugin: off by default it adds and loads nothing; -k and -m select among the
generated tests; selection flags need the switch; the header, the backend from the ini file,
and a failure report that leads with the broken contract."""

from __future__ import annotations

import pytest

from tests.helpers.kit import NODE, QUIET, PlantedRegistry, run_kit

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.usefixtures("kit_warmed_up")


def test_k_and_m_select_among_generated_tests(pytester: pytest.Pytester) -> None:
    outcomes = run_kit(pytester, "-k", "forward and good-attn and bfloat16")
    assert list(outcomes) == [NODE + "test_forward[attn:good-attn-bfloat16]"]
    pytester.makepyfile(test_mine="def test_mine(): pass")
    result = pytester.runpytest(
        *QUIET, "--lmcore-conformance", "-m", "not lmcore_conformance", plugins=[PlantedRegistry()]
    )
    counts = result.parseoutcomes()
    assert counts["passed"] == 1 and counts["deselected"] > 100, counts


@pytest.mark.parametrize(
    "flag", ["--lmcore-kind=norm", "--lmcore-component=rmsnorm", "--lmcore-compile-backend=eager"]
)
def test_selection_flags_without_the_switch_are_a_usage_error(
    pytester: pytest.Pytester, flag: str
) -> None:
    result = pytester.runpytest(*QUIET, flag)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"*{flag.split('=')[0]} * has no effect without --lmcore-conformance; add --lmcore-conformance*"
        ]
    )


def test_off_by_default_it_adds_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mine="def test_mine(): pass")
    result = pytester.runpytest(*QUIET, plugins=[PlantedRegistry()])
    result.assert_outcomes(passed=1)
    assert "lmcore conformance" not in result.stdout.str()


def test_off_by_default_it_loads_neither_the_checks_nor_any_plugin(
    pytester: pytest.Pytester,
) -> None:
    """In a fresh process: the pytest11 plugin is loaded, yet no check module and no lmcore plugin
    is imported unless --lmcore-conformance is given (what it costs is importing lmcore itself)."""
    pytester.makepyfile(
        test_probe="""
        import sys
        def test_probe(pytestconfig):
            assert pytestconfig.pluginmanager.has_plugin("lmcore")
            loaded = sorted(m for m in sys.modules if m.startswith(("lmcore.testing.", "lmcore_")))
            assert loaded == ["lmcore.testing.hooks", "lmcore.testing.plugin"], loaded
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_header_names_the_selection_and_backend(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(
        *QUIET, "--lmcore-conformance", "--lmcore-kind", "norm", "--lmcore-compile-backend", "eager", "--co",
        plugins=[PlantedRegistry()],
    )  # fmt: skip
    result.stdout.fnmatch_lines(
        ["lmcore conformance: kinds norm; components all; compile backend eager"]
    )


def test_the_backend_can_come_from_the_ini_file(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nlmcore_compile_backend = aot_eager\n")
    result = pytester.runpytest(*QUIET, "--lmcore-conformance", "--co", plugins=[PlantedRegistry()])
    result.stdout.fnmatch_lines(["*compile backend aot_eager"])


def test_failure_report_leads_with_the_broken_contract(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(
        *QUIET, "--lmcore-conformance", "--lmcore-compile-backend", "eager", "--lmcore-component", "wrong-dtype",
        plugins=[PlantedRegistry()],
    )  # fmt: skip
    result.assert_outcomes(failed=1, passed=10, skipped=3)  # activations, cache, coordinates
    result.stdout.fnmatch_lines([
        "*_ lmcore-conformance::test_forward[[]norm:wrong-dtype-bfloat16[]] _*",
        "the output is shape (2, 3, 8, 64) float32 for bfloat16 input; return the input's dtype*",
        "  contract:  Outputs keep the input's shape and dtype and are finite on random input.",
        "  component: norm 'wrong-dtype' from registered in-process (plugin 'planted', module *)",
        "FAILED lmcore-conformance::test_forward[[]norm:wrong-dtype-bfloat16[]]*",
    ])  # fmt: skip
