"""transformers' own common model tests (``ModelTesterMixin`` of the installed version's source
distribution, fetched from the package index) run against MCSD and the Transformer: every test
that runs passes but those listed in :data:`DOES_NOT_APPLY`, each with why (docs/hugging_face.md
lists them too). Skipped where the package index cannot be reached."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import transformers

from helpers.models import tiny_config

pytestmark = pytest.mark.slow

CASES = {"MCSDFull": "mcsd/full", "Transformer": "transformer/default"}
GRADIENT_CHECKPOINTING_LAYER = ("asserts layers of transformers' GradientCheckpointingLayer class; the project's layers "
                                "checkpoint themselves (Layer.activation_checkpointing), with the same gradients "
                                "(tests/hf/test_hf.py)")
DOES_NOT_APPLY = {
    "test_generation_tester_mixin_inheritance": "GenerationTesterMixin is in transformers' tests/generation/, which its "
                                                "source distribution leaves out: the tester cannot inherit it",
    "test_gradient_checkpointing_enable_disable": GRADIENT_CHECKPOINTING_LAYER,
    "test_training_gradient_checkpointing": GRADIENT_CHECKPOINTING_LAYER,
    "test_training_gradient_checkpointing_use_reentrant_true": GRADIENT_CHECKPOINTING_LAYER,
    "test_training_gradient_checkpointing_use_reentrant_false": GRADIENT_CHECKPOINTING_LAYER,
}
# Modules test_modeling_common.py imports that the source distribution leaves out: their mixins, empty.
ABSENT = {"exporters/test_export.py": "class ExportTesterMixin:\n    pass\n",
          "generation/test_utils.py": "class GenerationTesterMixin:\n    pass\n"}

TESTER = '''
import unittest

import torch
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

from mcsd.hf import MCSDHFConfig, MCSDHFForCausalLM, MCSDHFModel
from .test_modeling_common import ModelTesterMixin, ids_tensor

# As an in-library model is listed: the common tests tell a base model (no loss) and a causal LM by these.
MODEL_MAPPING_NAMES["mcsd"] = "MCSDHFModel"
MODEL_FOR_CAUSAL_LM_MAPPING_NAMES["mcsd"] = "MCSDHFForCausalLM"
NODES = {nodes}


class MCSDModelTester:
    def __init__(self, parent, node):
        self.parent, self.node = parent, node
        self.batch_size, self.seq_length, self.vocab_size, self.is_training = 2, 7, node["vocab_size"], True
        config = self.get_config()
        self.hidden_size, self.num_hidden_layers = config.hidden_size, config.num_hidden_layers
        self.num_attention_heads = config.num_attention_heads

    def get_config(self):
        return MCSDHFConfig(mcsd_model=dict(self.node), bos_token_id=0, eos_token_id=0, pad_token_id=0)

    def prepare_config_and_inputs_for_common(self):
        ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        return self.get_config(), {{"input_ids": ids, "attention_mask": torch.ones_like(ids)}}


def model_test(name):
    class Test(ModelTesterMixin, unittest.TestCase):
        all_model_classes = (MCSDHFModel, MCSDHFForCausalLM)
        has_attentions = False  # no attention weights (output_attentions is refused)

        def setUp(self):
            self.model_tester = MCSDModelTester(self, NODES[name])

    Test.__name__ = Test.__qualname__ = f"{{name}}Test"
    return Test


{classes}
'''


def common_tests(cache: Path) -> Path:
    """``test_modeling_common.py`` of the installed transformers' source distribution (downloaded
    once into ``cache``); the test is skipped where the package index cannot be reached."""
    version = transformers.__version__
    found = cache / f"transformers-{version}" / "tests" / "test_modeling_common.py"
    if found.exists():
        return found
    cache.mkdir(parents=True, exist_ok=True)
    download = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                               "--no-build-isolation", f"transformers=={version}", "-d", str(cache)],
                              capture_output=True, text=True, timeout=600)
    archive = cache / f"transformers-{version}.tar.gz"
    if download.returncode != 0 or not archive.exists():
        pytest.skip(f"transformers {version}'s source distribution could not be fetched: {download.stderr[-300:]}")
    with tarfile.open(archive) as tar:
        tar.extract(f"transformers-{version}/tests/test_modeling_common.py", cache, filter="data")
    return found


def test_transformers_common_model_tests_pass_but_those_that_do_not_apply(tmp_path: Path,
                                                                          request: pytest.FixtureRequest) -> None:
    source = common_tests(Path(request.config.cache.mkdir("transformers-sdist")))
    package = tmp_path / "transformers_tests"
    for folder in (package, package / "exporters", package / "generation"):
        folder.mkdir()
        (folder / "__init__.py").write_text("")
    (package / "test_modeling_common.py").write_text(source.read_text())
    for path, text in ABSENT.items():
        (package / path).write_text(text)
    nodes = {name: tiny_config(case, vocab_size=99) for name, case in CASES.items()}
    classes = "\n".join(f"{name}Test = model_test({name!r})" for name in CASES)
    (package / "test_mcsd_common.py").write_text(TESTER.format(nodes=json.dumps(nodes), classes=classes))
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                             "-rfE", "transformers_tests/test_mcsd_common.py"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=1200)
    failed = set(re.findall(r"^(?:SUB)?FAILED(?:\[[^\]]*\])? \S+::(\w+)Test::(\w+)", result.stdout, re.M))
    passed = re.search(r"(\d+) passed", result.stdout)
    assert passed and int(passed.group(1)) > 100, result.stdout[-3000:]
    assert failed == {(name, test) for name in CASES for test in DOES_NOT_APPLY}, result.stdout[-5000:]
