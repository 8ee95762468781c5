"""The torch.compile backend names are one list (``DynamoBackend``): the plugin, the launch config file,
``ACCELERATE_DYNAMO_BACKEND`` and the CLI accept and refuse the same names."""

from __future__ import annotations

import pytest

from overdrive import TorchDynamoPlugin
from overdrive.config.compile import DYNAMO_BACKENDS
from overdrive.launchers.accelerate_variables import settings_from_environment
from overdrive.launchers.config_file import ConfigError, validate_config
from overdrive.utils import DynamoBackend


def test_every_entry_point_accepts_each_backend_name() -> None:
    assert DYNAMO_BACKENDS == tuple(name.lower() for name in DynamoBackend.list())
    assert "torchxla_trace_once" in DYNAMO_BACKENDS  # Accelerate's enum value (its config questions misspell it)
    for name in DYNAMO_BACKENDS:
        assert TorchDynamoPlugin(backend=name).problems() == []
        assert TorchDynamoPlugin(backend=DynamoBackend(name.upper())).problems() == []
        assert settings_from_environment({"ACCELERATE_DYNAMO_BACKEND": name.upper()})["dynamo_backend"] == name
        assert validate_config({"dynamo_config": {"dynamo_backend": name}}) == {
            "dynamo_config": {"dynamo_backend": name.upper()}}


@pytest.mark.parametrize("bad", ["torhchxla_trace_once", "nosuch"])
def test_every_entry_point_refuses_the_same_names(bad: str) -> None:
    assert TorchDynamoPlugin(backend=bad).problems()
    with pytest.raises(ValueError, match="ACCELERATE_DYNAMO_BACKEND"):
        settings_from_environment({"ACCELERATE_DYNAMO_BACKEND": bad})
    with pytest.raises(ConfigError, match="dynamo_backend"):
        validate_config({"dynamo_config": {"dynamo_backend": bad}})
