"""``overdrive estimate-memory``: Accelerate's numbers, from a local config (no hub)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from overdrive.cli import main
from tests.big_model.big_model_helpers import llama_config

pytestmark = pytest.mark.requires("transformers")  # builds the Llama models


def test_estimate_memory_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    llama_config().save_pretrained(tmp_path)
    assert main(["estimate-memory", str(tmp_path), "--json"]) == 0
    rows = {row["dtype"]: row for row in json.loads(capsys.readouterr().out)["rows"]}
    assert list(rows) == ["float32", "float16", "int8", "int4"]
    # the base model (AutoModel, as Accelerate builds it): embedding 1000 x 64 fp32 is the largest layer
    assert rows["float32"]["largest_layer"] == 1000 * 64 * 4 and rows["float32"]["largest_layer_names"] == [
        "embed_tokens"]
    total = rows["float32"]["total_size"]
    assert rows["int4"]["total_size"] == total / 8 and rows["int8"]["training_adam"] is None
    assert rows["float32"]["training_adam"] == 4 * total and rows["float16"]["training_adam"] == 2 * total
    import accelerate.commands.estimate as estimate

    from overdrive.big_model.estimate import create_empty_model

    theirs = estimate.calculate_maximum_sizes(create_empty_model(str(tmp_path)))
    assert theirs[0] == total and theirs[1][0] == rows["float32"]["largest_layer"]
    assert max(estimate.estimate_training_usage(total, "float16").values()) == rows["float16"]["training_adam"]
    assert main(["estimate-memory", str(tmp_path / "config.json"), "--dtypes", "float16"]) == 0
    table = capsys.readouterr().out
    assert "Training using Adam" in table and "float16" in table and "float32" not in table


def test_estimate_memory_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate-memory", str(tmp_path / "missing")]) == 2
    assert "nothing is downloaded" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["estimate-memory", str(tmp_path), "--dtypes", "float64"])
