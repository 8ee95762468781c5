"""The one table of Accelerate's module paths and names, and where each lives in overdrive.

- :data:`MODULES`: Accelerate module path -> the overdrive module of the same path (what
  ``install_as_accelerate()`` hands out for it).
- :data:`NAMES`: for each thin re-export module (and the extra names of ``overdrive`` and
  ``overdrive.utils``), name -> the overdrive module that defines it.
- :data:`ABSENT`: Accelerate names overdrive does not provide, with the reason.
- :data:`PENDING`: names another part of overdrive is building, with who builds them.

``tests/compat/test_accelerate_compat.py`` checks this table against the installed Accelerate, and
``scripts/accelerate_parity.py`` writes docs/accelerate_parity.md from it. Pure data: importing it is cheap.
"""

from __future__ import annotations

from overdrive._version import ACCELERATE_API_VERSION

#: The Accelerate release whose API overdrive follows; what importlib.metadata answers under the alias.
ACCELERATE_VERSION = ACCELERATE_API_VERSION

_THIN = ("data_loader", "checkpointing", "parallelism_config", "utils.dataclasses", "utils.operations",
         "utils.imports", "utils.constants", "utils.deepspeed", "utils.fsdp_utils", "utils.other", "utils.versions",
         "utils.environment", "utils.launch", "utils.megatron_lm", "utils.transformer_engine", "utils.ao",
         "utils.bnb", "utils.torch_xla", "commands", "commands.config", "commands.config.config_args",
         "commands.config.default", "commands.launch", "commands.env", "commands.test", "commands.estimate",
         "commands.to_fsdp2", "commands.tpu", "test_utils", "test_utils.testing", "test_utils.training")
#: modules overdrive has in its own layout at Accelerate's path
_OWN = ("accelerator", "tracking", "launchers")
#: Accelerate paths whose module overdrive keeps elsewhere: served as that very module (the same object)
SAME_MODULE: dict[str, str] = {
    "overdrive.state": "overdrive.training.state",
    "overdrive.optimizer": "overdrive.training.optimizer",
    "overdrive.scheduler": "overdrive.training.scheduler",
    "overdrive.local_sgd": "overdrive.accelerator.local_sgd",
    "overdrive.logging": "overdrive.helpers.logging",
    "overdrive.utils.memory": "overdrive.helpers.memory",
    "overdrive.utils.random": "overdrive.helpers.random",
}
#: the big-model compat modules (built by the big-model work, issue 13)
BIG_MODEL = ("hooks", "big_modeling", "inference", "utils.modeling", "utils.offload")

MODULES: dict[str, str] = {"accelerate": "overdrive"} | {
    f"accelerate.{path}": f"overdrive.{path}"
    for path in (*_OWN, *_THIN, *BIG_MODEL, "utils", *(p.removeprefix("overdrive.") for p in SAME_MODULE))}

#: Accelerate modules with no counterpart, and why
ABSENT_MODULES: dict[str, str] = {
    "accelerate.utils.tqdm": "its one name, tqdm, is importable from accelerate.utils",
    "accelerate.utils.rich": "Accelerate's rich traceback installer; overdrive leaves tracebacks to the user",
    "accelerate.memory_utils": "deprecated in Accelerate (use accelerate.utils.memory)",
    "accelerate.commands.accelerate_cli": "the command line is 'overdrive' (overdrive.cli)",
    "accelerate.commands.merge": "use 'overdrive merge-weights'",
    "accelerate.commands.utils": "argument-parser internals of Accelerate's CLI",
    "accelerate.commands.menu": "Accelerate's interactive menu; 'overdrive config' asks its own questions",
    "accelerate.commands.config.cluster": "'overdrive config' asks its own questions",
    "accelerate.commands.config.config": "'overdrive config' asks its own questions",
    "accelerate.commands.config.config_utils": "'overdrive config' asks its own questions",
    "accelerate.commands.config.sagemaker": "SageMaker launches are not supported",
    "accelerate.commands.config.update": "use 'overdrive config update'",
    "accelerate.test_utils.examples": "compares Accelerate's own example scripts",
    "accelerate.test_utils.scripts": "Accelerate's own test scripts",
}


def _names(source: str, text: str) -> dict[str, str]:
    return dict.fromkeys(text.split(), source)


