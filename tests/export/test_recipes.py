"""The recipes in export/ load, and flags override them."""

from __future__ import annotations

from pathlib import Path

import pytest

from deamoe_trt import UsageError
from deamoe_trt.export.recipe import Recipe, load_recipe, parse_layers

RECIPES = sorted((Path(__file__).resolve().parents[2] / "export-recipes").glob("*.toml"))


def test_the_repository_has_recipes_for_each_form_and_the_required_dtypes():
    recipes = [load_recipe(p) for p in RECIPES]
    assert {r.form for r in recipes} == {"plugin", "ort", "onnx"}
    assert {"fp32", "fp16"} <= {r.dtype for r in recipes}
    names = {p.stem for p in RECIPES}
    assert {"tiny-ort", "tiny-plugin", "qwen3-plugin-fp16"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_each_recipe_is_complete_and_valid(path):
    recipe = load_recipe(path)
    assert recipe.form and recipe.dtype and recipe.description
    assert recipe.max_tokens >= 1


def test_flags_override_recipe_values(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('form = "ort"\ndtype = "fp16"\nlayers = [0, 2]\n')
    recipe = load_recipe(path).overridden(form="onnx", dtype=None, opset=18)
    assert recipe == Recipe(form="onnx", dtype="fp16", opset=18, layers=(0, 2))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('form = "tensorrt"', "unknown form 'tensorrt'"),
        ('form = "ort"\ndtype = "bf16"', "the ort form does not support bf16"),
        ('form = "ort"\ncolour = "red"', "unknown key(s) colour"),
        ('form = "ort"\nopset = "17"', "opset must be an integer"),
        ('form = "ort"\nopset = 3', "opset must be an integer from 17"),
        ('form = "ort"\nlayers = []', "layers must be"),
        ("form = ", "not valid TOML"),
    ],
)
def test_bad_recipes_are_one_line_usage_errors(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text + "\n")
    with pytest.raises(UsageError) as info:
        load_recipe(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_layers_accept_all_a_list_or_a_comma_string():
    assert parse_layers("all") is None
    assert parse_layers([1, 0]) == (1, 0)
    assert parse_layers("0,3") == (0, 3)
    with pytest.raises(UsageError, match="repeat"):
        parse_layers([1, 1])
