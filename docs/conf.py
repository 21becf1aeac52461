"""Sphinx configuration: Markdown pages (MyST); built in CI with -W (warnings are errors)."""

project = "fp8lab"
author = "fp8lab developers"
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3
html_theme = "alabaster"
suppress_warnings = ["myst.header"]