_C, _OPS, _REF = "overdrive.config", "overdrive.helpers.ops", "overdrive.compat.refusals"
_IMP = "overdrive.helpers.imports"
_OTHER, _ENV, _K = "overdrive.compat.other", "overdrive.helpers.environment", "overdrive.compat.constants"
_CLI, _CMD = "overdrive.compat.cli_launch", "overdrive.compat.cli_commands"
_IS_AVAILABLE = (
    "is_4bit_bnb_available is_8bit_bnb_available is_aim_available is_amdsmi_available is_bf16_available "
    "is_bitsandbytes_multi_backend_available is_bnb_available is_boto3_available is_clearml_available "
    "is_comet_ml_available is_cuda_available is_datasets_available is_deepspeed_available is_dvclive_available "
    "is_fp16_available is_fp8_available is_habana_gaudi1 is_hpu_available is_import_timer_available "
    "is_lomo_available is_matplotlib_available is_megatron_lm_available is_mlflow_available is_mlu_available "
    "is_mps_available is_msamp_available is_musa_available is_neuron_available is_npu_available "
    "is_pandas_available is_peft_available is_pippy_available is_pynvml_available is_pytest_available "
    "is_rich_available is_rocm_available is_sagemaker_available is_schedulefree_available is_sdaa_available "
    "is_swanlab_available is_tensorboard_available is_timm_available is_torch_xla_available is_torchao_available "
    "is_torchdata_available is_torchdata_stateful_dataloader_available is_torchvision_available "
    "is_trackio_available is_transformer_engine_available is_transformer_engine_mxfp8_available "
    "is_transformers_available is_triton_available is_wandb_available is_weights_only_available "
    "is_xccl_available is_xpu_available deepspeed_required torchao_required is_tqdm_available "
    "is_torch_distributed_available is_numpy_available")
_CONSTANTS = (
    "SCALER_NAME MODEL_NAME SAFE_MODEL_NAME RNG_STATE_NAME OPTIMIZER_NAME SCHEDULER_NAME SAMPLER_NAME "
    "PROFILE_PATTERN_NAME WEIGHTS_NAME WEIGHTS_PATTERN_NAME WEIGHTS_INDEX_NAME SAFE_WEIGHTS_NAME "
    "SAFE_WEIGHTS_PATTERN_NAME SAFE_WEIGHTS_INDEX_NAME SAGEMAKER_PYTORCH_VERSION SAGEMAKER_PYTHON_VERSION "
    "SAGEMAKER_TRANSFORMERS_VERSION SAGEMAKER_PARALLEL_EC2_INSTANCES FSDP_SHARDING_STRATEGY FSDP_AUTO_WRAP_POLICY "
    "FSDP_BACKWARD_PREFETCH FSDP_STATE_DICT_TYPE FSDP2_STATE_DICT_TYPE FSDP_PYTORCH_VERSION FSDP2_PYTORCH_VERSION "
    "DTENSOR_PYTORCH_VERSION FSDP_MODEL_NAME DEEPSPEED_MULTINODE_LAUNCHERS TORCH_DYNAMO_MODES "
    "ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION XPU_PROFILING_AVAILABLE_PYTORCH_VERSION "
    "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION BETA_TP_AVAILABLE_PYTORCH_VERSION "
    "BETA_TP_AVAILABLE_TRANSFORMERS_VERSION BETA_CP_AVAILABLE_PYTORCH_VERSION BETA_SP_AVAILABLE_DEEPSPEED_VERSION "
    "STR_OPERATION_TO_FUNC TORCH_LAUNCH_PARAMS CUDA_DISTRIBUTED_TYPES TORCH_DISTRIBUTED_OPERATION_TYPES "
    "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING")

