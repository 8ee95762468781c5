"""Log the same values through Accelerator(log_with=NAME) for each tracker named on the command line, every
library kept offline (the test sets the environment that ``offline_env`` makes, pointing each at a folder),
then exit. The tests import ``offline_env`` and ``init_kwargs`` from here too."""

from __future__ import annotations

import os
import sys

LOSSES = [1.5, 0.75, 0.25]


def offline_env(root: str | os.PathLike[str]) -> dict[str, str]:
    """The environment variables that keep Comet, ClearML and Trackio offline (and the Hugging Face Hub, which
    Trackio uses), each writing under ``root/<name>``; SwanLab's switch is in ``init_kwargs``. ClearML reads
    ``root/clearml.conf`` (written here): it reports from a thread rather than its subprocess, whose close
    waits out its flush periods (~11 s)."""
    root = os.fspath(root)
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "clearml.conf"), "w") as conf:
        conf.write("sdk { development { report_use_subprocess: false } }\n")
    return {"COMET_OFFLINE_DIRECTORY": os.path.join(root, "comet_ml"), "COMET_DISABLE_AUTO_LOGGING": "1",
            "CLEARML_OFFLINE_MODE": "1", "CLEARML_CACHE_DIR": os.path.join(root, "clearml"),
            "CLEARML_CONFIG_FILE": os.path.join(root, "clearml.conf"),
            "TRACKIO_DIR": os.path.join(root, "trackio"), "HF_HOME": os.path.join(root, "hf"), "HF_HUB_OFFLINE": "1"}


def init_kwargs(name: str, folder: str) -> dict:
    """Each library's offline switch, and its extras (code, environment, system monitors) off for speed."""
    if name == "comet_ml":
        import comet_ml

        config = comet_ml.ExperimentConfig(log_code=False, log_env_details=False, log_env_gpu=False,
                                           log_env_cpu=False, log_env_host=False, log_git_metadata=False,
                                           log_git_patch=False, auto_output_logging=False,
                                           auto_metric_logging=False, log_env_network=False, log_env_disk=False)
        return {"online": False, "experiment_config": config}
    if name == "clearml":
        # no framework hooks, and no repository detection (it runs git in a thread that close() waits for)
        frameworks = dict.fromkeys(("matplotlib", "tensorflow", "tensorboard", "pytorch", "xgboost", "scikit",
                                    "fastai", "lightgbm", "hydra", "detect_repository", "tfdefines", "joblib",
                                    "megengine", "catboost", "gradio", "jsonargparse"), False)
        return {"auto_connect_frameworks": frameworks, "auto_resource_monitoring": False,
                "auto_connect_streams": False}
    if name == "swanlab":
        return {"mode": "offline", "logdir": folder}
    return {}


def main(folder: str, names: list[str]) -> None:
    from overdrive import Accelerator

    for name in names:
        accelerator = Accelerator(cpu=True, log_with=name)
        accelerator.init_trackers("overdrive_offline", config={"lr": 0.1, "layers": 2},
                                  init_kwargs={name: init_kwargs(name, f"{folder}/{name}")})
        for step, loss in enumerate(LOSSES):
            accelerator.log({"loss": loss, "eval_acc": 0.5 + step}, step=step)
        accelerator.end_training()
        print("LOGGED", name, flush=True)


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(150, exit=True)  # a library that hangs shows where, instead of a timeout
    main(sys.argv[1], sys.argv[2:])
