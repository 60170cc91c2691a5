"""The catalog: knob names a shell reads as variable names, numbers only in the forms it documents,
bounds that are finite numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from knobkeeper.errors import UserError
from knobkeeper.knobs.catalog import load_catalog

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"


def test_catalog_knob_names_must_be_shell_variable_names(project):
    with open(project.catalog_path, "a") as handle:
        handle.write('\n[knobs."X;touch /tmp/p;Y"]\ntype = "int"\nroles = ["decode"]\nrisk = "perf"\n'
                     'source = "x"\nunset = "x"\ndoc = "x"\n')
    with pytest.raises(UserError, match=r"catalog.toml: .*'X;touch /tmp/p;Y' is not a valid variable name"):
        load_catalog(project.catalog_path)


@pytest.mark.parametrize("name,raw", [
    (KNOB, "1_000"), (KNOB, "0x10"), (KNOB, "\u0661\u0662\u0663"), (KNOB, "5e2"), (KNOB, "9" * 5000),
    ("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "1_0.5"), ("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "inf"),
    ("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "\u0662.5"), ("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "1e400"),
])
def test_numbers_are_what_the_catalog_documents_only(name, raw):
    catalog = load_catalog(Path(__file__).parent.parent / "inventory" / "catalog.toml")
    with pytest.raises(UserError, match="expected"):
        catalog.get(name).parse(raw)


def test_documented_number_forms_still_parse():
    catalog = load_catalog(Path(__file__).parent.parent / "inventory" / "catalog.toml")
    assert catalog.get(KNOB).parse(" +512 ") == 512
    interval = catalog.get("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL")
    assert interval.parse("2.5") == 2.5 and interval.parse("25e-1") == 2.5 and interval.parse(".5") == 0.5


@pytest.mark.parametrize("bound", ["min", "max"])
def test_a_catalog_bound_of_nan_fails_validation(project, bound):
    text = project.catalog_path.read_text().replace("min = 1\nmax = 8192\n", f"{bound} = nan\n", 1)
    assert "nan" in text
    project.catalog_path.write_text(text)
    with pytest.raises(UserError, match=rf"knobs\.{KNOB}\.{bound}: expected a finite number"):
        load_catalog(project.catalog_path)
