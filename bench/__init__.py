"""danka's benchmarks: ``python -m bench <subcommand> [args]`` from the repository root.

Each benchmark is a module with ``main(argv) -> int``; ``bench/__main__.py`` lists them.
Results go to ``bench/results/`` (one current JSON per benchmark, ``INDEX.md`` says what
each measured). The modules are grouped by the question they answer: ``speed/``,
``memory/``, ``learning/``, ``peers/`` (vs another framework); ``lib/`` holds what two
groups share, ``gpu/`` the GPU session scripts. Every place a benchmark reaches into
danka's trainer internals is in ``lib/danka_side.py``.
"""