_UTILS_MODULES: dict[str, dict[str, str]] = {
    "overdrive.utils.dataclasses": {
        **_names(_C, "AutocastKwargs DDPCommunicationHookType DataLoaderConfiguration DeepSpeedPlugin "
                     "DistributedDataParallelKwargs DistributedType FullyShardedDataParallelPlugin GradScalerKwargs "
                     "GradientAccumulationPlugin InitProcessGroupKwargs KwargsHandler LoggerType MegatronLMPlugin "
                     "PrecisionType ProfileKwargs ProjectConfiguration RNGType TorchTensorParallelPlugin "
                     "TorchDynamoPlugin AORecipeKwargs TERecipeKwargs TorchContextParallelConfig "
                     "DeepSpeedSequenceParallelConfig"),
        **_names("overdrive.compat.kinds", "ComputeEnvironment CustomDtype DynamoBackend SageMakerDistributedType"),
        **_names(_OPS, "TensorInformation"),
        **_names("overdrive.compat.fsdp", "get_module_class_from_name"),
        **_names("overdrive.config.quantization", "BnbQuantizationConfig"),
        **_names(_REF, "FP8RecipeKwargs MSAMPRecipeKwargs TorchTensorParallelConfig "
                       "add_model_config_to_megatron_parser"),
    },
    "overdrive.utils.operations": {
        **_names(_OPS, "broadcast broadcast_object_list concatenate convert_to_fp32 find_batch_size find_device "
                       "gather gather_object get_data_structure honor_type ignorant_find_batch_size "
                       "initialize_tensors is_namedtuple is_tensor_information is_torch_tensor listify "
                       "pad_across_processes recursively_apply reduce send_to_device slice_tensors TensorInformation "
                       "DistributedOperationException get_shape"),
        **_names("overdrive.compat.operations", "CannotPadNestedTensorWarning GatheredParameters "
                                                "convert_outputs_to_fp32 pad_input_tensors"),
        **_names(_REF, "copy_tensor_to_devices"),
    },
    "overdrive.utils.imports": _names(_IMP, _IS_AVAILABLE),
    "overdrive.utils.constants": _names(_K, _CONSTANTS),
    "overdrive.utils.deepspeed": {
        **_names("overdrive.strategies.deepspeed.objects", "DummyOptim DummyScheduler DeepSpeedOptimizerWrapper "
                                                "DeepSpeedSchedulerWrapper get_active_deepspeed_plugin"),
        **_names("overdrive.config.hf_deepspeed", "HfDeepSpeedConfig"),
        **_names(_REF, "DeepSpeedEngineWrapper map_pytorch_optim_to_deepspeed"),
    },
    "overdrive.utils.fsdp_utils": {
        **_names("overdrive.compat.fsdp", "save_fsdp_model load_fsdp_model save_fsdp_optimizer load_fsdp_optimizer "
                                          "merge_fsdp_weights get_parameters_from_modules"),
        **_names(_OTHER, "enable_fsdp_ram_efficient_loading disable_fsdp_ram_efficient_loading"),
        **_names(_REF, "fsdp2_prepare_model fsdp2_load_full_state_dict fsdp2_switch_optimizer_parameters "
                       "fsdp2_apply_ac fsdp2_canonicalize_names ensure_weights_retied get_fsdp2_grad_scaler"),
    },
    "overdrive.utils.other": {
        **_names(_OTHER, "check_os_kernel clean_state_dict_for_safetensors convert_bytes get_module_children_bottom_up "
                         "get_pretty_name has_compiled_regions is_compiled_module is_port_in_use load merge_dicts "
                         "model_has_dtensor recursive_getattr save get_model_tp_size get_free_port"),
        **_names("overdrive.helpers.misc", "extract_model_from_parallel wait_for_everyone"),
        **_names("overdrive.compat.regions", "compile_regions compile_regions_deepspeed compile_regions_fsdp2 "
                                             "has_repeated_blocks is_repeated_blocks"),
    },
    "overdrive.utils.versions": _names(_OTHER, "compare_versions is_torch_version"),
    "overdrive.utils.environment": {
        **_names(_ENV, "are_libraries_initialized check_cuda_fp8_capability check_cuda_p2p_ib_support "
                       "clear_environment convert_dict_to_env_variables get_cpu_distributed_information "
                       "get_current_device_type get_gpu_info get_int_from_env parse_choice_from_env "
                       "parse_flag_from_env purge_accelerate_environment set_numa_affinity str_to_bool"),
        **_names("overdrive.helpers.misc", "patch_environment"),
    },
    "overdrive.utils.launch": {
        **_names(_REF, "PrepareForLaunch prepare_deepspeed_cmd_env prepare_sagemager_args_inputs prepare_tpu"),
        **_names(_CLI, "prepare_multi_gpu_env prepare_simple_launcher_cmd_env _convert_nargs_to_dict subprocess"),
        **_names("shutil", "which"),
    },
    "overdrive.utils.megatron_lm": _names(_REF, "AbstractTrainStep BertTrainStep GPTTrainStep T5TrainStep "
                                                "MegatronLMDummyDataLoader MegatronLMDummyScheduler "
                                                "avg_losses_across_data_parallel_group"),
    "overdrive.utils.transformer_engine": {
        **_names(_REF, "apply_fp8_autowrap contextual_fp8_autocast convert_model"),
        **_names("overdrive.compat.layers", "has_transformer_engine_layers"),
    },
    "overdrive.utils.ao": _names("overdrive.compat.layers", "convert_model_to_fp8_ao filter_first_and_last_linear_layers "
                                 "filter_linear_layers find_first_last_linear_layers has_ao_layers"),
    "overdrive.utils.bnb": {**_names("overdrive.compat.layers", "has_4bit_bnb_layers"),
                            **_names(_REF, "load_and_quantize_model")},
    "overdrive.utils.torch_xla": _names(_REF, "install_xla"),
}

