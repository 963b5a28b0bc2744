"""`python -m gpuq.cli.main ARGS`: the `gpuq` command as a module, exactly as scripts/gpuq
runs it (through the CLI helper when one answers: gpuq.cli.fast.stub). Tests and benchmarks
call the CLI so, with the interpreter they run under; this module defines nothing."""

if __name__ == "__main__":
    from gpuq.cli.fast.stub import main

    main()
