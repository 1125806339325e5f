"""The `lmcore` console script: `main.py` parses the command line and keeps the exit-status
contract; each command is one module here with `add_parser(sub)` and `run(args) -> int`, its
heavy imports inside `run()` so that `lmcore COMMAND --help` never imports torch.
"""
