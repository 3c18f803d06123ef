"""model_type -> architecture. An architecture module provides MODEL_TYPE, NUMBER_FIELDS (a
models.config.NumberFields: the config numbers it reads), parse_config(raw) and a model class (a
models.base.CausalLM) with `empty(cfg, max_seq_len, dtypes, cache_dtype)`, `state_specs()`,
`empty_state()`, `step()`."""

from day0.models import deepseek_v32, glm5_next, gpt_oss, kimi_linear
from day0.models.config import ConfigError, require_numbers, require_parsed_numbers

ARCHITECTURES = {
    deepseek_v32.MODEL_TYPE: (deepseek_v32, deepseek_v32.DeepseekV32),
    glm5_next.MODEL_TYPE: (glm5_next, glm5_next.Glm5Next),
    gpt_oss.MODEL_TYPE: (gpt_oss, gpt_oss.GptOss),
    kimi_linear.MODEL_TYPE: (kimi_linear, kimi_linear.KimiLinear),
}


def architecture(raw_config: dict):
    """(parsed config, model class) for a config.json dict, or a ConfigError naming model_type or
    the first field whose value is out of range (the architecture's NUMBER_FIELDS), before any model
    is built."""
    if not isinstance(raw_config, dict):
        raise ConfigError(f"config.json: must be a JSON object (got a JSON {type(raw_config).__name__})")
    model_type = raw_config.get("model_type")
    if model_type not in ARCHITECTURES:
        raise ConfigError(
            f"config.json: field 'model_type': '{model_type}' is not supported "
            f"(supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    module, model_cls = ARCHITECTURES[model_type]
    require_numbers(raw_config, module.NUMBER_FIELDS)
    cfg = module.parse_config(raw_config)
    require_parsed_numbers(raw_config, cfg, module.NUMBER_FIELDS)
    return cfg, model_cls


def build_eager(checkpoint_dir, max_seq_len: int, cache_dtype: str = "float32"):
    """The eager PyTorch model with the checkpoint's weights (streamed shard by shard)."""
    from day0.models.checkpoint import Checkpoint

    ckpt = Checkpoint.open(checkpoint_dir)
    cfg, model_cls = architecture(ckpt.config)
    model = model_cls.empty(cfg, max_seq_len, cache_dtype=cache_dtype)
    ckpt.check_expected(model.parameter_shapes())
    ckpt.load_into(dict(model.named_parameters()))
    return model
