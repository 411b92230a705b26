"""The Gradio app (`vl app`): a thin shell over `vl.Engine`'s token stream. Nothing is done at import time."""
