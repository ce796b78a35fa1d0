"""Where the package finds its checkout and its own import root (deamoe_trt.checkout)."""

from __future__ import annotations

import json
from pathlib import Path

from deamoe_trt import checkout

REPO = Path(__file__).resolve().parents[1]


def test_an_editable_install_record_names_its_folder():
    record = {"url": "file:///work/some%20checkout", "dir_info": {"editable": True}}
    assert checkout.editable_folder(json.dumps(record)) == Path("/work/some checkout")


def test_records_that_are_not_a_local_editable_install_name_no_folder():
    assert checkout.editable_folder(json.dumps({"url": "file:///x", "dir_info": {}})) is None
    assert checkout.editable_folder(json.dumps({"url": "https://x/y.whl", "archive_info": {}})) is None
    assert checkout.editable_folder(json.dumps({"url": "git+https://x", "dir_info": {"editable": True}})) is None
    assert checkout.editable_folder(None) is None
    assert checkout.editable_folder("not json") is None


def test_the_environment_variable_names_the_checkout(tmp_path, monkeypatch):
    monkeypatch.setenv(checkout.ENV_VAR, str(tmp_path))
    assert checkout.checkout_root() == tmp_path.resolve()


def test_the_test_environment_is_an_editable_install_of_this_repository(monkeypatch):
    # scripts/setup.sh installs the package with `pip install -e .` from this checkout.
    monkeypatch.delenv(checkout.ENV_VAR, raising=False)
    assert checkout.checkout_root() == REPO


def test_the_import_root_holds_the_package_this_process_imports():
    import deamoe_trt

    assert (checkout.import_root() / "deamoe_trt" / "__init__.py").resolve() == Path(deamoe_trt.__file__).resolve()
