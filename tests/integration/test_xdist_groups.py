"""The test suites' work units on xdist workers (tests/conftest.py `group`): a file's tests together,
the two SLURM files together (one cluster), and each doc's lines of the docs test together (they run
in order in one scratch clone: split over two workers, each would run the doc's earlier lines again)."""

from __future__ import annotations

from conftest import group
from test_readme import ALL


def test_a_file_is_one_unit_and_the_slurm_files_are_one():
    assert (
        group("tests/unit/test_x.py::test_y[a-b]")
        == group("tests/unit/test_x.py::test_z")
        == "tests/unit/test_x.py"
    )
    assert (
        group("tests/slow/test_slurm.py::test_a")
        == group("tests/slow/test_slurm_multinode.py::test_b")
        == "slurm"
    )
    readme = "tests/integration/test_readme.py"
    assert group(f"{readme}::test_ci_runs_the_readme_commands") == readme


def test_each_doc_line_falls_in_its_docs_unit():
    """Every line's real test id (as pytest builds it from Line.id) maps to its doc's unit."""
    assert {line.doc for line in ALL} >= {"README.md", "docs/extending.md"}
    for line in ALL:
        assert (
            group(f"tests/integration/test_readme.py::test_doc_line_runs[{line.id}]") == f"docs:{line.doc}"
        ), line.id
