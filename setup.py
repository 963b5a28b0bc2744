"""The C part of gpuq: the fork server's loop and the per-job supervisor (gpuq/agent/native).

Everything else is declared in pyproject.toml; setuptools reads both.
"""

from setuptools import Extension, setup

NATIVE = "gpuq/agent/native"

setup(
    ext_modules=[
        Extension(
            "gpuq.agent._supervise",
            sources=[f"{NATIVE}/{name}.c" for name in ("forkserver", "supervisor", "proc", "json")],
            depends=[f"{NATIVE}/supervise.h"],
            extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra"],
        )
    ]
)
