"""The Megatron-LM plugin's checks and its missing-package error."""

from __future__ import annotations

import pytest

from overdrive import Accelerator, MegatronLMPlugin


def test_megatron_plugin_checks():
    plugin = MegatronLMPlugin(tp_degree=0, pp_degree=2, sequence_parallelism=True, lr_decay_style="step",
                              gradient_clipping=-1, custom_model_provider_function="model")
    problems = plugin.problems(world_size=6)
    text = "\n".join(problems)
    assert "tp_degree=0 is not valid; it must be an integer >= 1" in text
    assert "sequence_parallelism=True splits activations across the tensor-parallel group, which needs tp_degree > 1" in text
    assert "lr_decay_style='step' is not valid" in text and "gradient_clipping=-1 is not valid" in text
    assert "custom_model_provider_function='model' is not callable" in text
    assert MegatronLMPlugin(tp_degree=2, pp_degree=2).problems(world_size=6) == [
        "tp_degree x pp_degree = 2 x 2 = 4 does not divide the 6 processes; the data-parallel degree is the "
        "processes divided by that product"]
    assert MegatronLMPlugin(tp_degree=2, pp_degree=2, sequence_parallelism=True, num_micro_batches=4).problems(8) == []


def test_missing_megatron_core_is_named(monkeypatch):
    monkeypatch.setattr("overdrive.resolve.megatron.megatron_core_problem",
                        lambda: "MegatronLMPlugin needs the 'megatron-core' package (pip install megatron-core)")
    with pytest.raises(ValueError) as info:
        Accelerator(megatron_lm_plugin=MegatronLMPlugin(tp_degree=2, pp_degree=1))
    assert "megatron_lm_plugin: MegatronLMPlugin needs the 'megatron-core' package" in str(info.value)
