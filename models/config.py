"""Config validation shared by the architectures: every failure names the config.json field."""


class ConfigError(ValueError):
    pass


def require(ok: bool, field: str, why: str) -> None:
    if not ok:
        raise ConfigError(f"config.json: field '{field}': {why}")


def require_layer_kinds(field: str, values, kinds: tuple[str, ...], n: int) -> None:
    """`field` is a list of one of `kinds` per layer (n layers)."""
    require(isinstance(values, list) and len(values) == n, field, f"needs one entry per layer ({n})")
    bad = sorted({str(v) for v in values if v not in kinds})
    require(not bad, field, f"unsupported values {bad} (supported: {', '.join(kinds)})")


def require_group_routing(
    experts: int, n_group: int, topk_group: int, per_token: int, *, group_field: str, per_token_field: str
) -> None:
    """DeepSeek's group-limited routing: `n_group` groups of >= 2 experts each, `topk_group` of
    them chosen per token, `per_token` experts picked from those; fields named as config.json does."""
    require(n_group > 0 and experts % n_group == 0, group_field, f"must divide the number of experts ({experts})")
    require(experts // n_group >= 2, group_field, "each group needs at least 2 experts")
    require(0 < topk_group <= n_group, "topk_group", f"must be in [1, {group_field}]")
    require(
        0 < per_token <= topk_group * (experts // n_group),
        per_token_field,
        "must be in [1, the experts of topk_group groups]",
    )
