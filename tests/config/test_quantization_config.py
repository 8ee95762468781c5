"""BnbQuantizationConfig and the SageMaker argument converter: the same results and refusals as the real
Accelerate's (each case run through both, the real one in a subprocess so no alias leaks)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from overdrive.compat.cli_launch import _convert_nargs_to_dict
from overdrive.config.quantization import BnbQuantizationConfig

pytestmark = pytest.mark.requires("accelerate")

CONFIGS = [dict(load_in_8bit=True), dict(load_in_4bit=True), dict(load_in_4bit=True, bnb_4bit_compute_dtype="bf16"),
           dict(load_in_8bit=True, torch_dtype="bf16"), dict(load_in_8bit=True, load_in_4bit=True), dict(),
           dict(load_in_4bit=True, bnb_4bit_quant_type="int3"), dict(load_in_8bit="yes"),
           dict(load_in_8bit=True, skip_modules="lm_head"), dict(load_in_4bit=True, torch_dtype="fp64")]
ARGS = [["--model_name_or_path", "bert", "--do_train", "False", "--epochs", "3", "--learning_rate", "5e-5",
         "--max_steps", "50.5"],
        ["--name", "x", "--flag"], ["--a", "1", "--b", "--c", "2"], []]


def _summary(make, cases):
    out = []
    for case in cases:
        try:
            value = make(case)
        except ValueError:
            out.append("ValueError")
            continue
        out.append({k: str(v) for k, v in sorted(vars(value).items())} if not isinstance(value, dict)
                   else {k: [type(v).__name__, v] for k, v in value.items()})
    return out


def _real(cases, what):
    code = textwrap.dedent(f"""
        import json
        from accelerate.utils import BnbQuantizationConfig
        from accelerate.utils.launch import _convert_nargs_to_dict
        cases = json.loads({json.dumps(json.dumps(cases))})
        out = []
        for case in cases:
            try:
                value = BnbQuantizationConfig(**case) if {what!r} == "config" else _convert_nargs_to_dict(case)
            except ValueError:
                out.append("ValueError"); continue
            out.append({{k: str(v) for k, v in sorted(vars(value).items())}} if {what!r} == "config"
                       else {{k: [type(v).__name__, v] for k, v in value.items()}})
        print(json.dumps(out))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_bnb_quantization_config_equals_accelerate_field_by_field_and_refuses_the_same_values():
    ours = _summary(lambda case: BnbQuantizationConfig(**case), CONFIGS)
    real = _real(CONFIGS, "config")
    # Accelerate's target_dtype for 4-bit is its CustomDtype.INT4 enum; ours is its value, "int4"
    real = [r if r == "ValueError" else {**r, "target_dtype": r["target_dtype"].replace("CustomDtype.INT4", "int4")}
            for r in real]
    assert ours == real
    assert BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_compute_dtype="bf16").torch_dtype == torch.bfloat16


def test_the_refusal_names_the_values_given():
    with pytest.raises(ValueError, match="both True"):
        BnbQuantizationConfig(load_in_8bit=True, load_in_4bit=True)
    with pytest.raises(ValueError, match="bnb_4bit_quant_type='int3'.*fp4, nf4"):
        BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_quant_type="int3")


def test_convert_nargs_to_dict_equals_accelerate():
    assert _summary(_convert_nargs_to_dict, ARGS) == _real(ARGS, "nargs")
    with pytest.raises(ValueError, match="'--flag' has no value"):
        _convert_nargs_to_dict(["--name", "x", "--flag"])
