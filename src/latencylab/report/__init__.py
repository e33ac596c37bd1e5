"""Rendering of results: terminal tables now; HTML and compare later."""
