"""`python -m captioner ...`, which is also what `torchrun -m captioner train CONFIG` runs."""

import sys

from captioner.cli import main

sys.exit(main())
