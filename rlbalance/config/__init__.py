"""Configuration: one frozen, typed, nested config per run (``Config``, its sections), how it is built from
defaults < preset < config file < command line (``build``, ``load``), and the presets per env family.

The names below are the package's interface (``from rlbalance import config as C; C.build(...)``)."""

from rlbalance.config.ray_section import RAY_PLACEMENTS, RayConfig
from rlbalance.config.schema import (
                                     SECTIONS,
                                     Config,
                                     build,
                                     coerce,
                                     env_id_of,
                                     field_docs,
                                     fit_buffers,
                                     from_dict,
                                     load,
                                     merge,
                                     parse_set,
                                     read_file,
)
from rlbalance.config.sections import (
                                     AGENTS,
                                     DEVICES,
                                     ENV_BACKENDS,
                                     INFERENCE_MODES,
                                     MODELS,
                                     MODES,
                                     WANDB_MODES,
                                     ActorsConfig,
                                     EnvConfig,
                                     InferenceConfig,
                                     LearnerConfig,
                                     R2D2Config,
                                     RunConfig,
                                     TelemetryConfig,
)
from rlbalance.core.errors import ConfigError

__all__ = ["AGENTS", "DEVICES", "ENV_BACKENDS", "INFERENCE_MODES", "MODELS", "MODES", "RAY_PLACEMENTS", "SECTIONS",
           "WANDB_MODES", "ActorsConfig", "Config", "ConfigError", "EnvConfig", "InferenceConfig", "LearnerConfig",
           "R2D2Config", "RayConfig", "RunConfig", "TelemetryConfig", "build", "coerce", "env_id_of", "field_docs",
           "fit_buffers", "from_dict", "load", "merge", "parse_set", "read_file"]
