"""Sphinx configuration for the synkhronos documentation (built-in extensions only)."""

import sys
from pathlib import Path

# Document the checkout itself, installed or not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

project = "synkhronos"
author = "synkhronos contributors"
copyright = "synkhronos contributors; original Synkhronos by A. Stooke and P. Abbeel"
release = __import__("synkhronos").__version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode"]

# GPU/JAX backends are optional; mocking them lets autodoc import every module anywhere.
# numpyro too: PyTensor's JAX dispatch imports it where installed, and it does not import
# over a mocked JAX.
autodoc_mock_imports = ["jax", "numpyro"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = False
napoleon_numpy_docstring = True
# "Attributes" sections as field lists: autodoc already documents NamedTuple/dataclass fields,
# and attribute directives from both would be duplicate descriptions.
napoleon_use_ivar = True
nitpicky = False

exclude_patterns = ["_build"]
html_theme = "alabaster"
html_theme_options = {"description": "Data-parallel PyTensor functions", "fixed_sidebar": True}
