"""The app's own CSS (passed to `launch(css=...)`): fixes of Gradio 6.31's defaults that a user trips over.

- Galleries: Gradio gives a gallery one column per picture up to `columns`, so a single tile was drawn at the
  gallery's full width (580 px) inside its 260-px height, and half of it was cut off; a fixed 104-px minimum cell
  that fills the row shows every picture whole at any width (the cells keep the pictures' square aspect, and the
  gallery scrolls when there are many).
- A disabled button looks disabled: the red "stop" variant was drawn in full colour even while inactive.
"""

APP_CSS = """
#doc-gallery .grid-container, #video-frames .grid-container {
  grid-template-columns: repeat(auto-fill, minmax(104px, 1fr)) !important;
}
#doc-page-picker .grid-container { grid-template-columns: repeat(auto-fill, minmax(64px, 1fr)) !important; }
button:disabled, button[disabled] { opacity: 0.4; cursor: not-allowed; filter: grayscale(0.7); }
"""
