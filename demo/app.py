"""The Gradio demo as a script: `python demo/app.py [CHECKPOINT ...] [--host H --port P]`.

The same as `captioner demo`: with no checkpoint it serves the export at runs/default_model, else
the model packaged with captioner, else the quickstart's trained model (it never trains). Run it
from the project folder.
"""

import sys

from captioner.apps.cli import main

if __name__ == "__main__":
    sys.exit(main(["demo", *sys.argv[1:]]))
