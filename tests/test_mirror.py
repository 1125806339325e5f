"""The tests mirror the tree: every test file is named after the module it tests, in the
directory that mirrors the module's, so the tree cannot drift.

    lmcore/model/generate.py   -> tests/model/test_generate.py
    lmcore/spec.py             -> tests/test_spec.py
    plugins/lmcore_rope.py     -> tests/plugins/test_lmcore_rope.py
    benchmarks/speed.py        -> tests/benchmarks/test_speed.py

A module with many tests may have several files, `test_<module>_<aspect>.py`
(`tests/model/test_attention_backward.py`). The project-wide tests below are the only others.
Every test directory is a package (an `__init__.py`), so basenames may repeat across it.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Test files that test the project as a whole, not one module: why each one is here.
PROJECT_WIDE = {
    "test_layout.py": "the rooms, their floors and the imports between them",
    "test_docs.py": "the manual and the README against the code",
    "test_from_scratch.py": "the CS336 reference tests through lmcore's public names",
    "test_packaging.py": "the wheel and what it ships",
    "test_mirror.py": "this file: the tests mirror the tree",
    "test_helpers.py": "tests/helpers/errors.py, the fact checks the other tests lean on",
}
# A test directory's first part, where it is not a directory of lmcore/: what it mirrors.
ROOTS = {"plugins": "plugins", "benchmarks": "benchmarks"}


def mirrored(test: Path) -> Path:
    """The directory, relative to the checkout, whose modules `test` (relative to tests/) tests."""
    parts = test.parent.parts
    if parts and parts[0] in ROOTS:
        return Path(ROOTS[parts[0]], *parts[1:])
    return Path("lmcore", *parts)


def misnamed(root: Path) -> list[str]:
    """Each test file under `root`/tests that mirrors no module, with the reason."""
    tests = root / "tests"
    problems = []
    for path in sorted(tests.rglob("test_*.py")):
        test = path.relative_to(tests)
        shown = f"tests/{test.as_posix()}"
        for directory in [tests, *(tests / p for p in _parents(test))]:
            if not (directory / "__init__.py").is_file():
                rel = directory.relative_to(root).as_posix()
                problems.append(f"{shown}: {rel}/ has no __init__.py")
                break
        if len(test.parts) == 1 and test.name in PROJECT_WIDE:
            continue
        where = mirrored(test)
        if not (root / where).is_dir():
            problems.append(
                f"{shown}: tests/{test.parent.as_posix()}/ mirrors {where}/, no such directory"
            )
            continue
        stems = sorted(p.stem for p in (root / where).glob("*.py") if p.name != "__init__.py")
        name = path.stem.removeprefix("test_")
        if not any(name == stem or name.startswith(f"{stem}_") for stem in stems):
            problems.append(
                f"{shown}: {where}/ has no module {name}.py (a test file is test_<module>.py or "
                f"test_<module>_<aspect>.py; its modules: {', '.join(stems)})"
            )
    return problems


def _parents(test: Path) -> list[Path]:
    """tests/a/b/test_x.py -> [a, a/b]."""
    return [Path(*test.parent.parts[: i + 1]) for i in range(len(test.parent.parts))]


def test_every_test_file_mirrors_a_module() -> None:
    problems = misnamed(ROOT)
    assert not problems, "test files that mirror no module:\n" + "\n".join(problems)


def test_a_misnamed_test_file_is_caught(tmp_path: Path) -> None:
    def write(*paths: str) -> None:
        for rel in paths:
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_text("")

    write(
        "lmcore/__init__.py", "lmcore/spec.py", "lmcore/model/__init__.py",
        "lmcore/model/generate.py", "lmcore/train/launch/ray.py", "plugins/lmcore_rope.py",
        "benchmarks/speed.py",
        "tests/__init__.py", "tests/test_spec.py", "tests/test_layout.py",
        "tests/model/__init__.py", "tests/model/test_generate.py",
        "tests/model/test_generate_cache.py", "tests/train/__init__.py",
        "tests/train/launch/__init__.py", "tests/train/launch/test_ray.py",
        "tests/plugins/__init__.py", "tests/plugins/test_lmcore_rope.py",
        "tests/benchmarks/__init__.py", "tests/benchmarks/test_speed.py",
        "tests/model/helpers.py", "tests/model/conftest.py",
    )  # fmt: skip
    assert misnamed(tmp_path) == []
    write(
        "tests/test_specs.py",  # no module specs (spec_s would be an aspect: test_spec_s.py)
        "tests/model/test_generation.py",  # no lmcore/model/generation.py
        "tests/plugins/test_rope.py",  # the module is lmcore_rope
        "tests/nowhere/__init__.py", "tests/nowhere/test_x.py",  # no lmcore/nowhere/
        "tests/test_init.py",  # __init__.py is not a module to mirror
        "lmcore/cli/train.py", "tests/cli/test_train.py",  # tests/cli/ is not a package
    )  # fmt: skip
    found = misnamed(tmp_path)
    assert [line.split(":")[0] for line in found] == [
        "tests/cli/test_train.py",
        "tests/model/test_generation.py",
        "tests/nowhere/test_x.py",
        "tests/plugins/test_rope.py",
        "tests/test_init.py",
        "tests/test_specs.py",
    ]
    assert "tests/cli/ has no __init__.py" in found[0]
    assert "lmcore/model/ has no module generation.py" in found[1]
    assert "its modules: generate" in found[1]
    assert "mirrors lmcore/nowhere/, no such directory" in found[2]
    assert "plugins/ has no module rope.py" in found[3]
