"""Train a captioner: a thin wrapper over `captioner.training.fit.fit` (same as `captioner train`).

    python scripts/train.py configs/shapes_lstm.yaml train.epochs=5 [--resume]
"""

import sys

from captioner.apps.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
