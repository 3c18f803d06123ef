"""Config validation shared by the architectures: every failure names the config.json field."""

import json
import math
from dataclasses import dataclass


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
        why = " ".join(line.strip() for line in str(e).splitlines() if line.strip())  # one line
        raise ConfigError(f"config.json: invalid {model_type} config: {why}") from None


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


# -- numbers ------------------------------------------------------------------------------------
# Every number an architecture reads from config.json, checked on the raw dict before transformers'
# config class sees it (its messages name no nesting and let 0, negatives, NaN and infinity through,
# which build a model that computes nonsense) and again on the parsed config (defaults, derived
# values). A kind is one of the keys of _KINDS; a dict is a nested object (null or a JSON object)
# whose own fields are checked, named by their path ("text_config.linear_attn_config.head_dim").

MAX_INT = 2**31 - 1  # no size or count of a model is larger; beyond it index arithmetic overflows


def _is_int(v) -> bool:
    return type(v) is int  # bool is an int subclass, and 64.0 is no size


def _is_number(v) -> bool:
    return type(v) in (int, float) and (type(v) is int or math.isfinite(v))


_KINDS = {
    "int>=1": (lambda v: _is_int(v) and 1 <= v <= MAX_INT, "must be an integer >= 1"),
    "int>=0": (lambda v: _is_int(v) and 0 <= v <= MAX_INT, "must be an integer >= 0"),
    "null|int>=1": (lambda v: v is None or (_is_int(v) and 1 <= v <= MAX_INT), "must be null or an integer >= 1"),
    "null|int>=0": (lambda v: v is None or (_is_int(v) and 0 <= v <= MAX_INT), "must be null or an integer >= 0"),
    ">0": (lambda v: _is_number(v) and v > 0, "must be a finite number > 0"),
    "finite": (_is_number, "must be a finite number"),
    "null|finite": (lambda v: v is None or _is_number(v), "must be null or a finite number"),
    "token": (
        lambda v: (
            v is None
            or (_is_int(v) and 0 <= v <= MAX_INT)
            or (isinstance(v, list) and all(_is_int(t) and 0 <= t <= MAX_INT for t in v))
        ),
        "must be null, a token id >= 0 or a list of them",
    ),
}

ROPE_FIELDS = {
    "rope_theta": ">0",
    "factor": ">0",
    "original_max_position_embeddings": "int>=1",
    "attention_factor": ">0",
    "beta_fast": "finite",
    "beta_slow": "finite",
    "mscale": "finite",
    "mscale_all_dim": "finite",
    "low_freq_factor": ">0",
    "high_freq_factor": ">0",
}
COMMON_FIELDS = {
    "vocab_size": "int>=1",
    "hidden_size": "int>=1",
    "intermediate_size": "int>=1",
    "num_hidden_layers": "int>=1",
    "num_attention_heads": "int>=1",
    "num_key_value_heads": "null|int>=1",
    "max_position_embeddings": "int>=1",
    "rms_norm_eps": ">0",
    "rope_theta": ">0",
    "rope_parameters": ROPE_FIELDS,
    "rope_scaling": ROPE_FIELDS,
    "eos_token_id": "token",
}
# multi-head latent attention (head_dim: transformers sets it to qk_rope_head_dim, 0 when NoPE)
MLA_FIELDS = {
    "kv_lora_rank": "int>=1",
    "q_lora_rank": "null|int>=1",
    "qk_nope_head_dim": "int>=1",
    "qk_rope_head_dim": "int>=0",
    "v_head_dim": "int>=1",
    "head_dim": "null|int>=0",
}
# DeepSeek's MoE (kimi_linear's config names some of these differently; both names are listed)
MOE_FIELDS = {
    "moe_intermediate_size": "int>=1",
    "n_routed_experts": "int>=1",
    "num_experts_per_tok": "int>=1",
    "n_group": "int>=1",
    "topk_group": "int>=1",
    "n_shared_experts": "int>=0",
    "first_k_dense_replace": "int>=0",
    "routed_scaling_factor": ">0",
}
DSA_FIELDS = {"index_n_heads": "int>=1", "index_head_dim": "int>=1", "index_topk": "int>=1"}
KDA_SUB_FIELDS = {"head_dim": "int>=1", "num_heads": "int>=1", "short_conv_kernel_size": "int>=1"}
KDA_FIELDS = {
    "linear_head_dim": "int>=1",
    "linear_num_heads": "int>=1",
    "linear_conv_kernel_dim": "int>=1",
    "linear_attn_config": KDA_SUB_FIELDS,
}


@dataclass(frozen=True)
class NumberFields:
    """The numbers an architecture reads from config.json (its module's NUMBER_FIELDS): field ->
    kind (a key of _KINDS) or a dict for a nested object. `root_key`: the key holding the text
    model's fields when it is an object (glm5_next's text_config); `own`: fields its parse_config
    checks itself on the raw dict, naming them its way (they are still checked after parsing)."""

    fields: dict
    root_key: str | None = None
    own: tuple[str, ...] = ()


def _shown(v) -> str:
    try:
        text = json.dumps(v)  # as config.json writes it: null, true, "64", NaN, Infinity
    except (TypeError, ValueError):
        text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_fields(values, fields: dict, prefix: str, get) -> None:
    for name, kind in fields.items():
        present, v = get(values, name)
        if not present:
            continue
        field = prefix + name
        if isinstance(kind, dict):
            if v is None:
                continue
            require(isinstance(v, dict), field, f"must be a JSON object (got {_shown(v)})")
            _check_fields(v, kind, field + ".", _get_key)
        else:
            ok, why = _KINDS[kind]
            if _is_int(v) and v > MAX_INT:
                why = f"must be at most {MAX_INT}"
            require(ok(v), field, f"{why} (got {_shown(v)})")


def _get_key(d: dict, name: str):
    return (name in d, d.get(name))


def _get_attr(cfg, name: str):
    try:
        return (True, getattr(cfg, name))
    except AttributeError:
        return (False, None)


def require_numbers(raw: dict, spec: NumberFields) -> None:
    """The numbers of a config.json dict (`spec`: its architecture's NUMBER_FIELDS) are in range:
    sizes and counts integers >= 1 (>= 0 where 0 means none), epsilons, rope thetas and scales
    finite and > 0. A ConfigError names the first bad field by its path in config.json."""
    root_key = spec.root_key
    fields = {k: v for k, v in spec.fields.items() if k not in spec.own}
    root, prefix = raw, ""
    if root_key is not None and raw.get(root_key) is not None:
        require(isinstance(raw[root_key], dict), root_key, f"must be a JSON object (got {_shown(raw[root_key])})")
        root, prefix = raw[root_key], root_key + "."
    _check_fields(root, fields, prefix, _get_key)


def require_parsed_numbers(raw: dict, cfg, spec: NumberFields) -> None:
    """require_numbers on the parsed config's attributes (transformers' defaults and derived values:
    a head_dim computed as hidden_size // num_attention_heads, say); nested objects are checked by
    require_numbers only."""
    root_key, fields = spec.root_key, spec.fields
    prefix = root_key + "." if root_key is not None and isinstance(raw.get(root_key), dict) else ""
    _check_fields(cfg, {k: v for k, v in fields.items() if not isinstance(v, dict)}, prefix, _get_attr)
