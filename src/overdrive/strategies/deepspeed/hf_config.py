"""``HfDeepSpeedConfig``: a DeepSpeed JSON config with the queries transformers' integration makes.

transformers subclasses it (``transformers.integrations.HfDeepSpeedConfig``) and keeps a weak reference
to the instance so that ``from_pretrained`` can build models under ``deepspeed.zero.Init`` for ZeRO-3.
Works without DeepSpeed installed: it only reads the config.
"""

from __future__ import annotations

import base64
import copy
import json
import os
from typing import Any


class HfDeepSpeedConfig:
    """A DeepSpeed config (a dict, a JSON file path, or base64 JSON) and its ZeRO stage and offload."""

    def __init__(self, config_file_or_dict: dict[str, Any] | str | os.PathLike) -> None:
        if isinstance(config_file_or_dict, dict):
            config = copy.deepcopy(config_file_or_dict)  # the caller's dict is left alone
        elif os.path.exists(config_file_or_dict):
            with open(config_file_or_dict, encoding="utf-8") as handle:
                config = json.load(handle)
        else:
            try:
                config = json.loads(base64.urlsafe_b64decode(str(config_file_or_dict)).decode("utf-8"))
            except (UnicodeDecodeError, AttributeError, ValueError) as exc:
                raise ValueError(f"HfDeepSpeedConfig needs a dict, the path of a JSON file or base64 JSON; got "
                                 f"{config_file_or_dict!r}") from exc
        self.config = config
        self.set_stage_and_offload()

    def set_stage_and_offload(self) -> None:
        """Read the ZeRO stage and whether anything is offloaded from the config."""
        self._stage = self.get_value("zero_optimization.stage", -1)
        self._offload = False
        if self.is_zero2() or self.is_zero3():
            devices = {self.get_value("zero_optimization.offload_optimizer.device"),
                       self.get_value("zero_optimization.offload_param.device")}
            self._offload = bool(devices & {"cpu", "nvme"})

    def find_config_node(self, ds_key_long: str) -> tuple[dict[str, Any] | None, str]:
        """The dict holding the last part of a dotted key, and that part (None when a parent is missing)."""
        config: Any = self.config
        *parents, key = ds_key_long.split(".")
        for part in parents:
            config = config.get(part) if isinstance(config, dict) else None
            if config is None:
                return None, key
        return config, key

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        """The value at a dotted key such as ``zero_optimization.stage``, or ``default``."""
        config, key = self.find_config_node(ds_key_long)
        return default if config is None else config.get(key, default)

    def del_config_sub_tree(self, ds_key_long: str, must_exist: bool = False) -> None:
        """Remove the entry at a dotted key (``must_exist``: an error when it is absent)."""
        config, key = self.find_config_node(ds_key_long)
        if config is None or key not in config:
            if must_exist:
                raise ValueError(f"no {ds_key_long!r} entry in the DeepSpeed config: {self.config}")
            return
        del config[key]

    def is_true(self, ds_key_long: str) -> bool:
        """Whether the value at a dotted key is set and true."""
        value = self.get_value(ds_key_long)
        return False if value is None else bool(value)

    def is_false(self, ds_key_long: str) -> bool:
        """Whether the value at a dotted key is set and false."""
        value = self.get_value(ds_key_long)
        return False if value is None else not bool(value)

    def is_zero2(self) -> bool:
        """Whether the config asks for ZeRO stage 2."""
        return self._stage == 2

    def is_zero3(self) -> bool:
        """Whether the config asks for ZeRO stage 3."""
        return self._stage == 3

    def is_offload(self) -> bool:
        """Whether ZeRO 2/3 offloads the optimizer or parameters (CPU or NVMe)."""
        return self._offload
