"""The C parts of gpuq: the fork server's loop and the per-job supervisor (gpuq/agent/native),
and the `gpuq` command itself (gpuq/cli/fast/stub.c).

The `gpuq` command is a small C program, built here into the scripts folder, so that a call
does not start Python when a CLI helper is warm (gpuq/cli/fast/__init__.py has the latency
budget); the Python stub it falls back to, scripts/gpuq-py, is installed beside it as
`gpuq-py` (its `#!python` line rewritten by pip, as for any script). Everything else is
declared in pyproject.toml; setuptools reads both.
"""

import os
import sys

from setuptools import Distribution, Extension, setup

# setuptools' own build_scripts (setuptools has no subclass of it)
build_scripts = Distribution().get_command_class("build_scripts")

NATIVE = "gpuq/agent/native"
C_STUB = "gpuq/cli/fast/stub.c"
CFLAGS = ["-std=gnu11", "-O2", "-Wall", "-Wextra"]


class BuildScripts(build_scripts):  # type: ignore[misc,valid-type]
    """The scripts (scripts/gpuq-py), and the C stub compiled into the same folder as `gpuq`:
    install_scripts installs everything there, in a wheel and in an editable install alike."""

    def run(self) -> None:
        super().run()
        # setuptools' own distutils, which importing setuptools put in place
        from distutils.ccompiler import new_compiler
        from distutils.sysconfig import customize_compiler

        compiler = new_compiler()
        customize_compiler(compiler)
        build_temp = os.path.join(self.get_finalized_command("build").build_temp, "gpuq-stub")
        # Python 3.15 turns UTF-8 mode on by default (PEP 686): the stub guesses it as Python does
        utf8_default = "1" if sys.version_info >= (3, 15) else "0"
        objects = compiler.compile(
            [C_STUB],
            output_dir=build_temp,
            macros=[("GPUQ_UTF8_DEFAULT", utf8_default)],
            extra_postargs=CFLAGS,
        )
        self.mkpath(self.build_dir)
        compiler.link_executable(objects, "gpuq", output_dir=self.build_dir)


setup(
    ext_modules=[
        Extension(
            "gpuq.agent._supervise",
            sources=[
                f"{NATIVE}/{name}.c"
                for name in ("forkserver", "supervisor", "proc", "cgroups", "json")
            ],
            depends=[f"{NATIVE}/supervise.h"],
            extra_compile_args=CFLAGS,
        )
    ],
    cmdclass={"build_scripts": BuildScripts},
)
