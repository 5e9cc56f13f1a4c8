"""What people run: the `captioner` command line and the Gradio demo."""
