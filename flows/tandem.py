"""The `tandem` command: one word per flow, each exactly its `python -m flows.*` form (the same parser, the same exit
codes), and `node`, one node of a job as `python -m launch.node` (no Prefect), so a newcomer types what peers' tools
taught them (`llamafactory-cli train`, `axolotl train`):

    tandem finetune --config tiny-cpu --set train.max_steps=50     # python -m flows.finetune ...
    tandem plan --config qwen-7b-lora                              # python -m flows.finetune --plan ...
    tandem prepare --config tiny-cpu                               # python -m flows.prepare ...
    tandem registry list tandem-tiny                               # python -m flows.registry ...
    tandem submit finetune/manual --wait                           # python -m flows.submit ...
    NODE_RANK=1 NNODES=2 ... tandem node --spec RUN/spec.json      # python -m launch.node ...
"""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import PackageNotFoundError, version

# command -> (the module whose main() it runs, the arguments it puts first, what it does)
COMMANDS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "finetune": ("flows.finetune", (), "run the whole pipeline: prepare, train, evaluate, register"),
    "plan": ("flows.finetune", ("--plan",), "print a config's memory and disk plan; runs nothing"),
    "prepare": ("flows.prepare", (), "stage a dataset (and write a run's spec for launching by hand)"),
    "registry": ("flows.registry", (), "list, show and mirror registered models"),
    "submit": ("flows.submit", (), "start a run of a deployed pipeline, as the UI's form does"),
    "node": ("launch.node", (), "run one node of a job by hand (its spec.json)"),
}


def usage() -> str:
    """`tandem --help`: every command with what it does and the module form it stands for."""
    width = max(map(len, COMMANDS))
    rows = [
        f"  {name:<{width}}  {what} (python -m {module}{''.join(' ' + a for a in first)})"
        for name, (module, first, what) in COMMANDS.items()
    ]
    return "\n".join(
        [
            "usage: tandem COMMAND [ARGS...]   (tandem COMMAND --help: the command's own options)",
            "",
            "commands:",
            *rows,
            "",
            "options:",
            "  -h, --help  show this message and exit",
            "  --version   show Tandem's version and exit",
        ]
    )


def installed_version() -> str:
    """The installed package's version (a checkout run without installing has none)."""
    try:
        return version("tandem")
    except PackageNotFoundError:
        return "unknown (not installed: pip install .)"


def main(argv: list[str] | None = None) -> int:
    """Run `tandem COMMAND ARGS...` as `python -m MODULE ARGS...` (COMMANDS: flows.COMMAND, launch.node)."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    if args[0] == "--version":
        print(f"tandem {installed_version()}")
        return 0
    if args[0] not in COMMANDS:
        print(f"tandem: unknown command {args[0]!r}; one of: {', '.join(COMMANDS)} (tandem --help)", file=sys.stderr)
        return 2
    module, first, _ = COMMANDS[args[0]]
    entry = importlib.import_module(module).main
    code: int = entry([*first, *args[1:]])
    return code


if __name__ == "__main__":
    sys.exit(main())