_BM = "overdrive.big_model"
# big-model names (accelerate.utils.modeling / offload, accelerate.hooks, accelerate.big_modeling)
_MODELING = {
    **_names(f"{_BM}.checkpoint_files", "load_state_dict"),
    **_names(f"{_BM}.hooks", "align_module_device has_offloaded_params"),
    **_names(f"{_BM}.loading", "load_checkpoint_in_model"),
    **_names(f"{_BM}.offload", "load_offloaded_weights"),
    **_names(f"{_BM}.planning", "check_device_map clean_device_map fallback_allocate get_balanced_memory "
                                "infer_auto_device_map"),
    **_names(f"{_BM}.sizes", "calculate_maximum_sizes check_device_same check_tied_parameters_in_config "
                             "check_tied_parameters_on_same_device compute_module_sizes "
                             "compute_module_total_buffer_size convert_file_size_to_int dtype_byte_size "
                             "find_tied_parameters get_max_layer_size get_max_memory get_module_leaves "
                             "get_module_size_with_ties get_non_persistent_buffers id_tensor_storage "
                             "named_module_tensors retie_parameters"),
    **_names(f"{_BM}.state_dicts", "get_state_dict_from_offload get_state_dict_offloaded_model"),
    **_names(f"{_BM}.tensors", "set_module_tensor_to_device"),
    **_names(_OTHER, "get_grad_scaler get_mixed_precision_context_manager is_peft_model"),
}
_OFFLOAD = _names(f"{_BM}.offload", "OffloadedWeightsLoader PrefixedDataset extract_submodules_state_dict "
                                    "load_offloaded_weight load_offloaded_weights offload_state_dict offload_weight "
                                    "save_offload_index")
_HOOKS = {
    **_names(f"{_BM}.attach", "attach_align_device_hook attach_align_device_hook_on_blocks "
                              "attach_execution_device_hook"),
    **_names(f"{_BM}.casting", "LayerwiseCastingHook"),
    **_names(f"{_BM}.hooks", "AlignDevicesHook CpuOffload ModelHook SequentialHook UserCpuOffloadHook "
                             "add_hook_to_module remove_hook_from_module remove_hook_from_submodules"),
}
_BIG_MODELING = {
    **_names(f"{_BM}.casting", "attach_layerwise_casting_hooks"),
    **_names(f"{_BM}.dispatch", "cpu_offload cpu_offload_with_hook disk_offload dispatch_model"),
    **_names(f"{_BM}.init", "init_empty_weights init_on_device"),
    **_names(f"{_BM}.loading", "load_checkpoint_and_dispatch load_checkpoint_in_model"),
    **_names(f"{_BM}.planning", "check_device_map get_balanced_memory infer_auto_device_map"),
    **_names(f"{_BM}.sizes", "find_tied_parameters get_max_memory retie_parameters"),
    **_names(f"{_BM}.tensors", "set_module_tensor_to_device"),
    **_names(_OTHER, "_refuse_recurrent_layers_under_sequence_parallelism"),
}
_INFERENCE = {**_names(f"{_BM}.pippy", "prepare_pippy find_pippy_batch_size generate_device_map"),
              **_names(_REF, "build_pipeline pippy_forward")}
