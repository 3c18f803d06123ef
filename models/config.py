"""Config validation shared by the architectures: every failure names the config.json field."""


class ConfigError(ValueError):
    pass


def require(ok: bool, field: str, why: str) -> None:
    if not ok:
        raise ConfigError(f"config.json: field '{field}': {why}")
