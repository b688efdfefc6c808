"""The Gradio chat (app.py launches it): layout, handlers, and the pieces they render."""
