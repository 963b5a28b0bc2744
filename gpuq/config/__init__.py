"""One typed settings object, read from TOML, then environment, then command-line flags.

The rooms: gpuq.config.settings (the dataclasses, their defaults and the paths derived from
them), gpuq.config.loading (finding and reading the config file, the environment overrides,
building each section) and gpuq.config.value_checks (a type and a range for every setting).
QOS tiers and the scheduler's priority policy are domain values (gpuq.domain.policy): config
reads them from the file and builds them. This package re-exports nothing.
"""
