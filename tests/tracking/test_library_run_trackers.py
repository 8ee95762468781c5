"""Comet, ClearML, DVCLive, Trackio, SwanLab: registered under Accelerate's names; without their libraries
asking for one is a clear error at Accelerator() (checked for those not installed: dvclive in the test
install; the others run offline in tests/tracking/test_offline_trackers.py)."""

from __future__ import annotations

import importlib.util

import pytest

from overdrive.tracking import (
    LOGGER_TYPE_TO_CLASS,
    filter_trackers,
    get_available_trackers,
    register_tracker_class,
)
from overdrive.tracking.base import GeneralTracker

NEW = {"comet_ml": ("comet_ml", "comet-ml"), "clearml": ("clearml", "clearml"), "dvclive": ("dvclive", "dvclive"),
       "trackio": ("trackio", "trackio"), "swanlab": ("swanlab", "swanlab")}


@pytest.mark.parametrize("name", sorted(NEW))
def test_registered_and_a_clear_error_without_the_library(name):
    module, package = NEW[name]
    cls = LOGGER_TYPE_TO_CLASS[name]
    assert issubclass(cls, GeneralTracker) and cls.name == name
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed here")
    assert name not in get_available_trackers()
    from overdrive import Accelerator

    with pytest.raises(ValueError, match=f"the '{name}' tracker needs the '{package}' package.*pip install {package}"):
        Accelerator(cpu=True, log_with=name)
    with pytest.raises(ValueError, match=f"pip install {package}"):
        filter_trackers([name])


def test_register_tracker_class_and_filter():
    class Echo(GeneralTracker):
        name = "echo_for_test"
        requires_logging_directory = False  # Accelerate's register_tracker_class requires the class to say

        def __init__(self, run_name: str) -> None:
            self.run_name = run_name

    from overdrive.tracking import base

    register_tracker_class(Echo)
    try:
        assert LOGGER_TYPE_TO_CLASS["echo_for_test"] is Echo
        assert filter_trackers(["jsonl", "echo_for_test", "jsonl"]) == ["jsonl", "echo_for_test"]
    finally:
        base._REGISTRY.pop("echo_for_test", None)  # leave the process's registry as it was
    with pytest.raises(ValueError, match="name"):
        register_tracker_class(type("Nameless", (GeneralTracker,), {}))
