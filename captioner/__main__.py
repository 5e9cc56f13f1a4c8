"""`python -m captioner ...`, which is also what `torchrun -m captioner train CONFIG` runs."""

import sys

from captioner.apps.cli import command_line

sys.exit(command_line())
