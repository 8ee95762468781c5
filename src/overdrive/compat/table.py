"""The one table of Accelerate's module paths and names, and where each lives in overdrive.

- :data:`MODULES`: Accelerate module path -> the overdrive module of the same path (what
  ``install_as_accelerate()`` hands out for it).
- :data:`NAMES`: for each thin re-export module (and the extra names of ``overdrive`` and
  ``overdrive.utils``), name -> the overdrive module that defines it.
- :data:`ABSENT`: Accelerate names overdrive does not provide, with the reason.

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
         "commands.to_fsdp2", "commands.tpu", "test_utils", "test_utils.testing", "test_utils.training",
         "commands.accelerate_cli", "commands.merge", "commands.utils", "commands.config.cluster",
         "commands.config.config", "commands.config.config_utils", "commands.config.sagemaker",
         "commands.config.update")
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
    "overdrive.utils.tqdm": "overdrive.compat.tqdm_module",
    "overdrive.utils.rich": "overdrive.compat.rich_traceback",
    "overdrive.memory_utils": "overdrive.compat.memory_utils",
}
#: the big-model compat modules
BIG_MODEL = ("hooks", "big_modeling", "inference", "utils.modeling", "utils.offload")

MODULES: dict[str, str] = {"accelerate": "overdrive"} | {
    f"accelerate.{path}": f"overdrive.{path}"
    for path in (*_OWN, *_THIN, *BIG_MODEL, "utils", *(p.removeprefix("overdrive.") for p in SAME_MODULE))}

#: Accelerate modules with no counterpart, and why
ABSENT_MODULES: dict[str, str] = {
    "accelerate.commands.menu": "Accelerate's interactive menu; 'overdrive config' asks its own questions",
    "accelerate.test_utils.examples": "compares Accelerate's own example scripts",
    "accelerate.test_utils.scripts": "Accelerate's own test scripts",
}


def _names(source: str, text: str) -> dict[str, str]:
    return dict.fromkeys(text.split(), source)


_C, _OPS, _REF = "overdrive.config", "overdrive.helpers.ops", "overdrive.compat.refusals"
_IMP = "overdrive.helpers.imports"
_MODEL, _ENV, _K = "overdrive.compat.model_helpers", "overdrive.helpers.environment", "overdrive.compat.constants"
_CHECKS, _CONFIG = "overdrive.compat.environment_checks", "overdrive.compat.config_commands"
_CLI, _CMD = "overdrive.compat.cli_launch", "overdrive.compat.cli_commands"
_SURF, _MOD = "overdrive.compat.surface", "overdrive.compat.cli_modules"
_INT, _BM = "overdrive.compat.internals", "overdrive.big_model"
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
        **_names(_C, "AutocastKwargs DDPCommunicationHookType DataLoaderConfiguration "
                     "DistributedDataParallelKwargs DistributedType FullyShardedDataParallelPlugin GradScalerKwargs "
                     "GradientAccumulationPlugin InitProcessGroupKwargs KwargsHandler LoggerType MegatronLMPlugin "
                     "PrecisionType ProfileKwargs ProjectConfiguration RNGType TorchTensorParallelPlugin "
                     "TorchDynamoPlugin AORecipeKwargs TERecipeKwargs TorchContextParallelConfig "
                     "DeepSpeedSequenceParallelConfig"),
        **_names("overdrive.compat.enums", "ComputeEnvironment CustomDtype DynamoBackend SageMakerDistributedType "
                                           "BaseEnum EnumWithContains FP8BackendType"),
        **_names(_SURF, "FP8Format AmaxComputeAlgorithm ProfilerActivity MODEL_CONFIGS_TO_MEGATRON_PARSERS"),
        "logger": f"{_SURF}:dataclasses_logger",
        **_names(_REF, "parse_bert_config parse_glm4_moe_config parse_gpt2_config parse_llama_config parse_t5_config"),
        **_names(_OPS, "TensorInformation"),
        **_names("overdrive.compat.fsdp", "get_module_class_from_name"),
        **_names("overdrive.config.quantization", "BnbQuantizationConfig"),
        **_names("overdrive.strategies.deepspeed.config", "DeepSpeedPlugin"),
        **_names(_SURF, "add_model_config_to_megatron_parser"),
        **_names(_INT, "TorchTensorParallelConfig"),
        **_names("overdrive.compat.removed", "FP8RecipeKwargs MSAMPRecipeKwargs"),
    },
    "overdrive.utils.operations": {
        **_names(_OPS, "broadcast broadcast_object_list concatenate convert_to_fp32 find_batch_size find_device "
                       "gather gather_object get_data_structure honor_type ignorant_find_batch_size "
                       "initialize_tensors is_namedtuple is_tensor_information is_torch_tensor listify "
                       "pad_across_processes recursively_apply reduce send_to_device slice_tensors TensorInformation "
                       "DistributedOperationException get_shape"),
        **_names("overdrive.compat.operations", "CannotPadNestedTensorWarning GatheredParameters "
                                                "convert_outputs_to_fp32 pad_input_tensors ConvertOutputsToFp32 "
                                                "TENSOR_INT_TO_DTYPE TENSOR_TYPE_TO_INT chained_operation "
                                                "gather_tensor_shape is_torch_xpu_tensor verify_operation"),
        **_names(_REF, "copy_tensor_to_devices"),
    },
    "overdrive.utils.imports": {**_names(_IMP, _IS_AVAILABLE + " get_torch_accelerator_backend get_distributed_backend"),
                                **_names(_SURF, "USE_TORCH_XLA")},
    "overdrive.utils.constants": _names(_K, _CONSTANTS + " TORCH_DISTRIBUTED_BACKENDS DEVICE_VISIBLE_DEVICES_ENV_VARS"),
    "overdrive.utils.deepspeed": {
        **_names("overdrive.strategies.deepspeed.objects", "DummyOptim DummyScheduler DeepSpeedOptimizerWrapper "
                                                "DeepSpeedSchedulerWrapper get_active_deepspeed_plugin"),
        **_names("overdrive.strategies.deepspeed.hf_config", "HfDeepSpeedConfig"),
        **_names(_INT, "DeepSpeedEngineWrapper map_pytorch_optim_to_deepspeed"),
    },
    "overdrive.utils.fsdp_utils": {
        **_names("overdrive.compat.fsdp", "save_fsdp_model load_fsdp_model save_fsdp_optimizer load_fsdp_optimizer "
                                          "merge_fsdp_weights get_parameters_from_modules"),
        **_names("overdrive.compat.fsdp", "enable_fsdp_ram_efficient_loading disable_fsdp_ram_efficient_loading"),
        **_names(_INT, "fsdp2_switch_optimizer_parameters fsdp2_canonicalize_names get_fsdp2_grad_scaler "
                       "fsdp2_prepare_model fsdp2_load_full_state_dict fsdp2_apply_ac ensure_weights_retied "
                       "fsdp2_prepare_auto_wrap_policy"),
        "logger": f"{_SURF}:fsdp_utils_logger",
    },
    "overdrive.utils.other": {
        **_names(_MODEL, "clean_state_dict_for_safetensors get_module_children_bottom_up has_compiled_regions "
                         "is_compiled_module load model_has_dtensor recursive_getattr save get_model_tp_size"),
        **_names(_CHECKS, "check_os_kernel is_port_in_use get_free_port"),
        **_names(_INT, "get_pretty_name merge_dicts"),
        **_names(f"{_BM}.estimate", "convert_bytes"),
        **_names("overdrive.helpers.unwrap", "extract_model_from_parallel"), **_names(_OPS, "wait_for_everyone"),
        **_names("overdrive.helpers.imports", "is_torch_distributed_available"),
        **_names("overdrive.compat.regions", "compile_regions compile_regions_deepspeed compile_regions_fsdp2 "
                                             "has_repeated_blocks is_repeated_blocks"),
        **_names(_SURF, "TORCH_SAFE_GLOBALS np_core"), "logger": f"{_SURF}:other_logger",
    },
    "overdrive.utils.versions": {**_names(_CHECKS, "compare_versions is_torch_version"),
                                 **_names(_SURF, "torch_version")},
    "overdrive.utils.environment": {
        **_names(_ENV, "are_libraries_initialized check_cuda_fp8_capability check_cuda_p2p_ib_support "
                       "clear_environment convert_dict_to_env_variables get_cpu_distributed_information "
                       "get_current_device_type get_gpu_info get_int_from_env parse_choice_from_env "
                       "parse_flag_from_env purge_accelerate_environment set_numa_affinity str_to_bool"),
        **_names(_ENV, "patch_environment"),
        **_names(_SURF, "CPUInformation get_driver_version override_numa_affinity"),
        "logger": f"{_SURF}:environment_logger",
    },
    "overdrive.utils.launch": {
        **_names(_REF, "prepare_sagemager_args_inputs prepare_tpu"),
        **_names(_INT, "PrepareForLaunch prepare_deepspeed_cmd_env"),
        **_names(_CLI, "prepare_multi_gpu_env prepare_simple_launcher_cmd_env _convert_nargs_to_dict subprocess"),
        **_names(_SURF, "env_var_path_add prepare_extend_env_parallelism_config setup_fp8_env"),
        **_names("shutil", "which"),
    },
    "overdrive.utils.megatron_lm": {
        **_names(_REF, "AbstractTrainStep BertTrainStep GPTTrainStep T5TrainStep MegatronLMDummyDataLoader "
                       "MegatronLMDummyScheduler avg_losses_across_data_parallel_group MegatronEngine "
                       "MegatronLMOptimizerWrapper MegatronLMSchedulerWrapper finish_mpu_init model_provider_func "
                       "gather_across_data_parallel_groups"),
        **{name: f"{_REF}:megatron_lm_{name}" for name in (
            "initialize prepare_data_loader prepare_model_optimizer_scheduler prepare_optimizer prepare_scheduler"
        ).split()}},
    "overdrive.utils.transformer_engine": {
        **_names(_REF, "apply_fp8_autowrap contextual_fp8_autocast convert_model"),
        **_names("overdrive.compat.layers", "has_transformer_engine_layers"),
    },
    "overdrive.utils.ao": _names("overdrive.compat.layers", "convert_model_to_fp8_ao filter_first_and_last_linear_layers "
                                 "filter_linear_layers find_first_last_linear_layers has_ao_layers"),
    "overdrive.utils.bnb": {**_names("overdrive.compat.layers", "has_4bit_bnb_layers"),
                            **_names(_REF, "load_and_quantize_model get_quantized_model_device_map "
                                           "quantize_and_offload_8bit replace_with_bnb_layers"),
                            **_names(_SURF, "get_keys_to_not_convert get_parameter_device"),
                            "logger": f"{_SURF}:bnb_logger"},
    "overdrive.utils.torch_xla": _names(_REF, "install_xla"),
}

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
    **_names(_MODEL, "get_grad_scaler get_mixed_precision_context_manager is_peft_model"),
    **_names("overdrive.helpers.memory", "normalize_device get_accelerator_free_memory"),
    **_names(_K, "WEIGHTS_INDEX_NAME"), "logger": f"{_SURF}:modeling_logger",
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
    **_names(_MODEL, "_refuse_recurrent_layers_under_sequence_parallelism"),
    "logger": f"{_SURF}:big_modeling_logger",
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
    **_names("overdrive.helpers.logging", "tqdm"), **_names(_IMP, "is_package_available"),
    **_names(_CONFIG, "write_basic_config"),
    **_names(_MODEL, "is_peft_model get_grad_scaler get_mixed_precision_context_manager"),
    **_names("overdrive.data", "skip_first_batches"),
    **_names("overdrive.helpers.memory", "normalize_device get_accelerator_free_memory"),
    **_names(_REF, "MegatronEngine MegatronLMOptimizerWrapper MegatronLMSchedulerWrapper "
                   "gather_across_data_parallel_groups megatron_lm_initialize megatron_lm_prepare_data_loader "
                   "megatron_lm_prepare_model_optimizer_scheduler megatron_lm_prepare_optimizer "
                   "megatron_lm_prepare_scheduler"),
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
    "overdrive.data_loader": {
        **_names("overdrive.data", "BatchSamplerShard DataLoaderDispatcher DataLoaderShard DataLoaderStateMixin "
                                   "IterableDatasetShard SeedableRandomSampler SkipBatchSampler SkipDataLoader "
                                   "get_sampler prepare_data_loader skip_first_batches"),
        **_names(_SURF, "DataLoaderAdapter"), **_names(_REF, "MpDeviceLoaderWrapper"),
        "logger": f"{_SURF}:data_loader_logger"},
    "overdrive.checkpointing": {
        **_names(_K, "MODEL_NAME OPTIMIZER_NAME RNG_STATE_NAME SAFE_MODEL_NAME SAFE_WEIGHTS_NAME SAMPLER_NAME "
                     "SCALER_NAME SCHEDULER_NAME WEIGHTS_NAME"),
        **_names(_INT, "save_custom_state load_custom_state save_accelerator_state load_accelerator_state"),
        "logger": f"{_SURF}:checkpointing_logger",
    },
    "overdrive.parallelism_config": _names(_C, "ParallelismConfig"),
    "overdrive.commands": {},
    "overdrive.commands.accelerate_cli": _names(_MOD, "main"),
    "overdrive.commands.config": {
        **_names(_CONFIG, "default_config_file load_config_from_file"),
        **_names(_MOD, "config_command_parser default_command_parser get_config_parser update_command_parser"),
        "main": f"{_MOD}:config_main"},
    "overdrive.commands.config.config_args": {
        **_names(_CONFIG, "default_config_file load_config_from_file"),
        **_names(_CMD, "BaseConfig ClusterConfig SageMakerConfig"),
        **_names(_MOD, "cache_dir default_json_config_file default_yaml_config_file hf_cache_home")},
    "overdrive.commands.config.cluster": _names(_MOD, "get_cluster_input"),
    "overdrive.commands.config.config": {
        **_names(_MOD, "config_command config_command_parser get_user_input"),
        "description": f"{_MOD}:config_description", "main": f"{_MOD}:config_main"},
    "overdrive.commands.config.config_utils": _names(_MOD, "DYNAMO_BACKENDS SubcommandHelpFormatter"),
    "overdrive.commands.config.sagemaker": _names(_REF, "get_sagemaker_input"),
    "overdrive.commands.config.update": {
        **_names(_MOD, "update_command_parser update_config update_config_command"),
        "description": f"{_MOD}:update_description"},
    "overdrive.commands.launch": {
        **_names(_CLI, "launch_command_parser launch_command _validate_launch_command"),
        **_names(_MOD, "CustomHelpFormatter FORMAT clean_option options_to_group deepspeed_launcher"),
        **_names(_REF, "sagemaker_launcher tpu_launcher tpu_pod_launcher"),
        **_names(_K, "DEEPSPEED_MULTINODE_LAUNCHERS TORCH_DYNAMO_MODES"),
        **_names("overdrive.launchers.failure_report", "CHILD_STDERR_CHUNK_SIZE CHILD_STDERR_TAIL_CHUNKS"),
        "logger": f"{_SURF}:launch_logger", "main": f"{_MOD}:launch_main",
        # what Accelerate's launch module imports, so that scripts and tests can patch them there
        **_names(_CLI, "prepare_multi_gpu_env prepare_simple_launcher_cmd_env simple_launcher multi_gpu_launcher "
                       "psutil"),
        **_names(_INT, "PrepareForLaunch prepare_deepspeed_cmd_env"),
        **_names(_REF, "prepare_sagemager_args_inputs prepare_tpu"),
        **_names(_ENV, "check_cuda_p2p_ib_support convert_dict_to_env_variables str_to_bool get_int_from_env"),
        **_names(_IMP, "get_distributed_backend get_torch_accelerator_backend is_bf16_available "
                       "is_deepspeed_available is_rich_available is_sagemaker_available is_torch_xla_available"),
        **_names(_ENV, "patch_environment"),
        **_names(_C, "DistributedType"), **_names("overdrive.compat.enums", "ComputeEnvironment"),
        **_names(_CONFIG, "default_config_file load_config_from_file"),
        **_names(_CMD, "SageMakerConfig"), **_names(_MOD, "DYNAMO_BACKENDS CustomArgumentParser")},
    "overdrive.commands.merge": {**_names(_MOD, "merge_command merge_command_parser"),
                                 "description": f"{_MOD}:merge_description", "main": f"{_MOD}:merge_main"},
    "overdrive.commands.utils": _names(_MOD, "CustomArgumentGroup CustomArgumentParser"),
    "overdrive.commands.env": {**_names(_CMD, "env_command_parser env_command"), **_names("shutil", "which"),
                               "main": f"{_MOD}:env_main"},
    "overdrive.commands.test": {**_names(_CMD, "test_command_parser test_command"), "main": f"{_MOD}:test_main"},
    "overdrive.commands.estimate": {
        **_names(_CMD, "estimate_command_parser estimate_command gather_data add_timm_hub_prefix verify_on_hub"),
        **_names(_MOD, "check_has_model create_ascii_table estimate_training_usage"),
        **_names(f"{_BM}.estimate", "create_empty_model"), "main": f"{_MOD}:estimate_main"},
    "overdrive.commands.to_fsdp2": {
        **_names(_CMD, "to_fsdp2_command_parser to_fsdp2_command convert_config_to_fsdp2"),
        **_names(_MOD, "ARGUMENT_KEY_MAPPING ARGUMENT_VALUE_MAPPING"), **_names(_CMD, "load_config"),
        **_names("overdrive.compat.enums", "ConversionStatus"), "logger": f"{_SURF}:to_fsdp2_logger"},
    "overdrive.commands.tpu": {**_names(_CMD, "tpu_command_parser tpu_command_launcher"), "main": f"{_MOD}:tpu_main"},
    "overdrive.commands.config.default": {
        **_names(_CONFIG, "write_basic_config"),
        **_names(_MOD, "default_command_parser default_config_command"),
        "description": f"{_MOD}:default_description"},
    "overdrive.test_utils": _names("overdrive.compat.testing", "RegressionDataset RegressionModel"),
    "overdrive.test_utils.testing": _names("overdrive.compat.testing", "require_cpu slow"),
    "overdrive.test_utils.training": _names("overdrive.compat.testing", "RegressionDataset RegressionModel"),
}

#: Accelerate names overdrive does not provide: name (or (overdrive module, name)) -> why. Only Accelerate's own
#: test helpers: every other public name of the followed release resolves (tests/compat/test_accelerate_surface.py)
ABSENT: dict[str | tuple[str, str], str] = {
    ("overdrive.test_utils.testing", "*"): "Accelerate's own test-suite helpers; use pytest markers",
    ("overdrive.test_utils.training", "*"): "Accelerate's own test-suite helpers",
    ("overdrive.test_utils", "*"): "Accelerate's own test-suite helpers",
    "mocked_dataloaders": "Accelerate's own test data (downloads GLUE)",
    "mocked_dataloaders_for_autoregressive_models": "Accelerate's own test data (downloads a dataset)",
}

# -- names Accelerate removed, kept working ------------------------------------------------------------------------
_PIPPY = ("1.16.0", "overdrive's own pipeline inference stays: overdrive.prepare_pippy (docs/pipeline.md)")
_FP8 = ("1.16.0", "use TERecipeKwargs or AORecipeKwargs (torchao) with mixed_precision='fp8'")
_CHECK = ("1.16.0", "Accelerate 1.16.0 dropped it with the support it checked for")
_FLOOR = ("1.16.0", "Accelerate 1.16.0 needs torch >= 2.6.0, above every such floor")
_REMOVED_CONSTANTS = ("BETA_CP_AVAILABLE_PYTORCH_VERSION BETA_TP_AVAILABLE_PYTORCH_VERSION DTENSOR_PYTORCH_VERSION "
                      "ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION FSDP2_PYTORCH_VERSION FSDP_PYTORCH_VERSION "
                      "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION XPU_PROFILING_AVAILABLE_PYTORCH_VERSION").split()
_REMOVED_CHECKS = ("is_msamp_available", "is_pippy_available", "is_weights_only_available")

#: Accelerate names removed in a release, kept working at their old paths for scripts written before it; reading
#: one warns (DeprecationWarning) naming the release and what to use: overdrive module -> name -> (release, instead).
#: The names of ``overdrive`` itself warn only when read as ``accelerate.<name>`` (``overdrive.prepare_pippy`` is
#: overdrive's own pipeline inference).
REMOVED: dict[str, dict[str, tuple[str, str]]] = {
    "overdrive": {"prepare_pippy": _PIPPY},
    "overdrive.inference": dict.fromkeys(_INFERENCE, _PIPPY),
    "overdrive.utils": {**dict.fromkeys(("FP8RecipeKwargs", "MSAMPRecipeKwargs"), _FP8),
                        **dict.fromkeys(_REMOVED_CHECKS, _CHECK), **dict.fromkeys(_REMOVED_CONSTANTS, _FLOOR)},
    "overdrive.utils.dataclasses": dict.fromkeys(("FP8RecipeKwargs", "MSAMPRecipeKwargs"), _FP8),
    "overdrive.utils.imports": dict.fromkeys(_REMOVED_CHECKS, _CHECK),
    "overdrive.utils.constants": dict.fromkeys(_REMOVED_CONSTANTS, _FLOOR),
}
#: Accelerate modules removed in a release, kept importable under the alias with a DeprecationWarning
REMOVED_MODULES: dict[str, tuple[str, str]] = {"accelerate.inference": _PIPPY}


def removed_warning(dotted: str, release: str, instead: str) -> str:
    """The DeprecationWarning's text for ``dotted`` (``accelerate.utils.FP8RecipeKwargs``), removed in ``release``."""
    return (f"{dotted} was removed in Accelerate {release}; overdrive keeps it working for scripts written for "
            f"earlier releases: {instead}")

