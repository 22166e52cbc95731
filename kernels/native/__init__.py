"""The native-build room: every build of device code orchestrate makes, and what they share.

    sources.py     where the third-party trees are (an option, $ORCHESTRATE_THIRD_PARTY,
                   ../shared/third_party beside a checkout, else the pinned commits `orchestrate
                   sources fetch` clones), and the digest of what a firmware reads
    toolchains.py  the programs a build runs, found once each (host C/C++, arm-none-eabi, flatc,
                   torchgen's tables, QEMU) with their variables, and the parallel jobs
    cores.py       the Cortex-M cores as data (cores.yaml): ISA tier (the CMSIS-NN kernels:
                   scalar, DSP, MVE), compiler flags, architecture
    cache.py       cache folders, input digests, atomic writes and folder publication
    operators.py   the kernel libraries, a program's operator selection, ExecuTorch's codegen for
                   it, flatc's schema headers, the runtime and CMSIS-NN sources
    linker.py      the regions a firmware links into, the linker sections every firmware shares,
                   a linked ELF's symbols and sizes
    errors.py      what a build can fail with ("not run" when it cannot happen here)
    host.py        the host runtime: the Cortex-M kernels, CMSIS-NN and the Ethos-U backend as one
                   shared library for this machine
    runner.py      the runner firmware's cross build, from plain data (`RunnerSpec`)

What reads a platform into a build's input lives with the platforms (platforms/firmware_recipe.py);
the project `orchestrate firmware` writes lives with that verb (orchestrator/firmware/).
"""
