"""Accelerate names overdrive keeps importable but refuses to run, each with its reason and alternative.

One entry per name: ``name -> (kind, why, instead)``; kind ``"class"`` (construction raises) or
``"function"`` (calling raises). The names become attributes of this module.
"""

from __future__ import annotations

from overdrive.compat.unsupported import refusing_class, refusing_function

_LAUNCH = ("overdrive starts processes through torchrun itself", "use 'overdrive launch' (or notebook_launcher)")
_MEGATRON = ("overdrive drives megatron-core through MegatronLMPlugin, not Megatron-LM's training loop",
             "use Accelerator(megatron_lm_plugin=MegatronLMPlugin(...)) and a plain training loop")
_TE = ("Transformer Engine fp8 needs an NVIDIA GPU and is not wired in overdrive",
       "use mixed_precision='fp8' (torchao) or bf16")

_XLA = ("it runs on TPUs through torch_xla, which overdrive does not drive", "train on CPU or GPU processes")
_SAGEMAKER = ("SageMaker launches are not supported", "use 'overdrive launch' on the machines")
_MEGATRON_GPU = ("Megatron-LM's training loop (its engine, wrappers and model parsers) runs on NVIDIA GPUs only and "
                 "overdrive does not drive it", _MEGATRON[1])
_BNB = ("bitsandbytes' 8-bit / 4-bit layers need a GPU and are not driven by overdrive",
        "quantise with transformers' BitsAndBytesConfig when loading the model")

REFUSALS: dict[str, tuple[str, str, str]] = {
    # hardware overdrive does not drive: TPUs (torch_xla), SageMaker, Megatron-LM's GPU loop, bitsandbytes
    "MpDeviceLoaderWrapper": ("class", *_XLA),
    "tpu_launcher": ("function", *_XLA), "tpu_pod_launcher": ("function", *_XLA),
    "sagemaker_launcher": ("function", *_SAGEMAKER), "get_sagemaker_input": ("function", *_SAGEMAKER),
    **dict.fromkeys(("MegatronEngine", "MegatronLMOptimizerWrapper", "MegatronLMSchedulerWrapper"),
                    ("class", *_MEGATRON_GPU)),
    **dict.fromkeys(("megatron_lm_initialize", "megatron_lm_prepare_data_loader",
                     "megatron_lm_prepare_model_optimizer_scheduler", "megatron_lm_prepare_optimizer",
                     "megatron_lm_prepare_scheduler", "finish_mpu_init", "model_provider_func",
                     "gather_across_data_parallel_groups", "parse_bert_config", "parse_glm4_moe_config",
                     "parse_gpt2_config", "parse_llama_config", "parse_t5_config"), ("function", *_MEGATRON_GPU)),
    **dict.fromkeys(("get_quantized_model_device_map", "quantize_and_offload_8bit", "replace_with_bnb_layers"),
                    ("function", *_BNB)),
    # launch helpers of Accelerate's own launcher
    "prepare_sagemager_args_inputs": ("function", "SageMaker launches are not supported", _LAUNCH[1]),
    "prepare_tpu": ("function", "TPUs (torch_xla) are not supported", "train on CPU or GPU processes"),
    "install_xla": ("function", "TPUs (torch_xla) are not supported", "train on CPU or GPU processes"),
    # Megatron-LM training-loop objects
    "AbstractTrainStep": ("class", *_MEGATRON), "BertTrainStep": ("class", *_MEGATRON),
    "GPTTrainStep": ("class", *_MEGATRON), "T5TrainStep": ("class", *_MEGATRON),
    "MegatronLMDummyDataLoader": ("class", *_MEGATRON), "MegatronLMDummyScheduler": ("class", *_MEGATRON),
    "avg_losses_across_data_parallel_group": ("function", *_MEGATRON),
    # fp8 back ends other than torchao
    "apply_fp8_autowrap": ("function", *_TE), "contextual_fp8_autocast": ("function", *_TE),
    "convert_model": ("function", *_TE),
    # bitsandbytes quantisation
    "load_and_quantize_model": ("function", "bitsandbytes quantisation through Accelerate is not supported",
                                "quantise with transformers' BitsAndBytesConfig when loading the model"),
    # DeepSpeed internals
    "copy_tensor_to_devices": ("function", "it exists for XLA devices, which overdrive does not support",
                               "use broadcast(tensor)"),
    # the two steps inside Accelerate's prepare_pippy (build the stage, run its schedule): one call here
    **dict.fromkeys(("build_pipeline", "pippy_forward"),
                    ("function", "overdrive builds and runs the pipeline stage inside prepare_pippy",
                     "use prepare_pippy(model, split_points=..., example_args=...) and call the model it returns")),
}

globals().update({
    name: (refusing_class if kind == "class" else refusing_function)(name, why, instead)
    for name, (kind, why, instead) in REFUSALS.items()
})