# the big-model names of accelerate.utils
_BIG_MODEL_UTILS = {name: _MODELING[name] for name in (
    "align_module_device calculate_maximum_sizes check_device_map check_tied_parameters_in_config "
    "check_tied_parameters_on_same_device compute_module_sizes convert_file_size_to_int dtype_byte_size "
    "find_tied_parameters get_balanced_memory get_max_layer_size get_max_memory "
    "clean_device_map compute_module_total_buffer_size get_module_size_with_ties get_non_persistent_buffers "
    "has_offloaded_params id_tensor_storage infer_auto_device_map "
    "load_checkpoint_in_model load_offloaded_weights load_state_dict named_module_tensors retie_parameters "
    "set_module_tensor_to_device").split()} | {name: _OFFLOAD[name] for name in (
    "OffloadedWeightsLoader PrefixedDataset extract_submodules_state_dict load_offloaded_weight offload_state_dict "
    "offload_weight save_offload_index").split()}

_UTILS: dict[str, str] = {
    name: source for module in _UTILS_MODULES.values() for name, source in module.items()} | _BIG_MODEL_UTILS | {
    **_names(_C, "ParallelismConfig"),
    **_names("overdrive.helpers.memory", "find_executable_batch_size release_memory clear_device_cache "
                                       "should_reduce_batch_size"),
    **_names("overdrive.helpers.random", "set_seed synchronize_rng_state synchronize_rng_states"),
    **_names("overdrive.helpers.misc", "tqdm is_package_available"),
    **_names(_OTHER, "write_basic_config is_peft_model get_grad_scaler get_mixed_precision_context_manager"),
    **_names("overdrive.data", "skip_first_batches"),
}

NAMES: dict[str, dict[str, str]] = {
    **_UTILS_MODULES,
    "overdrive.utils": _UTILS,
    # (the big-model names are in overdrive/__init__.py's own list)
    "overdrive": {
        **_names(f"{_BM}.pippy", "prepare_pippy"),
        **_names(_IMP, "is_rich_available"),
        **_names("overdrive.compat.alias", "install_as_accelerate uninstall_as_accelerate"),
    },
    "overdrive.hooks": _HOOKS,
    "overdrive.big_modeling": _BIG_MODELING,
    "overdrive.inference": _INFERENCE,
    "overdrive.utils.modeling": _MODELING,
    "overdrive.utils.offload": _OFFLOAD,
    "overdrive.data_loader": _names("overdrive.data", "BatchSamplerShard DataLoaderDispatcher DataLoaderShard "
                                    "DataLoaderStateMixin IterableDatasetShard SeedableRandomSampler SkipBatchSampler "
                                    "SkipDataLoader get_sampler prepare_data_loader skip_first_batches"),
    "overdrive.checkpointing": {
        **_names(_K, "MODEL_NAME OPTIMIZER_NAME RNG_STATE_NAME SAFE_MODEL_NAME SAFE_WEIGHTS_NAME SAMPLER_NAME "
                     "SCALER_NAME SCHEDULER_NAME WEIGHTS_NAME"),
        **_names(_REF, "save_accelerator_state load_accelerator_state save_custom_state load_custom_state"),
    },
    "overdrive.parallelism_config": _names(_C, "ParallelismConfig"),
    "overdrive.commands": {},
    "overdrive.commands.config": _names(_OTHER, "default_config_file load_config_from_file"),
    "overdrive.commands.config.config_args": {**_names(_OTHER, "default_config_file load_config_from_file"),
                                              **_names(_CMD, "BaseConfig ClusterConfig SageMakerConfig")},
    "overdrive.commands.launch": {
        **_names(_CLI, "launch_command_parser launch_command _validate_launch_command simple_launcher "
                       "multi_gpu_launcher prepare_multi_gpu_env prepare_simple_launcher_cmd_env psutil"),
        **_names(_ENV, "check_cuda_p2p_ib_support"),
        **_names("overdrive.launchers.torchrun", "CHILD_STDERR_CHUNK_SIZE CHILD_STDERR_TAIL_CHUNKS"),
    },
    "overdrive.commands.env": {**_names(_CMD, "env_command_parser env_command"), **_names("shutil", "which")},
    "overdrive.commands.test": _names(_CMD, "test_command_parser test_command"),
    "overdrive.commands.estimate": _names(_CMD, "estimate_command_parser estimate_command gather_data "
                                                "add_timm_hub_prefix verify_on_hub"),
    "overdrive.commands.to_fsdp2": _names(_CMD, "to_fsdp2_command_parser to_fsdp2_command convert_config_to_fsdp2 "
                                                 "load_config"),
    "overdrive.commands.tpu": _names(_CMD, "tpu_command_parser tpu_command_launcher"),
    "overdrive.commands.config.default": _names(_OTHER, "write_basic_config"),
    "overdrive.test_utils": _names("overdrive.compat.testing", "RegressionDataset RegressionModel"),
    "overdrive.test_utils.testing": _names("overdrive.compat.testing", "require_cpu slow"),
    "overdrive.test_utils.training": _names("overdrive.compat.testing", "RegressionDataset RegressionModel"),
}

