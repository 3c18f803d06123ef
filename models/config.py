"""Config validation shared by the architectures: every failure names the config.json field."""


class ConfigError(ValueError):
    pass


# RoPE variants whose frequencies do not depend on the sequence length: day0 precomputes the table
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def require(ok: bool, field: str, why: str) -> None:
    if not ok:
        raise ConfigError(f"config.json: field '{field}': {why}")


def transformers_config(config_class, fields: dict, model_type: str):
    """`config_class(**fields)`; transformers' strict validation error becomes a ConfigError naming
    the config and what it complains about."""
    try:
        return config_class(**fields)
    except Exception as e:
        raise ConfigError(f"config.json: invalid {model_type} config: {e}") from None


def require_static_rope(cfg) -> None:
    rope = cfg.rope_parameters or {}
    require(
        rope.get("rope_type", "default") in STATIC_ROPE_TYPES,
        "rope_parameters.rope_type",
        f"'{rope.get('rope_type')}' is not supported (supported: {', '.join(STATIC_ROPE_TYPES)}; "
        f"day0 precomputes the rope table, so frequencies may not depend on the sequence length)",
    )


def require_layer_kinds(field: str, values, kinds: tuple[str, ...], n: int) -> None:
    """`field` is a list of one of `kinds` per layer (n layers)."""
    require(isinstance(values, list) and len(values) == n, field, f"needs one entry per layer ({n})")
    bad = sorted({str(v) for v in values if v not in kinds})
    require(not bad, field, f"unsupported values {bad} (supported: {', '.join(kinds)})")


def require_group_routing(cfg, experts: int, group_field: str, per_token_field: str) -> None:
    """DeepSeek's group-limited routing (cfg.n_group, cfg.topk_group, cfg.num_experts_per_tok):
    `n_group` groups of >= 2 of the `experts` each, `topk_group` of them chosen per token, the
    token's experts picked from those; `group_field`/`per_token_field` as config.json names them."""
    n_group, topk_group, per_token = cfg.n_group, cfg.topk_group, cfg.num_experts_per_tok
    require(n_group > 0 and experts % n_group == 0, group_field, f"must divide the number of experts ({experts})")
    require(experts // n_group >= 2, group_field, "each group needs at least 2 experts")
    require(0 < topk_group <= n_group, "topk_group", f"must be in [1, {group_field}]")
    require(
        0 < per_token <= topk_group * (experts // n_group),
        per_token_field,
        "must be in [1, the experts of topk_group groups]",
    )