#: names another part of overdrive is building: name -> who (tests skip them, naming the owner, until they exist)
PENDING: dict[str, str] = {
    **dict.fromkeys(_BIG_MODEL_UTILS, "bigmodel (issue 13): big-model compat modules"),
    "prepare_pippy": "bigmodel (issue 13): big-model compat modules",
}

#: Accelerate names overdrive does not provide: name (or (overdrive module, name)) -> why
ABSENT: dict[str | tuple[str, str], str] = {
    # whole modules kept to the names user scripts import
    ("overdrive.test_utils.testing", "*"): "Accelerate's own test-suite helpers; use pytest markers",
    ("overdrive.test_utils.training", "*"): "Accelerate's own test-suite helpers",
    ("overdrive.test_utils", "*"): "Accelerate's own test-suite helpers",
    ("overdrive.utils.megatron_lm", "*"): "Megatron-LM training-loop internals (overdrive uses megatron-core)",
    ("overdrive.utils.bnb", "*"): "bitsandbytes conversion internals (quantise with transformers)",
    ("overdrive.utils.launch", "*"): "internals of Accelerate's launcher (overdrive launch hands off to torchrun)",
    ("overdrive.commands.config", "*"): "Accelerate's CLI parser; use 'overdrive config'",
    ("overdrive.commands.config.config_args", "*"): "Accelerate's config classes; overdrive reads the same YAML keys",
    ("overdrive.commands.config.default", "*"): "Accelerate's CLI parser; use 'overdrive config default'",
    **{(f"overdrive.commands.{name}", "*"): "internals and entry point of Accelerate's command; its parser and "
       "command functions run the overdrive command of the same name" for name in
       ("launch", "env", "test", "estimate", "to_fsdp2", "tpu")},
    # single internals
    "DataLoaderAdapter": "internal base of Accelerate's loaders; overdrive's prepared loaders are DataLoaders",
    "test_launch": "internal check of Accelerate's launcher",
    "move_to_device": "internal helper of Accelerate's optimizer wrapper",
    "patch_optimizer_step": "internal: overdrive never patches optimizer.step",
    "ThreadLocalSharedDict": "XLA-only internal of Accelerate's state",
    "do_nothing": "internal of Accelerate's state",
    "mocked_dataloaders": "Accelerate's own test data (downloads GLUE)",
    "mocked_dataloaders_for_autoregressive_models": "Accelerate's own test data (downloads a dataset)",
    "BaseEnum": "internal enum base", "EnumWithContains": "internal enum base",
    "FP8BackendType": "fp8 back ends are chosen by AORecipeKwargs / mixed_precision='fp8'",
    **dict.fromkeys(("parse_bert_config", "parse_glm4_moe_config", "parse_gpt2_config", "parse_llama_config",
                     "parse_t5_config"), "Megatron-LM model-config parsers"),
    "CPUInformation": "internal record of the environment helpers",
    "get_driver_version": "nvidia-smi query; use torch.version.cuda",
    "override_numa_affinity": "NUMA pinning is left to torchrun (--numa-binding)",
    "fsdp2_prepare_auto_wrap_policy": "overdrive applies FSDP2 itself in accelerator.prepare()",
    "ConvertOutputsToFp32": "internal class behind convert_outputs_to_fp32 (use the function)",
    "chained_operation": "internal decorator of Accelerate's collectives",
    "verify_operation": "internal decorator; overdrive's collectives check shapes before every call",
    "gather_tensor_shape": "internal of Accelerate's collectives",
    "is_torch_xpu_tensor": "internal XPU check",
}
